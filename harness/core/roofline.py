"""A target's ceilings and how close a row comes to them, defined once (pure functions, no I/O).

A ceiling is measured, not looked up (harness.run.ceilings natively, the same graphs in the page): a
calibration graph of known work is timed through the row's own engine under the result's timing rules.
  bandwidth  bytes the graph moves per run (read + written) / the run's time: GB/s
  bandwidth_large  the same graph with its live tensors well past any last-level cache (harness.run.ceilings): the
             bandwidth a model's bytes see once they no longer fit in a cache
  compute    a MatMul's FLOPs per run (2·M·K·N) / the run's time: GFLOP/s, per precision class
The ceiling is the rate of its fastest sample, as STREAM reports its best rate: the most the target was
seen to sustain, which a machine shared with other work reaches only when left alone for a moment. Its
spread is how far its median sample lies below that (fastest rate / median rate - 1).

A row's achieved rates divide the work its graph implies (harness.core.graph_cost: bytes read and FLOPs
per token or per item) by its measured time; its fraction is achieved / that target's ceiling:
  generate   bandwidth: bytes per decode token x tg tokens/s; compute: FLOPs per prompt token x pp tokens/s
  inference  both from the bytes and FLOPs per item x items/s
A row may come above its ceiling, never by an order of magnitude (ABOVE_CEILING, checked on import).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.core.precision import MEANINGS

CEILING_KINDS = ("bandwidth", "bandwidth_large", "compute")
UNITS = {"bandwidth": "GB/s", "bandwidth_large": "GB/s", "compute": "GFLOP/s"}
BANDWIDTH_KINDS = ("bandwidth", "bandwidth_large")  # in a cache (this machine's L3), and past any
# bandwidth is measured once per target whatever a row's precision: bytes are bytes
BANDWIDTH_CLASS = "bytes"
# How far above its ceiling a row's fraction may credibly come, times (1 + the ceiling's spread). Not 1: the bandwidth
# graph writes as much as it reads, so a decode that only reads passes it (docs/benchmarks.md: 104.6% beside a 3%
# spread), a model that fits in a cache the 64 MiB graph does not passes it further, and a q4 row's fp32 MatMuls
# may outrun the int4 kernel its compute is held against. Ten times is no machine's: a counting or unit error
# (bytes per token in thousands), which import refuses (harness.bundle.checks).
ABOVE_CEILING = 10.0


def working_set_bytes(amount: float) -> float:
    """The bytes a bandwidth graph keeps live (E and T, two of the three tensor passes its `amount` counts): what a
    cache would have to hold for the graph to run inside it."""
    return amount * 2.0 / 3.0


def effective_bandwidth(nbytes: float, small: tuple[float, float], large: tuple[float, float] | None) -> float:
    """The bandwidth a step moving `nbytes` sees, from the in-cache ceiling and the one past the cache, each
    (working set bytes, GB/s): the first at or below its working set, the second at or above its own, in between
    interpolated linearly in log(nbytes); the first alone where there is no second (or no gap between them)."""
    (low_bytes, low_gbps), (high_bytes, high_gbps) = small, large or small
    if large is None or nbytes <= low_bytes or high_bytes <= low_bytes:
        return low_gbps
    if nbytes >= high_bytes:
        return high_gbps
    share = math.log(nbytes / low_bytes) / math.log(high_bytes / low_bytes)
    return low_gbps + share * (high_gbps - low_gbps)


def precision_class(precision: str | None) -> str | None:
    """The compute ceiling a row's precision is held against: the type its weight MatMuls read (q4 and q4f16:
    int4, MatMulNBits), the precision table's one definition (harness.core.precision.MEANINGS)."""
    meaning = MEANINGS.get(precision or "")
    return meaning[0] if meaning else None


def precision_class_sql(column: str) -> str:
    """precision_class as an SQL expression over a precision column (the store's fractions use it)."""
    cases = " ".join(f"WHEN '{name}' THEN '{precision_class(name)}'" for name in MEANINGS)
    return f"(CASE {column} {cases} ELSE NULL END)"


def ceiling_figures(amount: float, samples_ms: Sequence[float]) -> tuple[float | None, float | None]:
    """(rate of the fastest sample in units of 1e9 per second, spread); (None, None) without samples."""
    if not samples_ms:
        return None, None
    fastest_ms = float(min(samples_ms))
    return amount / (fastest_ms / 1000.0) / 1e9, float(np.median(samples_ms)) / fastest_ms - 1.0


def limit_fraction(row: Mapping[str, Any] | None) -> float | None:
    """How close a stored row came to its target's ceiling: bandwidth for a generate row (its decode, the
    memory-bound phase), compute for an inference row; None where either side was not measured."""
    if row is None:
        return None
    return row.get("bandwidth_fraction") if row.get("mode") == "generate" else row.get("compute_fraction")
