"""From a measurement's profile to what its result keeps: operator rows carrying the ONNX graph's
counts for the case's shapes, a summary in details, and the graph's work per op class (what the
operator predictor prices). Native workers and the browser run share it.

A profile that could not be taken costs the row its profile, never its measurement: details say why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.core.profiles import GPU_KERNEL_CATEGORY, OperatorRow, Profile, operator_rows, ort_trace_ops


def profiled_fields(
    onnx_path: Path | None, shapes: dict[str, list[int]], profile: Profile | None, error: str | None
) -> tuple[list[OperatorRow], dict[str, Any]]:
    """(operator rows, details) for a result whose run asked for a profile."""
    if profile is None:
        return [], {"profile": {"error": error or "no profile was returned"}}
    costs, facts = _graph_costs(onnx_path, shapes)
    details: dict[str, Any] = {"profile": profile.summary() | facts}
    if costs is not None:
        details["graph_work"] = costs.work_by_class()
    return operator_rows(profile, costs), details


def _graph_costs(onnx_path: Path | None, shapes: dict[str, list[int]]) -> tuple[Any, dict[str, Any]]:
    from harness.core.graph_cost import graph_cost  # onnx and its shape inference: only when profiling

    if onnx_path is None:
        return None, {"graph_counts": "none: there is no ONNX file (see the export error)"}
    try:
        costs = graph_cost(onnx_path, shapes)
    except Exception as exc:  # an operator's rows keep their times; only the counts are missing
        return None, {"graph_counts": f"failed: {type(exc).__name__}: {exc}"}
    return costs, {"graph_counts": costs.inference, "graph_unknown_shapes": costs.unknown_shapes}


def page_profile(answer: Any, requested: str) -> tuple[Profile | None, str | None]:
    """The browser page's profile (ORT-web's trace events, run count and wall time) parsed with ONNX
    Runtime's parser, or why there is none. A malformed one is refused here, not stored."""
    if not isinstance(answer, dict):
        return None, "the page returned no profile"
    if isinstance(answer.get("error"), str):
        return None, answer["error"]
    events, iterations, wall_ms = answer.get("events"), answer.get("iterations"), answer.get("wall_ms")
    skip = answer.get("skip_runs")
    well_formed = (
        isinstance(events, list)
        and all(isinstance(e, dict) for e in events)
        and isinstance(iterations, int)
        and iterations > 0
        and isinstance(skip, int)
        and isinstance(wall_ms, int | float)
        and math.isfinite(wall_ms)
        and wall_ms > 0
    )
    if not well_formed:
        return None, "the page's profile is malformed (needs events, iterations > 0, skip_runs, wall_ms > 0)"
    try:
        ops = ort_trace_ops(events, skip_runs=skip, requested=requested)
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"the page's profile trace could not be read: {type(exc).__name__}: {exc}"
    if not ops:
        return None, "ORT-web's trace held no node events for the profiled runs"
    method = "onnxruntime-web session enableProfiling (its trace, printed on the console)"
    facts = {}
    if any(e.get("cat") == GPU_KERNEL_CATEGORY for e in events):
        facts["gpu_timing"] = (
            "GPU nodes timed on the GPU (timestamp-query), the rest on the host; a host wait for the GPU "
            "(MemcpyToHost) overlaps the kernels it waits for, so operator time can exceed the wall time"
        )
    return Profile(ops, iterations, float(wall_ms), method, facts), None
