"""The ceilings' calibration graphs (harness.run.ceilings) run through torch: each ONNX node as the torch op that
computes it, so torch's rows are held against what torch itself reaches (timed by harness.run.measure's loop with
the session's own clock, as every engine's ceilings are).

  Expand  x.expand(shape) written out, as ONNX Runtime's Expand writes its output (a view alone would move no bytes,
          and the bandwidth graph would measure nothing)
  Add     torch.add: E read, T written
  MatMul  torch.matmul on the graph's own weight
  Slice   the first values of each axis (the graph's answer)
Each node's output is kept from the first run and written in place after it (out=), as ONNX Runtime's arena reuses
its buffers: torch's CPU allocator hands a large tensor back to the system when it is freed, so a fresh 64 MiB
output per run measured page faults (0.44 GB/s here against 1.5 in place, on the same loaded machine), not what
torch's kernels move.
Any other op (MatMulNBits, ONNX Runtime's int4 weight-only MatMul) has no torch op here: its ceiling holds the reason.
Imported in a torch worker only (native/torch_backend.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.core.records import Target, UnsupportedError
from harness.native.torch_session import TorchSession, use_threads

METHOD = ("the calibration graph's Expand, Add, MatMul and Slice as torch ops, each output written (Expand's too, as "
          "ONNX Runtime writes it) in place after the first run, as ORT's arena reuses its buffers")  # fmt: skip


def _slice(data: torch.Tensor, starts: list[int], ends: list[int]) -> torch.Tensor:
    return data[tuple(slice(s, e) for s, e in zip(starts, ends, strict=True))]


OPS: dict[str, Callable[..., torch.Tensor]] = {
    "Expand": lambda x, shape: x.expand(*shape).contiguous(),
    "Add": torch.add,
    "MatMul": torch.matmul,
    "Slice": _slice,
}
# the same ops writing into the output the first run made
INTO: dict[str, Callable[..., torch.Tensor]] = {
    "Expand": lambda out, x, shape: out.copy_(x.expand(*shape)),
    "Add": lambda out, a, b: torch.add(a, b, out=out),
    "MatMul": lambda out, a, b: torch.matmul(a, b, out=out),
}


class CalibrationGraph(torch.nn.Module):
    """A calibration graph's nodes in order, each as its torch op: integer constants (shapes, slice bounds) as
    Python lists, float weights as tensors on the device."""

    def __init__(self, graph: Any, device: torch.device) -> None:
        super().__init__()
        from onnx import numpy_helper

        for node in graph.node:
            if node.op_type not in OPS or node.domain not in ("", "ai.onnx"):
                raise UnsupportedError(f"torch: the calibration's {node.op_type} ({node.domain or 'ai.onnx'}) has no "
                                       "torch op here (MatMulNBits is ONNX Runtime's int4 weight-only MatMul; torch "
                                       "runs no q4)")  # fmt: skip
        self.nodes = [(node.op_type, list(node.input), node.output[0]) for node in graph.node]
        self.constants: dict[str, Any] = {}
        for tensor in graph.initializer:
            array = numpy_helper.to_array(tensor)
            is_int = np.issubdtype(array.dtype, np.integer)
            self.constants[tensor.name] = array.tolist() if is_int else torch.from_numpy(array.copy()).to(device)
        self.inputs = [i.name for i in graph.input if i.name not in self.constants]
        self.output = graph.output[0].name
        self.kept: dict[str, torch.Tensor] = {}  # each node's output, written in place after the first run

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor]:
        values = self.constants | dict(zip(self.inputs, args, strict=True))
        for op, inputs, output in self.nodes:
            given = [values[name] for name in inputs]
            kept = self.kept.get(output)
            values[output] = OPS[op](*given) if kept is None else INTO[op](kept, *given)
            if kept is None and op in INTO:
                self.kept[output] = values[output]
        return (values[self.output],)


def load_calibration_session(path: Path, target: Target, threads: int | None = None) -> TorchSession:
    """A calibration graph's file as a torch session on the target's device, in fp32 (its inputs the graph's)."""
    import onnx

    facts = use_threads(threads)
    device = torch.device(target.provider)
    module = CalibrationGraph(onnx.load(str(path)).graph, device)
    session = TorchSession(module, module.inputs, target.hardware, target.provider, "fp32")
    session.facts |= facts | {"calibration_method": METHOD}
    return session
