"""PyTorch eager on cpu / cuda / rocm / mps: where it runs, and its sessions (native/torch_session.py).

The parent process imports this module to plan a run, so it does not import torch: torch (1 s) and
transformers (0.5 s) are imported to look for a GPU and in the worker that loads a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.core.precision import INT4_PRECISIONS, per_graph
from harness.core.records import Target, UnsupportedError
from harness.native.base import Availability, Capabilities, DeviceByHardware, LoadRequest

if TYPE_CHECKING:
    from harness.native.torch_session import TorchSession

HARDWARE_DEVICES = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "mps": "mps"}  # target provider: torch device
PRECISIONS = ("fp32", "auto", "fp16", "bf16", "int8")  # what native/torch_session.py's DTYPES maps


class TorchBackend(DeviceByHardware):
    engine = "torch"
    # builds the module itself; generates with ORT's greedy loop over it (native/torch_greedy.py), checked against
    # native ORT on the fp32 export; trains (forward + backward + step)
    capabilities = Capabilities(modes=("inference", "generate", "training"), needs_onnx=False, runs_onnx_files=False,
                                worker_needs_torch=True, checked_on_export=True)  # fmt: skip

    def targets(self) -> list[Target]:
        return [Target(hw, "torch", device) for hw, device in HARDWARE_DEVICES.items()]

    def probe(self, target: Target) -> Availability:
        if target.hardware == "cpu":
            return Availability(True, "always available")
        import torch  # only to look for a device: a cpu plan stays without it

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
        if request.precision in INT4_PRECISIONS:
            raise UnsupportedError(
                f"torch: no {request.precision}: int4 weight-only MatMuls (MatMulNBits) are an ONNX Runtime format, "
                "and no library the harness keeps runs int4 weights in torch on this target (torchao is not a "
                "dependency)"
            )
        if per_graph(request.precision) is not None:  # one module, one dtype
            raise UnsupportedError(f"torch: --precision {request.precision} names an encoder–decoder's ONNX graphs "
                                   "apart; torch casts the one module to one precision")  # fmt: skip
        if request.precision not in PRECISIONS:
            raise UnsupportedError(f"torch backend has no precision '{request.precision}' yet")
        from harness.native.torch_session import load_session

        return load_session(request, target)

    def load_calibration(self, path: Path, target: Target, threads: int | None = None) -> TorchSession:
        """A ceiling's calibration graph (harness.run.ceilings) as torch ops: torch's rows held against torch's own."""
        from harness.native.torch_ceilings import load_calibration_session

        return load_calibration_session(path, target, threads)

    def load_control(self, weights: list[np.ndarray], target: Target, threads: int | None = None) -> TorchSession:
        from harness.native.torch_session import load_control_session

        return load_control_session(weights, target, threads)


BACKEND = TorchBackend()
