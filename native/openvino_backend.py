"""OpenVINO runtime on the exported ONNX file, on every device OpenVINO reports.

OpenVINO picks its own inference precision (bf16 on CPUs with AMX/AVX512-BF16). fp32, fp16 and
bf16 requests set INFERENCE_PRECISION_HINT; the precision that ran is read back and recorded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import openvino as ov

from harness.core.records import Target
from harness.native.base import Availability, Capabilities, Clock, HostMemory, LoadRequest, UnsupportedError

DEVICES = ("CPU", "GPU", "NPU")
PRECISION_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i8": "int8"}
# The hint asked for per requested precision (auto: none, OpenVINO picks). A device without native
# f16/bf16 may run another precision; the session reads back and records what the device chose.
HINTS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


class OpenVinoSession(HostMemory):
    def __init__(self, compiled: ov.CompiledModel, core: ov.Core, device: str, requested: str) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.input_ports = [port.get_names() for port in compiled.inputs]  # a tensor may carry several names
        hint = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        self.precision = PRECISION_NAMES.get(hint, hint)
        self.clock = Clock()  # infer() is synchronous
        self.facts: dict[str, Any] = {
            "openvino_version": ov.__version__,
            "device": device,
            "device_name": core.get_property(device, "FULL_DEVICE_NAME"),
            "inference_precision_hint": hint,
            "requested_precision": requested,
            "precision_changed": requested != "auto" and self.precision != requested,
            "num_streams": str(compiled.get_property("NUM_STREAMS")),
        }

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


class OpenVinoBackend:
    engine = "openvino"
    capabilities = Capabilities()  # inference on the ONNX export; no decoder loop, no training

    def device(self, target: Target) -> str | None:
        """Each OpenVINO device is its own (CPU: the host's cores)."""
        return None if target.provider == "CPU" else f"openvino:{target.provider}"

    def targets(self) -> list[Target]:
        return [Target("openvino", "openvino", device) for device in DEVICES]

    def probe(self, target: Target) -> Availability:
        devices = ov.Core().available_devices
        if any(d.split(".")[0] == target.provider for d in devices):
            return Availability(True, f"OpenVINO {ov.__version__} reports {target.provider}")
        return Availability(False, f"OpenVINO {ov.__version__} reports devices {devices}, no {target.provider}")

    def load(self, request: LoadRequest, target: Target) -> OpenVinoSession:
        if request.onnx_path is None:
            raise UnsupportedError("no ONNX file for this model (see the export error)")
        if request.precision == "int8":
            raise UnsupportedError(
                "openvino: int8 needs a statically quantized model (NNCF post-training quantization with "
                "calibration data); INFERENCE_PRECISION_HINT only offers f32, f16 and bf16"
            )
        core = ov.Core()
        hint = HINTS.get(request.precision)
        config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
        compiled = core.compile_model(str(request.onnx_path), target.provider, config)
        return OpenVinoSession(compiled, core, target.provider, request.precision)


BACKEND = OpenVinoBackend()
