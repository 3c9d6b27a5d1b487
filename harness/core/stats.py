"""Statistics over raw latency samples: pure functions, no I/O (measuring lives in measure.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOISE_CV = 0.10  # a coefficient of variation above this marks a result as noisy
# An ab run's fewest rounds: with 6 pairs the exact two-sided Wilcoxon p can reach 2/64 = 0.031 < 0.05;
# with 5 it never goes below 0.0625, so no change could ever be shown.
MIN_PAIRED_ROUNDS = 6


@dataclass(frozen=True)
class Summary:
    iterations: int
    mean_ms: float
    median_ms: float
    min_ms: float
    max_ms: float
    std_ms: float | None  # None for a single sample: no spread was measured
    p90_ms: float
    p95_ms: float
    p99_ms: float
    cv: float | None  # None when the mean is 0: a ratio to nothing is not measured
    throughput_per_s: float | None  # None when the mean is 0 (no item takes no time)
    noisy: bool | None


def nearest_rank(samples: np.ndarray, percent: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least percent% of samples <= it."""
    return float(np.percentile(samples, percent, method="inverted_cdf"))


def summarize(samples_ms: list[float], batch_size: int, noise_cv: float = NOISE_CV) -> Summary | None:
    """Summary statistics of one result's samples, or None when there are none.

    std is the sample standard deviation (n-1). Throughput is items per second over the whole
    timed loop (batch / mean latency), the figure onnxruntime_perf_test reports. What was not
    measured is None (stored NULL), never 0: the spread of a single sample, and every figure
    divided by a mean of 0 (a timer that never advanced).
    """
    if not samples_ms:
        return None
    values = np.asarray(samples_ms, dtype=np.float64)
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if len(values) > 1 else None
    cv = std / mean if std is not None and mean > 0 else None
    return Summary(
        iterations=len(values),
        mean_ms=mean,
        median_ms=float(np.median(values)),
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        std_ms=std,
        p90_ms=nearest_rank(values, 90),
        p95_ms=nearest_rank(values, 95),
        p99_ms=nearest_rank(values, 99),
        cv=cv,
        throughput_per_s=batch_size * 1000.0 / mean if mean > 0 else None,
        noisy=cv > noise_cv if cv is not None else None,
    )
