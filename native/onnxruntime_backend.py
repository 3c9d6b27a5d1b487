"""ONNX Runtime, one session per execution provider.

ORT silently places nodes that an EP cannot run on the CPU EP. For non-CPU EPs the node
placement is read from a one-off profiled run and recorded, so a fallback is visible.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from harness.native.base import Availability, Clock, HostMemory, LoadRequest, UnsupportedError
from harness.result import Target

PROVIDERS = [
    ("cpu", "CPUExecutionProvider"),
    ("cuda", "CUDAExecutionProvider"),
    ("cuda", "TensorrtExecutionProvider"),
    ("rocm", "ROCMExecutionProvider"),
    ("rocm", "MIGraphXExecutionProvider"),
    ("openvino", "OpenVINOExecutionProvider"),
    ("qnn", "QNNExecutionProvider"),
    ("mps", "CoreMLExecutionProvider"),
    ("directml", "DmlExecutionProvider"),
]


class OrtSession(HostMemory):
    def __init__(self, session: ort.InferenceSession, provider: str, placement: dict[str, int]) -> None:
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.precision = "fp32"
        self.clock = Clock()  # run() copies outputs to host numpy, so it returns after the device
        fallback_nodes = sum(n for ep, n in placement.items() if ep != provider)
        self.facts: dict[str, Any] = {
            "onnxruntime_version": ort.__version__,
            "requested_provider": provider,
            "session_providers": session.get_providers(),
            "node_placement": placement,
            "cpu_fallback_nodes": fallback_nodes,
            "cpu_fallback": fallback_nodes > 0,
            "uses_nvidia_gpu": provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"),
        }

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: feeds[name] for name in self.input_names}

    def run(self, prepared: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, prepared)

    def to_numpy(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(outputs)


def node_placement(onnx_path: Path, provider: str, feeds_example: dict[str, np.ndarray] | None) -> dict[str, int]:
    """Nodes per execution provider, read from the profile of one run in a throwaway session."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as directory:
        options.profile_file_prefix = os.path.join(directory, "placement")
        session = ort.InferenceSession(str(onnx_path), options, providers=[provider])
        if feeds_example is None:
            return {}
        session.run(None, {i.name: feeds_example[i.name] for i in session.get_inputs()})
        events = json.loads(Path(session.end_profiling()).read_text())
    counts: Counter[str] = Counter()
    seen: set[str] = set()
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args and event["name"] not in seen:
            seen.add(event["name"])
            counts[args["provider"]] += 1
    return dict(counts)


class OnnxRuntimeBackend:
    engine = "onnxruntime"

    def targets(self) -> list[Target]:
        return [Target(hw, "onnxruntime", provider) for hw, provider in PROVIDERS]

    def probe(self, target: Target) -> Availability:
        available = ort.get_available_providers()
        if target.provider in available:
            return Availability(True, f"onnxruntime {ort.__version__} provides {target.provider}")
        return Availability(
            False,
            f"onnxruntime {ort.__version__} build has no {target.provider} (it has: {', '.join(available)})",
        )

    def load(self, request: LoadRequest, target: Target) -> OrtSession:
        if request.onnx_path is None:
            raise UnsupportedError("no ONNX file for this model (see the export error)")
        path, precision, conversion = model_for_precision(request.onnx_path, request.precision)
        try:
            session = ort.InferenceSession(str(path), providers=[target.provider])
        except Exception as exc:  # a converted file ORT rejects (e.g. duplicate node names): no such model here
            if not conversion:
                raise
            raise UnsupportedError(f"onnxruntime cannot load the {precision} conversion of the export: {exc}") from exc
        placement: dict[str, int] = {}
        if target.provider != "CPUExecutionProvider":
            placement = node_placement(path, target.provider, request.example_feeds)
        ort_session = OrtSession(session, target.provider, placement)
        ort_session.precision = precision
        ort_session.facts |= conversion
        return ort_session


def model_for_precision(onnx_path: Path, precision: str) -> tuple[Path, str, dict[str, Any]]:
    """(model file, precision it runs in, conversion facts): the fp32 export, or its int8 / fp16
    conversion. ORT has no bf16 conversion to offer, and a conversion that fails is the reason
    the precision is unsupported."""
    from harness.export import VARIANT_CONVERTERS, precision_variant

    if precision in ("fp32", "auto"):
        return onnx_path, "fp32", {}
    if precision not in VARIANT_CONVERTERS:
        raise UnsupportedError(
            f"onnxruntime: no {precision} model: the harness converts the export to int8 (dynamic "
            "quantization) and fp16 only"
        )
    try:
        variant = precision_variant(onnx_path, precision)
    except Exception as exc:  # the converter's own error is the reason
        raise UnsupportedError(f"onnxruntime: {precision} conversion of the export failed: {exc}") from exc
    if variant.info.get("quantized_matmuls") == 0:  # the file would run, but in fp32: not an int8 result
        raise UnsupportedError("onnxruntime int8: the export has no MatMul with constant weights to quantize")
    facts = {"precision_model": str(variant.path), "conversion_cached": variant.cache_hit} | {
        "conversion" if k == "tool" else k: v for k, v in variant.info.items()
    }
    return variant.path, precision, facts


BACKEND = OnnxRuntimeBackend()
