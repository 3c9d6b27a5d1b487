"""Tiny ONNX files for the int4 and external-data tests, written with onnx's helpers (no export)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# A few MatMuls of a width int4 blocks (32) divide, with ReLUs between.
WIDTHS = (64, 256, 256, 64)


def matmul_model(
    path: Path, widths: tuple[int, ...] = WIDTHS, batch: int | str = "batch", external: bool = False
) -> Path:
    """x[batch, widths[0]] through one MatMul per width step; weights in `<name>.data` when external."""
    rng = np.random.default_rng(0)
    nodes, weights, previous = [], [], "x"
    for i, (rows, columns) in enumerate(itertools.pairwise(widths)):
        weights.append(
            numpy_helper.from_array((rng.standard_normal((rows, columns)) / rows**0.5).astype(np.float32), f"w{i}")
        )
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [f"h{i}"], name=f"matmul{i}"))
        previous = f"h{i}"
        if i < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [previous], [f"r{i}"]))
            previous = f"r{i}"
    nodes.append(helper.make_node("Identity", [previous], ["y"]))
    graph = helper.make_graph(
        nodes,
        "matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, widths[-1]])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    if external:
        location = f"{path.name}.data"
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                  size_threshold=0)  # fmt: skip
    else:
        onnx.save(model, str(path))
    return path
