"""Per-operator profiles from real ONNX Runtime, OpenVINO and torch runs of bert-tiny."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_prepared import prepared

from harness.core.graph_cost import GraphCost, graph_cost
from harness.core.profiles import Profile, operator_rows, ort_trace_ops
from harness.core.records import Target
from harness.native import get_backend
from harness.native.base import LoadRequest

CASE = (2, 16)
TARGETS = {
    "onnxruntime": Target("cpu", "onnxruntime", "CPUExecutionProvider"),
    "openvino": Target("openvino", "openvino", "CPU"),
    "torch": Target("cpu", "torch", "cpu"),
}


@pytest.fixture(scope="module")
def profiled() -> dict[str, tuple[Any, Profile, GraphCost]]:
    """Each engine's session on bert-tiny at batch 2, seq 16, and a 3-iteration profile of it."""
    model = prepared("bert-tiny")
    feeds, _ = model.load_case(CASE)
    costs = graph_cost(model.onnx_path, {name: array.shape for name, array in feeds.items()})
    found = {}
    for engine, target in TARGETS.items():
        session = get_backend(engine).load(LoadRequest(model.spec, model.onnx_path, "fp32", feeds), target)
        found[engine] = (session, session.profile(session.prepare(feeds), 3), costs)
    return found


@pytest.mark.parametrize(
    "engine, expected_types, provider",
    [
        ("onnxruntime", {"MatMul", "Softmax"}, "CPUExecutionProvider"),
        ("openvino", {"FullyConnected", "Softmax"}, "CPU"),
        ("torch", {"aten::addmm", "aten::native_layer_norm"}, "cpu"),
    ],
)
def test_profile_rows(profiled, engine: str, expected_types: set[str], provider: str) -> None:
    """The engine's own op types are there, every row names the provider that ran it (no fallback on
    CPU), the shares of operator time sum to 1, and the operator time is a plausible part of the
    measured wall time of the same iterations (a unit slip, µs for ms, would be off by 1000x)."""
    _, profile, costs = profiled[engine]
    rows = operator_rows(profile, costs)
    assert expected_types <= {r.op_type for r in rows}
    assert {r.provider for r in rows} == {provider}
    assert not any(r.fallback for r in rows)
    assert sum(r.share for r in rows) == pytest.approx(1.0, abs=1e-9)
    assert all(r.total_ms >= 0 and r.calls >= 1 for r in rows)
    summary = profile.summary()
    assert summary["iterations"] == 3
    # per-op times against the wall time of the same iterations: a unit slip is off by 1000x. ORT and
    # OpenVINO run one node after another, so their operator time is at most the wall time (OpenVINO's
    # counters are means since the first inference: read naively, a slow first inference on a busy
    # machine made them sum to 5.7x the wall). torch's profiler nests ops, so it has no upper bound.
    assert 0.05 < summary["coverage"] < (20 if engine == "torch" else 1.0 + 1e-9), summary
    assert {r.op_class for r in rows} >= {"matmul", "softmax" if engine != "torch" else "matmul_act"}


def test_onnxruntime_rows_carry_the_graph_counts(profiled) -> None:
    """ORT runs every exported MatMul under its graph name (fused ones as "<name>/<Fusion>/"), so the
    linear layers' FLOPs on its rows are exactly the graph's; nodes ORT created (SkipLayerNormalization)
    have no graph node behind them and no count."""
    session, profile, costs = profiled["onnxruntime"]
    rows = operator_rows(profile, costs)
    graph_linear = sum(n.flops or 0 for n in costs.nodes if n.op_class == "matmul")
    assert sum(r.flops or 0 for r in rows if r.op_class == "matmul") == graph_linear > 0
    created = [r for r in rows if r.op_type == "SkipLayerNormalization"]
    assert created and all(r.flops is None and r.bytes is None for r in created)
    assert not session.session.get_session_options().enable_profiling  # the timed session never profiles


def test_openvino_rows_name_kernels_and_fused_layers(profiled) -> None:
    """OpenVINO names each layer's implementation, and a FullyConnected that absorbed its bias Add
    counts both ONNX nodes, so its FLOPs are at least the graph's MatMul FLOPs."""
    _, profile, costs = profiled["openvino"]
    rows = operator_rows(profile, costs)
    assert all(r.kernel for r in rows)
    graph_linear = sum(n.flops or 0 for n in costs.nodes if n.op_class == "matmul")
    linear = sum(r.flops or 0 for r in rows if r.op_type == "FullyConnected")
    assert graph_linear <= linear <= 1.05 * graph_linear


def test_ort_trace_leaves_out_warmup_runs_and_marks_fallbacks() -> None:
    """Events of the first run(s) are left out; a node on another provider than the requested one is
    a fallback; a fused node's source is the node it grew from."""

    def node(name: str, ts: int, dur: int, provider: str) -> dict[str, Any]:
        args = {"op_name": "MatMul", "provider": provider}
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": args}

    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        node("mm", 10, 90, "CUDAExecutionProvider"),
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
        node("mm", 205, 20, "CUDAExecutionProvider"),
        node("mm2/MatMulScaleFusion/", 230, 10, "CPUExecutionProvider"),
        {"cat": "Session", "name": "model_run", "ts": 300, "dur": 50},
        node("mm", 305, 22, "CUDAExecutionProvider"),
        node("mm2/MatMulScaleFusion/", 330, 12, "CPUExecutionProvider"),
    ]
    ops = {op.node: op for op in ort_trace_ops(events, skip_runs=1, requested="CUDAExecutionProvider")}
    assert ops["mm"].calls == 2 and ops["mm"].total_ms == pytest.approx(0.042)
    assert not ops["mm"].fallback
    fused = ops["mm2/MatMulScaleFusion/"]
    assert fused.fallback and fused.sources == ("mm2",) and fused.total_ms == pytest.approx(0.022)
