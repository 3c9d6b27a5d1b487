"""PyTorch eager on cpu / cuda / rocm / mps, with per-device synchronisation.

CUDA and ROCm (HIP builds expose the cuda API) are timed with CUDA events; MPS synchronises
before the clock stops; CPU runs are synchronous already.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers

from harness.native.base import Availability, Clock, HostMemory, LoadRequest, UnsupportedError
from harness.result import Target
from harness.workload import build_module, input_names

DTYPES = {"fp32": torch.float32, "auto": torch.float32}
HARDWARE_DEVICES = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "mps": "mps"}


class CudaEventClock(Clock):
    """Device time between two CUDA events; stop() waits for the device."""

    def start(self) -> None:
        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._begin.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return float(self._begin.elapsed_time(self._end))


class TorchSession(HostMemory):
    def __init__(self, module: torch.nn.Module, names: list[str], hardware: str, precision: str) -> None:
        self.module = module
        self.names = names
        self.hardware = hardware
        self.device = torch.device(HARDWARE_DEVICES[hardware])
        self.precision = "fp32" if precision == "auto" else precision
        self.clock = CudaEventClock() if self.device.type == "cuda" else Clock()
        self.facts: dict[str, Any] = {
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "device_name": _device_name(self.device),
            "torch_threads": torch.get_num_threads(),
            "uses_nvidia_gpu": self.device.type == "cuda" and torch.version.hip is None,
        }

    def prepare(self, feeds: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
        tensors = []
        for name in self.names:
            tensor = torch.from_numpy(feeds[name]).to(self.device)
            if tensor.is_floating_point():
                tensor = tensor.to(DTYPES[self.precision])
            tensors.append(tensor)
        return tuple(tensors)

    def run(self, prepared: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            outputs = self.module(*prepared)
        if self.device.type == "mps":
            torch.mps.synchronize()
        return outputs

    def to_numpy(self, outputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        return [o.detach().float().cpu().numpy() for o in outputs]

    def reset_device_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def device_memory_peak_mb(self) -> float | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.device.type == "mps":
            return torch.mps.current_allocated_memory() / 2**20
        return None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    import platform

    return platform.processor() or platform.machine()


class TorchBackend:
    engine = "torch"

    def targets(self) -> list[Target]:
        return [Target(hw, "torch", device) for hw, device in HARDWARE_DEVICES.items()]

    def probe(self, target: Target) -> Availability:
        if target.hardware == "cpu":
            return Availability(True, "always available")
        if target.hardware in ("cuda", "rocm"):
            is_hip = torch.version.hip is not None
            if not torch.cuda.is_available():
                build = f"HIP {torch.version.hip}" if is_hip else f"CUDA {torch.version.cuda}"
                if torch.version.cuda is None and not is_hip:
                    build = "CPU-only"
                return Availability(False, f"torch {torch.__version__} ({build} build) sees no GPU")
            if (target.hardware == "rocm") != is_hip:
                other = "a ROCm (HIP)" if is_hip else "a CUDA"
                return Availability(False, f"torch {torch.__version__} is {other} build")
            return Availability(True, torch.cuda.get_device_name(0))
        if target.hardware == "mps":
            if torch.backends.mps.is_available():
                return Availability(True, "Apple MPS")
            return Availability(False, "torch.backends.mps.is_available() is False (not Apple silicon)")
        return Availability(False, f"torch has no '{target.hardware}' device")

    def load(self, request: LoadRequest, target: Target) -> TorchSession:
        if request.spec.is_onnx_file:
            raise UnsupportedError("torch does not run ONNX files: the model was given as an .onnx file")
        if request.precision not in DTYPES:
            raise UnsupportedError(f"torch backend has no precision '{request.precision}' yet")
        module, _ = build_module(request.spec)
        device = torch.device(HARDWARE_DEVICES[target.hardware])
        module = module.to(device=device, dtype=DTYPES[request.precision])
        return TorchSession(module, input_names(request.spec), target.hardware, request.precision)


BACKEND = TorchBackend()
