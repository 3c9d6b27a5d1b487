"""The drift control: a small fixed workload every run measures beside its cases.

Two runs of the same code on a shared machine differ by more than any threshold a user would set
(other load, clock and cache state): a comparison across time needs to know how fast the machine
itself was in each run. The control is the same ONNX graph everywhere, a chain of MatMuls of fixed
size, built here (never downloaded) and cached; each native worker measures it on its own target
before the job's first case, after its middle case and after its last, and the page does the same
per EP setting. harness.analysis.drift reads the measurements back.

The torch control runs the same weights as torch matmuls (torch does not run ONNX files).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.records import Control, Target
from harness.prepare.cache import cache_root

# 34 MFLOP: ~0.1 ms on ORT CPU here, a few ms on wasm, tens on a software WebGPU adapter. Small and
# short, because it runs three times in every job: a run of many small jobs (a CI suite) must not
# pay seconds for each; its median over a tenth of a second is steady enough to see the machine move.
LAYERS, WIDTH, ROWS = 4, 256, 64
CONTROL_NAME = f"matmul-chain-{LAYERS}x{WIDTH}x{ROWS}"
CONTROL_INPUT = "x"
SEED = 20261125
CONTROL_WARMUP, CONTROL_ITERATIONS, CONTROL_MIN_DURATION_S = 2, 10, 0.1
CONTROL_MAX_TIME_S = 1.0  # a software adapter (SwiftShader WebGPU) stops at its minimum iterations
POSITIONS = ("start", "middle", "end")


def control_weights() -> list[np.ndarray]:
    """The chain's weights: seeded, scaled so that activations stay of order one through every layer."""
    rng = np.random.default_rng(SEED)
    return [(rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32) for _ in range(LAYERS)]


def control_feeds() -> dict[str, np.ndarray]:
    return {CONTROL_INPUT: np.random.default_rng(SEED + 1).standard_normal((ROWS, WIDTH)).astype(np.float32)}


def control_model_path() -> Path:
    """The control's ONNX file in the cache, written once (atomically: workers may race to write it)."""
    path = cache_root() / "controls" / f"{CONTROL_NAME}.onnx"
    if path.exists():
        return path
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = control_weights()
    nodes, previous = [], CONTROL_INPUT
    for i in range(LAYERS):
        output = "y" if i == LAYERS - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [output], name=f"matmul{i}"))
        previous = output
    graph = helper.make_graph(
        nodes,
        CONTROL_NAME,
        [helper.make_tensor_value_info(CONTROL_INPUT, TensorProto.FLOAT, [ROWS, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, WIDTH])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime and OpenVINO release the harness supports
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    onnx.save(model, partial)
    partial.replace(path)
    return path


def load_control(backend: Any, target: Target) -> Any:
    """A session of the control on the target: the backend's own control hook (torch), or its loader
    given the ONNX file. Raises what the backend raises when it cannot (recorded as the error)."""
    from harness.core.threads import split_threads

    target, threads = split_threads(target)  # the control runs the thread count its job's target runs
    if hasattr(backend, "load_control"):
        return backend.load_control(control_weights(), target, threads)
    from harness.native.base import LoadRequest
    from harness.prepare.specs import spec_from_path

    path = control_model_path()
    request = LoadRequest(spec_from_path(path, None), path, "fp32", control_feeds(), threads=threads)
    return backend.load(request, target)


class ControlProbe:
    """The control on one worker's target: loaded on first use, measured at each position asked for."""

    def __init__(self, backend: Any, target: Target, beside: str) -> None:
        self.backend, self.target, self.beside = backend, target, beside
        self.session: Any = None
        self.error: str | None = None

    def measure(self, position: str) -> Control:
        from harness.core.failures import classify
        from harness.run.measure import MeasureConfig, measure
        from harness.run.memory import PeakRss

        control = Control(CONTROL_NAME, self.target, position, self.beside)
        try:
            if self.session is None and self.error is None:
                self.session = load_control(self.backend, self.target)
            if self.session is not None:
                config = MeasureConfig(CONTROL_WARMUP, CONTROL_ITERATIONS, CONTROL_MIN_DURATION_S,
                                       max_time_s=CONTROL_MAX_TIME_S)  # fmt: skip
                measured = measure(self.session, control_feeds(), config, PeakRss())
                control.samples_ms, control.load_avg_1m = measured.samples_ms, measured.load_avg_1m
        except Exception as exc:  # the control failing is recorded, and never stops the job
            self.error = classify(exc)[1]
        control.error = self.error
        return control


def control_positions(case_count: int) -> dict[int, str]:
    """Where a job of case_count cases measures the control: the index of the case after which
    (-1: before the first), and the position's name. One case: before and after it."""
    positions = {-1: "start", case_count - 1: "end"}
    middle = (case_count - 1) // 2
    if 0 <= middle < case_count - 1:
        positions[middle] = "middle"
    return positions
