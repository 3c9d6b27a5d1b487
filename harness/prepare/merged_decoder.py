"""An encoder–decoder's two decoder graphs merged into one, as Optimum and transformers.js ship it
(`decoder_model_merged.onnx`): an If on the boolean input `use_cache_branch` runs the first step's graph
(cross-attention computed from `encoder_hidden_states`) when false, the later steps' (both caches as past)
when true. The weights both graphs hold are stored once, in the outer graph, which both branches read.

The later-step branch returns the cross-attention past as given (Identity), so both branches have the same
outputs; the loop (harness.prepare.seq2seq, web/page/seq2seq.mjs) keeps the first step's and ignores these.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

BRANCH_INPUT = "use_cache_branch"


def _weights(graph: Any, kept: dict[bytes, str], outer: list[Any]) -> dict[str, str]:
    """Each initializer of `graph` renamed to the one outer initializer holding the same tensor (added where
    none does yet): the two decoders' shared weights stored once."""
    from onnx import numpy_helper

    renamed = {}
    for tensor in graph.initializer:
        array = numpy_helper.to_array(tensor)
        digest = hashlib.sha256(f"{array.dtype}{array.shape}".encode() + array.tobytes()).digest()
        if digest not in kept:
            kept[digest] = f"merged_weight_{len(kept)}"
            outer.append(numpy_helper.from_array(array, kept[digest]))
        renamed[tensor.name] = kept[digest]
    return renamed


def _branch(graph: Any, renamed: dict[str, str], branch: str, outputs: list[Any], extra: list[Any]) -> Any:
    """The graph as an If branch returning `outputs` (the If's, in its order): no inputs (it reads the outer
    graph's), no initializers (renamed to the outer ones), every output renamed apart from the If's (a subgraph
    may not shadow an outer name)."""
    import onnx

    names = renamed | {o.name: f"{branch}/{o.name}" for o in outputs}
    nodes = []
    for node in [*graph.node, *extra]:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [names.get(n, n) for n in node.input]
        copy.output[:] = [names.get(n, n) for n in node.output]
        copy.name = f"{branch}/{node.name}" if node.name else ""
        nodes.append(copy)
    typed = [onnx.helper.make_tensor_value_info(names[o.name], o.type.tensor_type.elem_type, None) for o in outputs]
    return onnx.helper.make_graph(nodes, branch, [], typed)


def merge_decoders(decoder: Path, decoder_past: Path, target: Path) -> None:
    """Write decoder_model_merged.onnx at `target` from the first step's and the later steps' graphs."""
    import onnx

    first, later = onnx.load(str(decoder)), onnx.load(str(decoder_past))
    outputs = list(first.graph.output)
    later_outputs = {o.name for o in later.graph.output}
    # the later steps return the cross-attention past as given, so both branches give the first step's outputs
    passed = [onnx.helper.make_node("Identity", [f"past_key_values.{o.name.removeprefix('present.')}"], [o.name],
                                    name=f"pass_{o.name}") for o in outputs if o.name not in later_outputs]  # fmt: skip
    kept: dict[bytes, str] = {}
    weights: list[Any] = []
    no_cache = _branch(first.graph, _weights(first.graph, kept, weights), "no_cache", outputs, [])
    with_cache = _branch(later.graph, _weights(later.graph, kept, weights), "with_cache", outputs, passed)
    node = onnx.helper.make_node("If", [BRANCH_INPUT], [o.name for o in outputs], then_branch=with_cache,
                                 else_branch=no_cache, name="optimum_if")  # fmt: skip
    inputs = {i.name: i for i in [*first.graph.input, *later.graph.input]}
    switch = onnx.helper.make_tensor_value_info(BRANCH_INPUT, onnx.TensorProto.BOOL, [1])
    typed = [outputs[0]] + [onnx.helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None)
                            for o in outputs[1:]]  # fmt: skip
    graph = onnx.helper.make_graph([node], "decoder_model_merged", [*inputs.values(), switch], typed, weights)
    model = onnx.helper.make_model(graph, opset_imports=first.opset_import, ir_version=first.ir_version)
    model.functions.extend([*first.functions, *(f for f in later.functions if f not in first.functions)])
    onnx.save(model, str(target))
