"""A target's time per step as a fixed overhead plus its work at a fraction of the target's ceilings (pure, no I/O).

A roofline alone says a decode token takes bytes / bandwidth. A tiny model is far from that: its step is a few
dozen kernel launches, a session call and a copy of the logits, whatever its bytes, so `eff x BW / bytes` is
wrong by an order of magnitude at one end of the sizes and right only at the other. Each phase is fitted as

    seconds = overhead + sum_k slope_k * work_k / ceiling_k        (overhead, slope_k >= 0)

where work_k / ceiling_k is the time the work would take at 100% of the target's measured ceiling, and
1 / slope_k is the efficiency the engine reaches on it (a term held against no ceiling, a count such as a step's
nodes, has its slope in seconds per unit). The phases (harness.analysis.roofline_data, roofline_predict):
  decode     seconds per step = batch / tg tokens/s;  work: bytes per token x batch, at the bandwidth ceiling
  step       the same seconds, no overhead;  work: the step's dispatched nodes (seconds per node), and its weights,
             KV cache and activations, each at the bandwidth ceiling with its own efficiency
  prefill    seconds = TTFT;  work: prefill FLOPs per prompt token x batch x prompt, at the compute ceiling
  inference  seconds = latency p50;  work: FLOPs per item x batch at the compute ceiling, and bytes at the bandwidth
Fitted by non-negative least squares in relative error (each row weighted by 1 / its time: the quantity the
held-out error scores), so a 0.3 ms step counts as much as a 30 ms one. The error of a method is
leave-one-model-out: every row predicted by a fit that saw no row of its model, scored on its rate
(|predicted rate / measured rate - 1|, the mean over rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

MIN_FIT_MODELS = 2  # a fit separates overhead from slope only across models of different sizes
MIN_STEP_MODELS = 3  # four terms (nodes and three kinds of bytes) are told apart only across three models' depths
MIN_HELD_OUT_MODELS = 3  # a held-out error: each model predicted from at least two others


@dataclass(frozen=True)
class Point:
    """One measured row of a phase: what it ran, the time its work would take at 100% of its ceilings, its time."""

    model: str
    ideal_s: tuple[float, ...]  # per term: work / ceiling, seconds
    seconds: float  # measured
    result_id: str = ""


@dataclass(frozen=True)
class Law:
    """seconds = overhead_s + sum(slopes[k] * ideal_s[k]); a slope of 0: that term explains nothing here."""

    overhead_s: float
    slopes: tuple[float, ...]

    def seconds(self, ideal_s: Sequence[float]) -> float:
        return self.overhead_s + float(np.dot(self.slopes, ideal_s))

    @property
    def efficiencies(self) -> tuple[float | None, ...]:
        """Per term, the fraction of the ceiling the engine reaches on it (None: slope 0, not seen to matter)."""
        return tuple(1.0 / s if s > 0 else None for s in self.slopes)


def fit(points: Sequence[Point], overhead: bool = True) -> Law:
    """The law minimising the relative error of `points` (at least one). overhead=False: the pure roofline,
    time = work / (eff x ceiling), the baseline the overhead has to beat."""
    y = np.array([p.seconds for p in points], dtype=np.float64)
    ideal = np.array([p.ideal_s for p in points], dtype=np.float64)
    columns = np.column_stack([np.ones(len(points)), ideal]) if overhead else ideal
    solution, _ = nnls(columns / y[:, None], np.ones(len(points)))
    if not overhead:
        return Law(0.0, tuple(float(s) for s in solution))
    return Law(float(solution[0]), tuple(float(s) for s in solution[1:]))


def models_of(points: Sequence[Point]) -> list[str]:
    return sorted({p.model for p in points})


def rate_error(measured_s: float, predicted_s: float, scored: str = "rate") -> float:
    """|predicted rate / measured rate - 1|: a rate is a count over the time, so its ratio is the times' inverse;
    scored="time": |predicted time / measured time - 1|, the latency MAPE the inference methods are compared by."""
    if scored == "time":
        return abs(predicted_s / measured_s - 1.0)
    return abs(measured_s / predicted_s - 1.0) if predicted_s > 0 else float("inf")


def held_out(
    points: Sequence[Point], fitter: Callable[[Sequence[Point]], Law | None] = fit
) -> list[tuple[Point, float]] | None:
    """Each point with its leave-one-model-out predicted seconds; None with fewer than MIN_HELD_OUT_MODELS models
    (or where a fold cannot be fitted)."""
    models = models_of(points)
    if len(models) < MIN_HELD_OUT_MODELS:
        return None
    found = []
    for model in models:
        law = fitter([p for p in points if p.model != model])
        if law is None:
            return None
        found += [(p, law.seconds(p.ideal_s)) for p in points if p.model == model]
    return found


def mean_error(pairs: Sequence[tuple[Point, float]] | None, scored: str = "rate") -> float | None:
    """The mean rate (or time) error of (point, predicted seconds) pairs; None where there are none."""
    if not pairs:
        return None
    return float(np.mean([rate_error(p.seconds, guess, scored) for p, guess in pairs]))


def lomo_error(points: Sequence[Point], overhead: bool = True, scored: str = "rate") -> float | None:
    """The law's leave-one-model-out rate (or time) error on `points` (None: too few models)."""
    return mean_error(held_out(points, lambda kept: fit(kept, overhead)), scored)
