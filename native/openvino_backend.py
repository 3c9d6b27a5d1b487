"""OpenVINO runtime on the exported ONNX file, on every device OpenVINO reports.

OpenVINO picks its own inference precision (bf16 on CPUs with AMX/AVX512-BF16). fp32, fp16 and
bf16 requests set INFERENCE_PRECISION_HINT; the precision that ran is read back and recorded. q4 and
q4f16 load the MatMulNBits conversion (its ONNX front end reads them) with the hint of their
activations. What each MatMul computed in is read from the execution graph's runtime precisions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

try:
    import openvino as ov
except ImportError as missing:  # a machine with only some engines (a GPU image with torch): openvino probes
    ov = None  # unavailable with the reason, and the other engines run (a declared dependency otherwise)
    NOT_INSTALLED = f"openvino is not installed here ({missing}); pip install openvino"

from harness.core.precision import INT4_PRECISIONS, MEANINGS, compute_facts, per_graph
from harness.core.profiles import OpTime, Profile
from harness.core.records import Target
from harness.native.base import (
    Availability,
    Capabilities,
    Clock,
    HostMemory,
    LoadRequest,
    UnsupportedError,
    thread_facts,
)
from harness.prepare.variants import model_for_precision

DEVICES = ("CPU", "GPU", "NPU")
PRECISION_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i8": "int8"}
# The hint asked for per requested precision (auto: none, OpenVINO picks). A device without native
# f16/bf16 may run another precision; the session reads back and records what the device chose.
HINTS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "q4": "f32", "q4f16": "f16"}
# The execution graph's weight MatMuls (OpenVINO's CPU and GPU plugins make them FullyConnected).
MATMUL_LAYERS = ("FullyConnected",)
ELEMENT_PRECISIONS = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "i8": "int8", "u8": "int8"}
COMPUTE_SOURCE = "OpenVINO get_runtime_model(): the activation element type of each FullyConnected layer"


class OpenVinoSession(HostMemory):
    def __init__(
        self,
        compiled: ov.CompiledModel,
        core: ov.Core,
        device: str,
        requested: str,
        recompile: Callable[[dict[str, Any]], ov.CompiledModel] | None = None,
    ) -> None:
        self.compiled = compiled
        self.device = device
        self.recompile = recompile  # the same compile with extra properties, for a profiled twin
        self.request = compiled.create_infer_request()
        self.input_ports = [port.get_names() for port in compiled.inputs]  # a tensor may carry several names
        hint = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        self.precision = PRECISION_NAMES.get(hint, hint)
        changed = requested != "auto" and self.precision != requested
        if requested in INT4_PRECISIONS:  # the int4 file ran; the hint is its activations' precision
            self.precision, changed = requested, self.precision != MEANINGS[requested][1]
        self.clock = Clock()  # infer() is synchronous
        self.facts: dict[str, Any] = {
            "openvino_version": ov.__version__,
            "device": device,
            "device_name": core.get_property(device, "FULL_DEVICE_NAME"),
            "inference_precision_hint": hint,
            "requested_precision": requested,
            "precision_changed": changed,
            "num_streams": str(compiled.get_property("NUM_STREAMS")),
        } | compute_facts(requested, runtime_compute(compiled), COMPUTE_SOURCE)

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prepared = {}
        for names in self.input_ports:
            name = next(iter(names & feeds.keys()))
            prepared[name] = feeds[name]
        return prepared

    def run(self, prepared: dict[str, np.ndarray]) -> Any:
        return self.request.infer(prepared)

    def to_numpy(self, outputs: Any) -> list[np.ndarray]:
        return [np.array(tensor) for tensor in outputs.to_tuple()]

    def profile(self, prepared: dict[str, np.ndarray], iterations: int) -> Profile:
        """Per-layer real time from a twin compiled with PERF_COUNT (a compile-time property, so the
        timed model never counts).

        The CPU plugin's counters are each layer's mean real time per execution since the model's
        first inference, in whole microseconds, with no count and no reset. The profiled iterations'
        total per layer is the counters' total after them less their total after the first
        (allocating) inference; a fixed input executes the same layers each time (a layer is
        EXECUTED every inference or NOT_RUN), so a layer ran once per inference."""
        if self.recompile is None:
            raise RuntimeError("this session cannot be compiled again for profiling")
        compiled = self.recompile({"PERF_COUNT": True})
        request = compiled.create_infer_request()
        request.infer(prepared)  # first inference: allocation, left out by the difference below
        before = executed_means(request)
        started = time.perf_counter_ns()
        for _ in range(iterations):
            request.infer(prepared)
        wall_ms = (time.perf_counter_ns() - started) / 1e6
        fused = fused_layers(compiled)
        ops = []
        for name, (kind, exec_type, mean_ms) in executed_means(request).items():
            _, _, first_ms = before.get(name, (kind, exec_type, 0.0))  # 0: it did not run the first time
            runs = iterations + (name in before)
            total_ms = max(mean_ms * runs - first_ms, 0.0)  # the counters' whole µs can round below 0
            sources = fused.get(name, (name,))
            ops.append(OpTime(name, kind, self.device, iterations, total_ms, kernel=exec_type, sources=sources))
        method = f"OpenVINO {ov.__version__} PERF_COUNT get_profiling_info(), means since compile, differenced"
        return Profile(ops, iterations, wall_ms, method)


def executed_means(request: ov.InferRequest) -> dict[str, tuple[str, str, float]]:
    """{layer: (layer type, kernel, mean ms per execution so far)} of the layers that have run."""
    return {
        layer.node_name: (layer.node_type, layer.exec_type, layer.real_time.total_seconds() * 1000)
        for layer in request.get_profiling_info()
        if layer.status == ov.ProfilingInfo.Status.EXECUTED
    }


def runtime_compute(compiled: ov.CompiledModel) -> dict[str, int]:
    """Weight MatMul layers per precision of their activations in the execution graph (what ran)."""
    counts: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in MATMUL_LAYERS:
            element = op.get_input_element_type(0).get_type_name()
            kind = ELEMENT_PRECISIONS.get(element, element)
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def fused_layers(compiled: ov.CompiledModel) -> dict[str, tuple[str, ...]]:
    """Each executed layer's original (ONNX) layer names, from the runtime model's rt_info."""
    names = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "originalLayersNames" in info:
            original = info["originalLayersNames"].astype(str)
            names[op.get_friendly_name()] = tuple(n for n in original.split(",") if n)
    return names


class OpenVinoBackend:
    engine = "openvino"
    capabilities = Capabilities()  # inference on the ONNX export; no decoder loop, no training

    def device(self, target: Target) -> str | None:
        """Each OpenVINO device is its own (CPU: the host's cores)."""
        return None if target.provider == "CPU" else f"openvino:{target.provider}"

    def targets(self) -> list[Target]:
        return [Target("openvino", "openvino", device) for device in DEVICES]

    def probe(self, target: Target) -> Availability:
        if ov is None:
            return Availability(False, NOT_INSTALLED)
        devices = ov.Core().available_devices
        if any(d.split(".")[0] == target.provider for d in devices):
            return Availability(True, f"OpenVINO {ov.__version__} reports {target.provider}")
        return Availability(False, f"OpenVINO {ov.__version__} reports devices {devices}, no {target.provider}")

    def load(self, request: LoadRequest, target: Target) -> OpenVinoSession:
        if request.onnx_path is None:
            raise UnsupportedError("no ONNX file for this model (see the export error)")
        if per_graph(request.precision) is not None:  # its hint is one precision for the one graph it compiles
            raise UnsupportedError(f"openvino: --precision {request.precision} names an encoder–decoder's graphs "
                                   "apart; OpenVINO compiles one graph at one precision")  # fmt: skip
        if request.precision == "int8":
            raise UnsupportedError(
                "openvino: int8 needs a statically quantized model (NNCF post-training quantization with "
                "calibration data); INFERENCE_PRECISION_HINT only offers f32, f16 and bf16"
            )
        core = ov.Core()
        hint = HINTS.get(request.precision)
        config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
        path, device = Path(request.onnx_path), target.provider
        if request.threads is not None:
            if device != "CPU":
                raise UnsupportedError(f"openvino: INFERENCE_NUM_THREADS is a CPU device property; {device} "
                                       "takes no thread count (drop --native-threads for it)")  # fmt: skip
            config["INFERENCE_NUM_THREADS"] = request.threads
        conversion: dict[str, Any] = {}
        if request.precision in INT4_PRECISIONS:  # the same MatMulNBits file ONNX Runtime runs
            path, _, conversion = model_for_precision(path, request.precision)

        def compile_with(extra: dict[str, Any]) -> ov.CompiledModel:
            return core.compile_model(str(path), device, config | extra)

        session = OpenVinoSession(compile_with({}), core, device, request.precision, compile_with)
        session.facts |= conversion | openvino_threads(session.compiled, device, request.threads)
        return session


def openvino_threads(compiled: ov.CompiledModel, device: str, threads: int | None) -> dict[str, Any]:
    """The CPU plugin's INFERENCE_NUM_THREADS, read back from the compiled model (another device: none)."""
    spinning = "not an OpenVINO setting the harness makes: its CPU plugin's threads wait as it decides"
    if device != "CPU":
        return thread_facts(None, f"{device}: computes on its device (no INFERENCE_NUM_THREADS)", None, spinning)
    count = int(compiled.get_property("INFERENCE_NUM_THREADS"))
    asked = f"--native-threads {threads}" if threads else "OpenVINO's default"
    return thread_facts(count, f"{asked}: compiled model's INFERENCE_NUM_THREADS, read back", None, spinning)


BACKEND = OpenVinoBackend()
