"""What an ONNX graph's weight MatMuls compute in, read from the graph an engine optimized: the element
type of the activation input of each MatMul-family node whose weights are constant (the weights may be
stored in another type and cast, as ONNX Runtime's CPU EP does with fp16 weights on x86), int8 for the
integer kernels. MatMuls of two activations (attention scores) are what no precision converts: left out."""

from __future__ import annotations

from collections import Counter
from typing import Any

# Float MatMuls (their first input is the activation, their second the weights) and integer ones.
FLOAT_MATMULS = ("MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulNBits", "MatMulBnb4")
INTEGER_MATMULS = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearMatMul", "QGemm")
ELEMENT_PRECISIONS = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp64"}
INT8_ACCURACY_LEVEL = 4  # MatMulNBits with accuracy_level 4 quantizes its activations to int8


def _types(graph: Any) -> dict[str, int]:
    typed = [*graph.input, *graph.output, *graph.value_info]
    found = {value.name: value.type.tensor_type.elem_type for value in typed if value.type.HasField("tensor_type")}
    return found | {tensor.name: tensor.data_type for tensor in graph.initializer}


def _producers(graph: Any) -> dict[str, Any]:
    return {output: node for node in graph.node for output in node.output}


def _element_type(name: str, types: dict[str, int], producers: dict[str, Any], depth: int = 0) -> int | None:
    """A tensor's element type: declared, else a Cast's target, else its producer's first input's."""
    if types.get(name):
        return types[name]
    node = producers.get(name)
    if node is None or depth > 50 or not node.input:
        return None
    if node.op_type == "Cast":
        return next(a.i for a in node.attribute if a.name == "to")
    return _element_type(node.input[0], types, producers, depth + 1)


# Ops between an initializer and a MatMul that keep it a constant weight (ORT's casts, a transpose).
WEIGHT_PASSTHROUGH = ("Cast", "Transpose", "DequantizeLinear", "Reshape")


def _is_constant(name: str, initializers: set[str], producers: dict[str, Any], depth: int = 0) -> bool:
    if name in initializers:
        return True
    node = producers.get(name)
    if node is None or depth > 10:
        return False
    return node.op_type == "Constant" or (
        node.op_type in WEIGHT_PASSTHROUGH and _is_constant(node.input[0], initializers, producers, depth + 1)
    )


def _accuracy_level(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)


def matmul_compute(model: Any) -> dict[str, int]:
    """Weight MatMul nodes per compute precision (fp32, fp16, bf16, int8; 'unknown' when the graph
    does not say) in an ONNX model, e.g. {'fp32': 1} for ORT's optimized fp16 MatMul on x86; an If's or a
    Loop's branches counted too (a merged decoder's MatMuls are there, its weights in the outer graph)."""
    counts: Counter[str] = Counter()
    _count(model.graph, {}, {}, set(), counts)
    return dict(counts)


def _count(graph: Any, types: dict[str, int], producers: dict[str, Any], initializers: set[str],
           counts: Counter[str]) -> None:  # fmt: skip
    """matmul_compute's counts of one graph, which sees its outer graphs' names (types, producers, weights)."""
    types, producers = types | _types(graph), producers | _producers(graph)
    initializers = initializers | {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:  # GRAPH, GRAPHS
                _count(sub, types, producers, initializers, counts)
        if len(node.input) < 2 or not _is_constant(node.input[1], initializers, producers):
            continue
        if node.op_type in INTEGER_MATMULS or (
            node.op_type == "MatMulNBits" and _accuracy_level(node) == INT8_ACCURACY_LEVEL
        ):
            counts["int8"] += 1
        elif node.op_type in FLOAT_MATMULS:
            element = _element_type(node.input[0], types, producers)
            counts[ELEMENT_PRECISIONS.get(element, "unknown") if element else "unknown"] += 1
