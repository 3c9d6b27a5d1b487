"""Per-operator profiles: what each engine's profiler says ran, per node, and the rows the store keeps.

A backend's session profiles a few iterations after the timed loop (never inside it) and returns
a Profile: one OpTime per node (ONNX Runtime, onnxruntime-web) or layer (OpenVINO) or aten op
(torch), with its calls and time summed over the profiled iterations, the provider that ran it and,
where the engine says, the ONNX nodes it executes (`sources`: fused nodes name several). The wall
time of the profiled iterations is measured around them, so the rows' operator time can be set
against it (coverage: the rest is time between operators, in the runtime and the bindings).

operator_rows() turns a Profile into the store's rows: calls and ms over the profiled iterations,
the share of their operator time, and the FLOPs and bytes of the ONNX nodes behind each row (from
harness.core.graph_cost, for the case's shapes); rows with no ONNX node behind them (aten ops, nodes an
engine created) have none.

ONNX Runtime's trace format is parsed here, not in its backend, because onnxruntime-web writes the
same trace in the browser.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.core.op_types import executed_class

if TYPE_CHECKING:  # the counts come from harness.core.graph_cost, which imports onnx
    from harness.core.graph_cost import GraphCost, NodeCost

PROFILE_ITERATIONS = 5  # profiled iterations after the timed loop: per-node times are stable by then


@dataclass(frozen=True)
class OpTime:
    node: str  # node (ORT), layer (OpenVINO) or op (torch) name, as the profiler names it
    op_type: str  # the operator that ran: ONNX/contrib op type, OpenVINO layer type, aten op
    provider: str | None  # execution provider / device that ran it
    calls: int  # over all profiled iterations
    total_ms: float  # over all profiled iterations
    kernel: str | None = None  # the implementation, where the engine names it (OpenVINO exec type)
    sources: tuple[str, ...] = ()  # the ONNX graph nodes this row executes, where known
    fallback: bool = False  # ran on another provider than the one asked for


@dataclass
class Profile:
    ops: list[OpTime]
    iterations: int
    wall_ms: float  # wall time of the profiled iterations, measured around them
    method: str  # how the times were captured
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def operator_ms(self) -> float:
        return sum(op.total_ms for op in self.ops)

    def summary(self) -> dict[str, Any]:
        """What a result's details say about its profile."""
        per_iteration = self.wall_ms / self.iterations if self.iterations else None
        return {
            "method": self.method,
            "iterations": self.iterations,
            "iteration_ms": per_iteration,
            "operator_ms": self.operator_ms / self.iterations if self.iterations else None,
            "coverage": self.operator_ms / self.wall_ms if self.wall_ms > 0 else None,
            "operators": len(self.ops),
        } | self.facts


@dataclass(frozen=True)
class OperatorRow:
    node: str
    op_type: str
    op_class: str
    provider: str | None
    kernel: str | None
    profile_iterations: int  # the profiled iterations the calls and time are summed over
    calls: int
    total_ms: float
    share: float  # of the profiled iterations' operator time; a result's shares sum to 1
    flops: float | None  # of the ONNX nodes behind it, for the case's shapes
    bytes: float | None
    fallback: bool


def timed_runs(run: Callable[[], object], iterations: int) -> float:
    """Wall ms of `iterations` calls of run(): the profiled iterations' own time."""
    started = time.perf_counter_ns()
    for _ in range(iterations):
        run()
    return (time.perf_counter_ns() - started) / 1e6


# --- ONNX Runtime's trace (native and web) -----------------------------------------------------------
KERNEL_SUFFIX = "_kernel_time"
GPU_KERNEL_CATEGORY = "Api"  # WebGPU EP kernel times from timestamp queries: "node&OpType&Program"
HOST_WAIT = "host time (includes waiting for queued GPU work)"


def ort_trace_ops(events: Iterable[dict[str, Any]], skip_runs: int, requested: str | None = None) -> list[OpTime]:
    """Per-node times from an ONNX Runtime profile (Chrome trace JSON), leaving out the first
    `skip_runs` runs (a new session's first run allocates its buffers). Nodes an optimizer fused are
    named after the node they grew from ("node_MatMul_94/MatMulScaleFusion/"): that node is their
    source. `requested`: the provider asked for; a node on another one is a fallback.

    A node on a GPU EP returns as soon as its work is queued, so where the trace holds the EP's own
    kernel times (ORT's WebGPU EP, with timestamp-query) those replace the node's host time. A GPU
    node without kernels (MemcpyToHost) keeps its host time, which includes waiting for the queue,
    and says so in its kernel column."""
    events = list(events)
    all_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    runs = all_runs[skip_runs:]
    if not runs:
        return []
    start, end = runs[0]["ts"], runs[-1]["ts"] + runs[-1]["dur"]
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX) or not start <= event["ts"] <= end:
            continue
        args = event.get("args", {})
        entry = found.setdefault(
            name.removesuffix(KERNEL_SUFFIX),
            {"op": args.get("op_name", "?"), "ep": args.get("provider"), "n": 0, "us": 0},
        )
        entry["n"] += 1
        entry["us"] += event.get("dur", 0)
    gpu = _gpu_kernels(events, len(all_runs), skip_runs)
    gpu_eps = {found[node]["ep"] for node in gpu if node in found}
    for node, entry in found.items():
        if node in gpu:
            entry |= gpu[node]
        elif entry["ep"] in gpu_eps:
            entry["programs"] = HOST_WAIT
    return [
        OpTime(
            node=node,
            op_type=entry["op"],
            provider=entry["ep"],
            calls=entry["n"],
            total_ms=entry["us"] / 1000,
            kernel=entry.get("programs"),
            sources=(node.split("/")[0],),
            fallback=requested is not None and entry["ep"] is not None and entry["ep"] != requested,
        )
        for node, entry in found.items()
    ]


def _gpu_kernels(events: list[dict[str, Any]], runs: int, skip_runs: int) -> dict[str, dict[str, Any]]:
    """Per node, its GPU kernels' dispatches and time. Their timestamps are on the GPU's clock, so the
    skipped runs' share is left out by order: every run dispatches the same kernels."""
    kernels = [e for e in events if e.get("cat") == GPU_KERNEL_CATEGORY and e.get("name", "").count("&") >= 2]
    kernels = kernels[len(kernels) * skip_runs // runs :] if runs else []
    found: dict[str, dict[str, Any]] = {}
    for event in kernels:
        node, _, program = event["name"].split("&", 2)
        entry = found.setdefault(node, {"n": 0, "us": 0, "programs": []})
        entry["n"] += 1
        entry["us"] += event.get("dur", 0)
        if program not in entry["programs"]:
            entry["programs"].append(program)
    return {node: entry | {"programs": ", ".join(entry["programs"])} for node, entry in found.items()}


def operator_rows(profile: Profile, costs: GraphCost | None) -> list[OperatorRow]:
    """The store's rows for a profile: sums over the profiled iterations, shares, the ONNX nodes' counts."""
    total = profile.operator_ms
    nodes = costs.by_name() if costs is not None else {}
    rows = []
    for op in sorted(profile.ops, key=lambda o: -o.total_ms):
        behind = [nodes[name] for name in op.sources if name in nodes]
        rows.append(
            OperatorRow(
                node=op.node,
                op_type=op.op_type,
                op_class=_class_of(op, behind),
                provider=op.provider,
                kernel=op.kernel,
                profile_iterations=profile.iterations,
                calls=op.calls,
                total_ms=op.total_ms,
                share=op.total_ms / total if total > 0 else 0.0,
                flops=_summed([n.flops for n in behind]),
                bytes=_summed([n.bytes for n in behind]),
                fallback=op.fallback,
            )
        )
    return rows


def _class_of(op: OpTime, behind: list[NodeCost]) -> str:
    """The class of the heaviest ONNX node the row runs, else the executed type's."""
    if not behind:
        return executed_class(op.op_type)
    return max(behind, key=lambda n: n.flops or 0.0).op_class


def _summed(values: list[float | None]) -> float | None:
    """The sum, or None when nothing is known (no node behind the row, or shapes unknown)."""
    known = [v for v in values if v is not None]
    return float(sum(known)) if known and len(known) == len(values) else None
