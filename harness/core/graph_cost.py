"""FLOPs and bytes moved per node of an ONNX graph, for one case's input shapes.

Shapes are inferred, not run: the graph's inputs are fixed to the case's shapes and
onnx.shape_inference (with data propagation) infers the rest. Dynamo exports compute their
attention masks with Range/Expand on values onnx's inference does not propagate; where it leaves a
shape unknown, ONNX Runtime's symbolic shape inference (onnx's inference per node plus value
propagation) fills it in. A node whose shapes stay unknown has no count (None), never a guess.

The counts follow the usual conventions: a multiply-add is 2 FLOPs (MatMul [.., M, K] x [.., K, N]
is 2·M·K·N per batch; Conv is 2 per weight per output element, plus the bias); an elementwise op,
a reduction or a pooling window counts one operation per element it computes or reads; pure data
movement (Reshape, Transpose, Gather, Concat, ...) counts 0 FLOPs. Bytes moved are every input
(weights included) read once and every output written once, which is what a roofline charges.
These are counts of work, not cycle estimates: the operator predictor (harness.analysis.op_predict)
fits its own cost per op class on top of them, so only consistency matters.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper, shape_inference

from harness.core.op_types import CONVS, ELEMENTWISE, MATMULS, MOVES, POOLS, REDUCTIONS, op_class

# Weights larger than this keep only their dims for inference: a base model's 500 MB are not copied.
STRIPPED_BYTES = 4096

# FLOPs per element: normalisations read their input a few times (mean, variance, scale, shift).
PER_ELEMENT = {
    "Softmax": 5,
    "LogSoftmax": 5,
    "LayerNormalization": 8,
    "SkipLayerNormalization": 9,
    "SimplifiedLayerNormalization": 6,
    "RMSNormalization": 6,
    "InstanceNormalization": 8,
    "GroupNormalization": 8,
    "BatchNormalization": 2,
    "MeanVarianceNormalization": 8,
}
METADATA_ONLY = frozenset({"Shape", "Size"})  # they read a tensor's dims, not its data
VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})  # an engine aliases, not copies


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...] | None  # None: not inferred
    itemsize: int | None

    @property
    def elements(self) -> int | None:
        return None if self.shape is None else math.prod(self.shape)

    @property
    def nbytes(self) -> int | None:
        elements = self.elements
        return None if elements is None or self.itemsize is None else elements * self.itemsize


@dataclass(frozen=True)
class NodeCost:
    name: str
    op_type: str
    flops: float | None  # None: shapes unknown, or an op type without a rule
    bytes: float | None
    weighted: bool  # an operand is constant (weights): a linear layer, not an activation x activation product
    # what a run dispatches and moves besides the weights: an engine folds a node computed from constants alone at
    # load time (folded: never dispatched), and a view (VIEWS) moves nothing; moved is the node's non-constant
    # inputs read and its outputs written (None: a shape unknown)
    folded: bool = False
    moved: float | None = None

    @property
    def op_class(self) -> str:
        return op_class(self.op_type, self.weighted)


@dataclass
class GraphCost:
    nodes: list[NodeCost]
    unknown_shapes: int  # nodes with an input or output shape left unknown
    inference: str  # how the shapes were inferred
    io_bytes: float | None = None  # the graph's inputs and outputs, weights aside (None: a shape left unknown)

    def by_name(self) -> dict[str, NodeCost]:
        return {node.name: node for node in self.nodes}

    @property
    def flops(self) -> float:
        return sum(n.flops or 0.0 for n in self.nodes)

    @property
    def bytes(self) -> float:
        return sum(n.bytes or 0.0 for n in self.nodes)

    @property
    def dispatched(self) -> int:
        """Nodes a run calls a kernel for each time (folded and Constant nodes are not): a step's fixed cost."""
        return sum(1 for n in self.nodes if not n.folded and n.op_type != "Constant")

    @property
    def activation_bytes(self) -> float | None:
        """Bytes the dispatched nodes move besides the weights (None: a node's shapes unknown)."""
        moved = [n.moved for n in self.nodes if not n.folded]
        return None if any(m is None for m in moved) else float(sum(m for m in moved if m is not None))

    def work_by_class(self) -> dict[str, list[float]]:
        """Per op class: [FLOPs, bytes, nodes], what the operator predictor prices (JSON-ready)."""
        work: dict[str, list[float]] = {}
        for node in self.nodes:
            entry = work.setdefault(node.op_class, [0.0, 0.0, 0])
            entry[0] += node.flops or 0.0
            entry[1] += node.bytes or 0.0
            entry[2] += 1
        return work


def node_flops(
    op_type: str, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], attributes: Mapping[str, object]
) -> float | None:
    """The FLOPs of one node from its operands' shapes (see the module docstring for the rules)."""
    if op_type in MOVES:
        return 0.0
    out = outputs[0].elements if outputs else None
    first = inputs[0].elements if inputs else None
    if op_type in MATMULS:
        return _matmul_flops(op_type, inputs, outputs)
    if op_type == "MatMulNBits":  # ONNX Runtime's int4 weight-only MatMul: A [.., K] x the blocks of B [N, K]
        return _matmul_flops("MatMul", inputs, outputs)
    if op_type in CONVS:
        return _conv_flops(op_type, inputs, outputs)
    if op_type in PER_ELEMENT:
        return None if first is None else float(PER_ELEMENT[op_type] * first)
    if op_type in ELEMENTWISE:
        return None if out is None else float(out)
    if op_type in REDUCTIONS:
        return None if first is None else float(first)
    if op_type in POOLS:
        kernel = attributes.get("kernel_shape")
        return None if out is None or not isinstance(kernel, list) else float(out * math.prod(kernel))
    return None


def _matmul_flops(op_type: str, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> float | None:
    a, y = inputs[0], outputs[0]
    if a.shape is None or y.shape is None or not a.shape:
        return None
    if op_type == "Gemm" or op_type == "FusedMatMul":
        # A may be transposed: K is A's elements over the output rows it feeds (and their batch).
        rows = y.shape[-2] if len(y.shape) >= 2 else 1
        a_batch = math.prod(a.shape[:-2]) if len(a.shape) > 2 else 1
        k = math.prod(a.shape) // max(rows * a_batch, 1)
    else:
        k = a.shape[-1]
    flops = 2.0 * k * math.prod(y.shape)
    if op_type == "Gemm" and len(inputs) > 2:  # the bias C, added once per output element
        flops += math.prod(y.shape)
    return flops


def _conv_flops(op_type: str, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> float | None:
    x, w, y = inputs[0], inputs[1] if len(inputs) > 1 else TensorInfo(None, None), outputs[0]
    if w.shape is None or y.shape is None or x.shape is None:
        return None
    per_weight = math.prod(w.shape[1:])  # [C_out, C_in/group, k...]: the MACs of one output element
    if op_type == "ConvTranspose":  # [C_in, C_out/group, k...]: every input element is spread over them
        flops = 2.0 * math.prod(x.shape) * per_weight
    else:
        flops = 2.0 * math.prod(y.shape) * per_weight
    has_bias = len(inputs) > 2 and op_type in ("Conv", "ConvTranspose", "FusedConv", "NhwcConv")
    return flops + (math.prod(y.shape) if has_bias else 0)


def node_bytes(op_type: str, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> float | None:
    """Every input read once (none for Shape/Size, which read dims) and every output written once."""
    read = [] if op_type in METADATA_ONLY else list(inputs)
    sizes = [t.nbytes for t in (*read, *outputs)]
    return None if any(s is None for s in sizes) else float(sum(s for s in sizes if s is not None))


def graph_cost(onnx_path: Path, input_shapes: Mapping[str, Sequence[int]]) -> GraphCost:
    """Per node FLOPs and bytes of the model at these input shapes (name → dims)."""
    model = _without_weight_data(onnx.load(str(onnx_path), load_external_data=False))
    _fix_inputs(model.graph, input_shapes)
    inferred = shape_inference.infer_shapes(model, data_prop=True)
    tensors = _tensor_infos(inferred)
    inference = "onnx.shape_inference (data_prop)"
    if _unknown_outputs(inferred.graph, tensors):
        try:
            symbolic = _symbolic_shape_inference().infer_shapes(_weights_as_inputs(model), auto_merge=True)
        except Exception as exc:  # keep onnx's shapes; the nodes it left unknown stay uncounted
            inference += f"; onnxruntime symbolic inference failed: {type(exc).__name__}: {exc}"
        else:
            tensors = _tensor_infos(symbolic) | {k: v for k, v in tensors.items() if v.shape is not None}
            inference += " + onnxruntime symbolic shape inference"
    return _costs(inferred.graph, tensors, inference, _io_bytes(model.graph, tensors))


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose weights without data here (stripped, or in an external file not loaded) are graph inputs of their
    type and dims: ONNX Runtime's symbolic inference reads an initializer's values to propagate them, and one that
    points at a file fails the whole inference (every model exported with external data then counted no FLOPs)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    absent = [t for t in graph.initializer if t.data_location == TensorProto.EXTERNAL]
    kept = [t for t in graph.initializer if t.data_location != TensorProto.EXTERNAL]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    declared = {value.name for value in graph.input}
    graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in absent if t.name not in declared
    )
    return copy


def _io_bytes(graph: onnx.GraphProto, tensors: Mapping[str, TensorInfo]) -> float | None:
    """The bytes of the graph's inputs and outputs (its weights aside), None where a shape is unknown."""
    stored = {t.name for t in graph.initializer}  # an old graph lists its weights among its inputs too
    unknown = TensorInfo(None, None)
    sizes = [tensors.get(v.name, unknown).nbytes for v in (*graph.input, *graph.output) if v.name not in stored]
    return None if any(n is None for n in sizes) else float(sum(n for n in sizes if n is not None))


@cache
def _symbolic_shape_inference() -> Any:
    """ONNX Runtime's SymbolicShapeInference, loaded from its file alone: `import onnxruntime.tools....` runs
    the package's __init__, which imports torch whenever it is installed (pytorch_export_helpers) — seconds of
    every worker that counts a row, and torch in a process that must not hold it."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("onnxruntime is not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / "tools" / "symbolic_shape_infer.py"
    name = "_accelharness_ort_symbolic_shape_infer"
    module_spec = importlib.util.spec_from_file_location(name, source)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {source}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # its dataclasses and pickling look themselves up by module name
    module_spec.loader.exec_module(module)
    return module.SymbolicShapeInference


def _costs(graph: onnx.GraphProto, tensors: dict[str, TensorInfo], inference: str, io_bytes: float | None) -> GraphCost:
    constants = _constant_values(graph)
    unknown = TensorInfo(None, None)
    nodes, unknown_shapes = [], 0
    for index, node in enumerate(graph.node):
        inputs = [tensors.get(name, unknown) for name in node.input if name]
        outputs = [tensors.get(name, unknown) for name in node.output if name]
        if any(t.shape is None for t in (*inputs, *outputs)):
            unknown_shapes += 1
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weighted = any(name in constants for name in node.input[1:] if name)
        folded = all(name in constants for name in node.output if name)
        variable = [tensors.get(name, unknown) for name in node.input if name and name not in constants]
        nodes.append(
            NodeCost(
                name=node.name or f"{node.op_type}_{index}",
                op_type=node.op_type,
                flops=node_flops(node.op_type, inputs, outputs, attributes),
                bytes=node_bytes(node.op_type, inputs, outputs),
                weighted=weighted,
                folded=folded,
                moved=0.0 if node.op_type in VIEWS else node_bytes(node.op_type, variable, outputs),
            )
        )
    return GraphCost(nodes, unknown_shapes, inference, io_bytes)


def _without_weight_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """Large initializers keep their dims and type but lose their data (marked external)."""
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            continue
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        if math.prod(tensor.dims) * itemsize > STRIPPED_BYTES:
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            tensor.data_location = TensorProto.EXTERNAL
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", "stripped-for-shape-inference"
    return model


def _fix_inputs(graph: onnx.GraphProto, input_shapes: Mapping[str, Sequence[int]]) -> None:
    for value in graph.input:
        if value.name not in input_shapes:
            continue
        shape = value.type.tensor_type.shape
        shape.ClearField("dim")
        for size in input_shapes[value.name]:
            shape.dim.add().dim_value = int(size)


def _tensor_infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    graph = model.graph
    infos: dict[str, TensorInfo] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        kind = value.type.tensor_type
        dims = kind.shape.dim if kind.HasField("shape") else None
        static = dims is not None and all(d.HasField("dim_value") for d in dims)
        shape = tuple(d.dim_value for d in dims) if static and dims is not None else None
        infos[value.name] = TensorInfo(shape, _itemsize(kind.elem_type))
    for tensor in graph.initializer:
        infos[tensor.name] = TensorInfo(tuple(tensor.dims), _itemsize(tensor.data_type))
    for node in graph.node:  # Constant nodes carry their value's shape in the attribute
        if node.op_type == "Constant" and node.output and node.output[0] not in infos:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                infos[node.output[0]] = TensorInfo(tuple(value.dims), _itemsize(value.data_type))
    return infos


def _itemsize(elem_type: int) -> int | None:
    if elem_type == TensorProto.UNDEFINED:
        return None
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except (KeyError, TypeError):
        return None


def _unknown_outputs(graph: onnx.GraphProto, tensors: dict[str, TensorInfo]) -> bool:
    return any(tensors.get(name, TensorInfo(None, None)).shape is None for n in graph.node for name in n.output if name)


def _constant_values(graph: onnx.GraphProto) -> set[str]:
    """Initializers, Constant outputs, and what is computed from constants alone (folded by engines)."""
    constants = {t.name for t in graph.initializer}
    for node in graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant" or (inputs and all(name in constants for name in inputs)):
            constants.update(name for name in node.output if name)
    return constants


# --- the work of a row: bytes read and FLOPs per token (generate) or per item (inference) ----------------
# What a forward must read, as a roofline charges it: every weight once (a table only looked up, an
# embedding's Gather, reads one row per token: not counted), by the type it is stored in; int4 counts the
# blocks and their scales and zero points (MatMulNBits' inputs). A decode step also reads its whole KV cache.
INT4_CONSUMERS = frozenset({"MatMulNBits"})
LOOKUPS = frozenset({"Gather", "GatherElements", "GatherND"})


@cache
def _proto(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


@cache
def weight_bytes(path: Path) -> dict[str, float]:
    """Bytes of weights a forward reads, by the type they are stored in (int4, fp16, fp32, int8, other),
    from the graph's initializers (dims and types only, no data loaded)."""
    graph = _proto(path).graph
    consumers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    found: dict[str, float] = {}
    for tensor in graph.initializer:
        used = consumers.get(tensor.name, set())
        if not used or used <= LOOKUPS:
            continue
        itemsize = _itemsize(tensor.data_type) or 0
        kind = "int4" if used & INT4_CONSUMERS else TYPE_NAMES.get(tensor.data_type, "other")
        found[kind] = found.get(kind, 0.0) + float(math.prod(tensor.dims) * itemsize)
    return found


TYPE_NAMES = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16",
              TensorProto.INT8: "int8", TensorProto.UINT8: "int8"}  # fmt: skip


def _pasts(path: Path, shape: tuple[int, int] | None) -> list[tuple[str, int, int, int]]:
    """(name, heads, head size, itemsize) of each past input; heads and size from the graph or `shape`."""
    pasts = []
    for value in _proto(path).graph.input:
        if not value.name.startswith("past"):
            continue
        dims = value.type.tensor_type.shape.dim
        fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        heads, size = (fixed[1], fixed[3]) if len(fixed) == 4 and fixed[1] and fixed[3] else (shape or (None, None))
        itemsize = _itemsize(value.type.tensor_type.elem_type)
        if heads is None or size is None or itemsize is None:
            raise ValueError(f"past input {value.name} has no fixed heads and head size")
        pasts.append((value.name, heads, size, itemsize))
    return pasts


def _step_shapes(pasts: list[tuple[str, int, int, int]], batch: int, tokens: int, past: int) -> dict[str, list[int]]:
    shapes = {"input_ids": [batch, tokens], "attention_mask": [batch, past + tokens], "position_ids": [batch, tokens]}
    return shapes | {name: [batch, heads, past, size] for name, heads, size, _ in pasts}


Work = tuple[dict[str, float | None], dict[str, Any]]  # (a Result's WORK_FIELDS, facts for its details)
# How each count was made, as its details' work_counted says (harness.prepare.work_memo writes it from here, never
# from a remembered entry)
GENERATION_COUNTED = ("harness.core.graph_cost: weights by stored type, the KV cache at the steps' mean depth, "
                      "FLOPs by shape inference, a step's dispatched nodes and the bytes they move besides the "
                      "weights")  # fmt: skip
INFERENCE_COUNTED = "harness.core.graph_cost: weights by stored type, inputs and outputs, FLOPs by shape inference"


def mean_positions(prompt: int, depth: int, new_tokens: int) -> float:
    """The cached positions a decode step attends over, on average over a generation's N-1 decode steps: the prompt,
    the depth and half of the N-2 tokens generated before the last step."""
    return prompt + depth + max(new_tokens - 2, 0) / 2


def generation_work(path: Path, batch: int, prompt: int, depth: int, new_tokens: int,
                    shape: tuple[int, int] | None = None) -> Work:  # fmt: skip
    """(the Result's work fields, facts for details) of a generation on a graph with past key/values: per
    decode token the weights and the KV cache a step reads at the mean depth of the decode steps (prompt +
    depth + (N-2)/2 cached positions), and the step's FLOPs there; per prompt token the prefill's FLOPs. Facts
    besides: the step's dispatched nodes and the bytes they move besides the weights (its activations: the KV
    cache as the graph concatenates, expands and attends over it), what generation's prediction prices."""
    pasts = _pasts(path, shape)
    weights = weight_bytes(path)
    context = mean_positions(prompt, depth, new_tokens)
    kv = sum(batch * heads * context * size * itemsize for _, heads, size, itemsize in pasts)
    step = graph_cost(path, _step_shapes(pasts, batch, 1, round(context)))
    prefill = graph_cost(path, _step_shapes(pasts, batch, prompt, depth))
    fields = {
        "bytes_per_token": (sum(weights.values()) + kv) / batch,
        "flops_per_token": step.flops / batch if not step.unknown_shapes else None,
        "prefill_flops_per_token": prefill.flops / (batch * prompt) if not prefill.unknown_shapes else None,
    }
    facts = {"weight_bytes": weights, "kv_bytes_per_step": kv, "kv_mean_positions": context,
             "step_nodes": step.dispatched, "step_activation_bytes": step.activation_bytes,
             "work_counted": GENERATION_COUNTED}  # fmt: skip
    return fields, facts


def inference_work(path: Path, input_shapes: Mapping[str, Sequence[int]], batch: int) -> Work:
    """(work fields, facts) of an inference case: per item the weights (read once per batch) and the graph's
    inputs and outputs, and its FLOPs."""
    weights = weight_bytes(path)
    cost = graph_cost(path, input_shapes)
    known = cost.io_bytes  # the outputs' shapes by the same inference as the FLOPs (onnx's alone often leaves them)
    fields = {
        "bytes_per_item": None if known is None else (sum(weights.values()) + known) / batch,
        "flops_per_item": cost.flops / batch if not cost.unknown_shapes else None,
    }
    return fields, {"weight_bytes": weights, "work_counted": INFERENCE_COUNTED}
