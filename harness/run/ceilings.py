"""Each target's ceilings, measured through its own engine: the calibration graphs and their measurement.

A ceiling is what the target reaches on a graph whose work is known exactly, timed like a result
(harness.run.measure's loop natively; the page's performance.now loop in the browser, on the same files):
  bandwidth      Expand(x) -> E, Add(E, x) -> T, Slice(T) -> 16 values: E (64 MiB fp32) written, read, and T
                 (64 MiB) written per run: 192 MiB. x is a runtime scalar, so no engine folds the graph away at
                 load time; the file is tiny (nothing to fetch or check), and the Slice keeps the answer
                 small (E and T stay in the engine's own memory, as activations do).
  compute fp32   MatMul(X [512, 1024], W [1024, 1024]) -> Slice: 2·M·K·N FLOPs per run.
  compute int4   MatMulNBits (ONNX Runtime's int4 weight-only MatMul, block 32) at the same shape: what q4
                 rows compute with, where the engine has the kernel (elsewhere the row says why not).
Each is short and bounded (a few runs, at most CEILING_MAX_TIME_S of them per graph); a graph an engine
cannot run is recorded with the engine's reason and holds no value. The figures: harness.core.roofline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core.records import Case, Ceiling, Target
from harness.core.roofline import BANDWIDTH_CLASS, precision_class
from harness.prepare.cache import cache_root

if TYPE_CHECKING:  # graph_cost imports onnx: a worker counting a row pays for it, the planning parent does not
    from harness.core.graph_cost import Work

BANDWIDTH_ELEMENTS = 16 * 2**20  # 64 MiB of fp32: well past any CPU's last-level cache
M, K, N = 512, 1024, 1024  # the MatMul: 1.07 GFLOP per run
BLOCK = 32  # MatMulNBits' block size, as harness.prepare.variants quantizes q4
KEPT = 16  # values each graph answers with
CEILING_WARMUP, CEILING_ITERATIONS, CEILING_MIN_DURATION_S, CEILING_MIN_ITERATIONS = 1, 5, 0.1, 3
CEILING_MAX_ITERATIONS = 50  # a fast target's 0.1 s of samples
CEILING_MAX_TIME_S = 1.0  # per graph: a slow target (wasm, a software adapter) stops at its minimum iterations
SEED = 20261126


@dataclass(frozen=True)
class Calibration:
    kind: str  # bandwidth | compute
    precision: str  # compute: the precision class; bandwidth: BANDWIDTH_CLASS
    name: str  # the graph's file stem, stored as the ceiling's workload
    amount: float  # bytes moved or FLOPs per run
    build: Callable[[], Any]  # the onnx.ModelProto


def _model(
    nodes: list[Any], inputs: list[Any], initializers: list[Any], name: str, domains: tuple[str, ...] = ()
) -> Any:
    from onnx import TensorProto, helper

    dims = [KEPT] if name == "bandwidth" else [1, KEPT]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph(nodes, name, inputs, [output], initializers)
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8  # readable by every onnxruntime and OpenVINO release the harness supports
    return model


def _slice(source: str, dims: int) -> tuple[list[Any], list[Any]]:
    """A Slice keeping the first KEPT values of the last axis (and the first row of the others)."""
    from onnx import helper, numpy_helper

    starts = numpy_helper.from_array(np.zeros(dims, np.int64), "starts")
    ends = numpy_helper.from_array(np.array([1] * (dims - 1) + [KEPT], np.int64), "ends")
    return [helper.make_node("Slice", [source, "starts", "ends"], ["y"])], [starts, ends]


def bandwidth_graph() -> Any:
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([BANDWIDTH_ELEMENTS], np.int64), "shape")
    sliced, constants = _slice("t", 1)
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Add", ["e", "x"], ["t"]), *sliced]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    return _model(nodes, [x], [shape, *constants], "bandwidth")


def _activations() -> Any:
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])


def matmul_graph() -> Any:
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(SEED)
    weight = numpy_helper.from_array((rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32), "w")
    sliced, constants = _slice("t", 2)
    return _model([helper.make_node("MatMul", ["x", "w"], ["t"]), *sliced], [_activations()], [weight, *constants],
                  "matmul-fp32")  # fmt: skip


def matmul_int4_graph() -> Any:
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(SEED)
    blocks = numpy_helper.from_array(rng.integers(0, 256, (N, K // BLOCK, BLOCK // 2), dtype=np.uint8), "b")
    scales = numpy_helper.from_array(np.full(N * K // BLOCK, 0.01, np.float32), "scales")
    node = helper.make_node("MatMulNBits", ["x", "b", "scales"], ["t"], domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=BLOCK)  # fmt: skip
    sliced, constants = _slice("t", 2)
    return _model([node, *sliced], [_activations()], [blocks, scales, *constants], "matmul-int4", ("com.microsoft",))


# One entry per ceiling a target gets: a new one (fp16, int8) is one line here.
CALIBRATIONS = (
    Calibration(
        "bandwidth", BANDWIDTH_CLASS, "bandwidth-expand-add-64mib", 3.0 * 4 * BANDWIDTH_ELEMENTS, bandwidth_graph
    ),
    Calibration("compute", "fp32", f"matmul-fp32-{M}x{K}x{N}", 2.0 * M * K * N, matmul_graph),
    Calibration("compute", "int4", f"matmulnbits-int4-{M}x{K}x{N}", 2.0 * M * K * N, matmul_int4_graph),
)


def calibration_feeds(calibration: Calibration) -> dict[str, np.ndarray]:
    if calibration.kind == "bandwidth":
        return {"x": np.ones(1, np.float32)}
    return {"x": np.random.default_rng(SEED + 1).standard_normal((M, K)).astype(np.float32)}


@cache
def calibration_path(calibration: Calibration) -> Path:
    """The calibration's ONNX file in the cache, written once (atomically: workers may race to write it)."""
    import onnx

    path = cache_root() / "ceilings" / f"{calibration.name}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(calibration.build(), partial)
        partial.replace(path)
    return path


# Set to 1, --no-ceilings is every run's default: a test suite's hundreds of runs each paid its targets'
# calibration (1-2 s a native target, a few seconds a page setting) though few read a ceiling.
NO_CEILINGS_ENV = "ACCELHARNESS_NO_CEILINGS"


def ceilings_asked(no_ceilings: bool) -> bool:
    """Whether a run measures its targets' ceilings: unless --no-ceilings, or ACCELHARNESS_NO_CEILINGS=1."""
    return not no_ceilings and os.environ.get(NO_CEILINGS_ENV) != "1"


def wanted(precisions: Iterable[str | None], measured: set[tuple[str, str]], asked: bool = True) -> list[Calibration]:
    """The calibrations a target's cases need that it has not had in this run (`measured`: (kind, class)
    pairs, updated): the bandwidth, and the compute ceiling of each precision class its rows run in; none
    where the run does not measure ceilings (`asked`: ceilings_asked)."""
    if not asked:
        return []
    classes = {BANDWIDTH_CLASS} | {precision_class(p) for p in precisions}
    found = [c for c in CALIBRATIONS if c.precision in classes and (c.kind, c.precision) not in measured]
    measured.update((c.kind, c.precision) for c in found)
    return found


def measure_ceilings(backend: Any, target: Target, calibrations: Iterable[Calibration]) -> Iterator[Ceiling]:
    """The calibrations on the target, each session loaded, measured and dropped in turn; one the engine
    cannot run holds its reason."""
    from harness.core.failures import classify
    from harness.native.base import LoadRequest
    from harness.prepare.specs import spec_from_path
    from harness.run.measure import MeasureConfig, measure
    from harness.run.memory import PeakRss

    config = MeasureConfig(CEILING_WARMUP, CEILING_ITERATIONS, CEILING_MIN_DURATION_S, CEILING_MAX_ITERATIONS,
                           min_iterations=CEILING_MIN_ITERATIONS, max_time_s=CEILING_MAX_TIME_S)  # fmt: skip
    for calibration in calibrations:
        ceiling = Ceiling(target, calibration.kind, calibration.precision, calibration.name, calibration.amount)
        try:
            path, feeds = calibration_path(calibration), calibration_feeds(calibration)
            session = backend.load(LoadRequest(spec_from_path(path, None), path, "fp32", feeds), target)
            measured = measure(session, feeds, config, PeakRss())
            ceiling.samples_ms, ceiling.load_avg_1m = measured.samples_ms, measured.load_avg_1m
            del session
        except Exception as exc:  # a ceiling failing is recorded, and never stops the job
            ceiling.error = classify(exc)[1]
        yield ceiling


def row_work(model: Path | None, case: Case, input_shapes: dict[str, list[int]]) -> Work:
    """(work fields, details) of a measured row from the file it ran (harness.core.graph_cost), the fields and
    facts a count gives and no other key (harness.prepare.work_memo.only_work); a graph that cannot be counted
    leaves the fields NULL and says why, never a guess."""
    if model is None:
        return {}, {"work_counted": "not counted: no ONNX file known to have run (an engine building its own model)"}
    from harness.prepare.work_memo import only_work, remembered_work

    if case.mode not in ("generate", "inference"):
        return {}, {}
    try:  # only the work fields and facts, by name: nothing remembered sets another field of the row
        work, source = remembered_work(model, _workload(model, case, input_shapes),
                                       lambda: _count(model, case, input_shapes))  # fmt: skip
        fields, facts = only_work(work)
        return fields, facts | {"work_source": source}
    except Exception as exc:  # the graph's own words are the reason
        return {}, {"work_counted": f"not counted: {type(exc).__name__}: {exc}"}


def _workload(model: Path, case: Case, input_shapes: dict[str, list[int]]) -> dict[str, Any]:
    """Everything a count depends on besides the file's bytes (harness.prepare.work_memo's key)."""
    from harness.prepare.folders import past_shape

    shape = past_shape(model) if case.mode == "generate" else None
    return {"mode": case.mode, "batch": case.batch_size, "prompt": case.seq_len, "depth": case.depth,
            "new_tokens": case.new_tokens, "input_shapes": input_shapes, "past_shape": shape}  # fmt: skip


def _count(model: Path, case: Case, input_shapes: dict[str, list[int]]) -> Work:
    from harness.core.graph_cost import generation_work, inference_work
    from harness.prepare.folders import past_shape

    if case.mode == "generate":
        return generation_work(model, case.batch_size, case.seq_len or 1, case.depth or 0, case.new_tokens or 1,
                               past_shape(model))  # fmt: skip
    return inference_work(model, input_shapes, case.batch_size)
