"""A model's graph, counted and not run: its ONNX export (from the cache, or exported now) and the
work per op class at each (batch, seq), for predicting a model that was never measured; and its generation
graph's work (harness.core.graph_cost.generation_work: bytes per decode token, prefill FLOPs) at each asked
depth, at the precision asked, for predicting its generation (harness.analysis.roofline_predict).

A spec model is exported as a benchmark run would export it (same cache key, same example inputs),
so a later run reuses the file; no forward pass is run beyond what the exporter traces. An .onnx
file is counted as it is. Input shapes come from the same generators the runs use.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.prepare.prepared import CaseShape, PrepareJob
from harness.prepare.specs import ModelSpec


@dataclass
class GraphWork:
    spec: ModelSpec
    parameters: int | None
    onnx_path: Path
    work: dict[CaseShape, dict[str, list[float]]] = field(default_factory=dict)  # [FLOPs, bytes, nodes] per class
    # per case, a measured row's work fields (bytes_per_item, flops_per_item) for the roofline's inference method
    per_item: dict[CaseShape, dict[str, float | None]] = field(default_factory=dict)
    skipped: dict[CaseShape, str] = field(default_factory=dict)  # cases the model cannot take, and why
    facts: dict[str, Any] = field(default_factory=dict)  # how the export was had and the shapes inferred


def count_graph(job: PrepareJob) -> Iterator[GraphWork]:
    """Worker entry point (a generator, as harness.run.isolation expects)."""
    from harness.core.graph_cost import graph_cost, inference_work

    spec = job.spec
    path, parameters, shapes, skipped, facts = _onnx_file(job) if spec.is_onnx_file else _exported(job)
    counted = GraphWork(spec, parameters, path, skipped=skipped, facts=facts)
    for shape, inputs in shapes.items():
        cost = graph_cost(path, inputs)
        counted.work[shape] = cost.work_by_class()
        try:  # the roofline method's one input; a graph it cannot count leaves that method out, not the others
            counted.per_item[shape] = inference_work(path, inputs, shape[0])[0]
        except Exception as exc:  # the graph's own words are the reason
            counted.facts.setdefault("per_item_not_counted", {})[f"b{shape[0]} s{shape[1]}"] = str(exc)[:300]
        counted.facts["shape_inference"] = cost.inference
        counted.facts.setdefault("unknown_shapes", {})[f"b{shape[0]} s{shape[1]}"] = cost.unknown_shapes
    yield counted


Shapes = dict[CaseShape, dict[str, tuple[int, ...]]]


def _onnx_file(job: PrepareJob) -> tuple[Path, int, Shapes, dict[CaseShape, str], dict[str, Any]]:
    import onnx

    from harness.prepare.inputs import make_signature_inputs, onnx_file_signature

    path = job.spec.local_path
    assert path is not None
    graph = onnx.load(str(path), load_external_data=False).graph
    parameters = sum(math.prod(t.dims) for t in graph.initializer)
    signature = onnx_file_signature(path)
    shapes = {
        (b, s): {k: v.shape for k, v in make_signature_inputs(signature, job.spec.name, b, s).items()}
        for b, s in job.shapes
    }
    return path, parameters, shapes, {}, {"export": "the file itself"}


def _exported(job: PrepareJob) -> tuple[Path, int, Shapes, dict[CaseShape, str], dict[str, Any]]:
    from harness.prepare.export import cached_export, export_dir, export_key, export_onnx
    from harness.prepare.workload import (
        build_module,
        count_parameters,
        find_weights,
        make_inputs,
        max_sequence_length,
        model_config,
    )

    spec = job.spec
    weights, directory = find_weights(spec)
    outcome = cached_export(export_dir(export_key(spec, weights)))
    if outcome is None:  # exported now, as a benchmark run would (and then finds it in the cache)
        module, weights = build_module(spec)
        config = module.model.config
        parameters = sum(p.numel() for p in module.parameters())
        example = make_inputs(spec, config, 2, 16 if spec.inputs.uses_sequence else None)
        outcome = export_onnx(spec, module, weights, example)
    else:  # the folder's own config (--model-path), not the spec it took inputs and outputs from
        config = model_config(spec, directory)
        parameters = count_parameters(spec, config)
    if outcome.path is None:
        raise RuntimeError(f"{spec.name} could not be exported to ONNX: {outcome.error}")
    limit = max_sequence_length(config) if spec.inputs.uses_sequence else None
    shapes: Shapes = {}
    skipped: dict[CaseShape, str] = {}
    for batch, seq in job.shapes:
        if limit is not None and seq is not None and seq > limit:
            skipped[(batch, seq)] = f"sequence length {seq} exceeds the model's maximum of {limit} positions"
        else:
            shapes[(batch, seq)] = {k: v.shape for k, v in make_inputs(spec, config, batch, seq).items()}
    facts = {"export": "cached" if outcome.cache_hit else f"exported now ({outcome.exporter})"}
    return outcome.path, parameters, shapes, skipped, facts


# --- generation: the graph with past key/values, counted at each asked depth ----------------------------------
GenerationCase = tuple[int, int, int]  # (batch, prompt tokens, KV-cache depth)


@dataclass(frozen=True)
class GenerationJob:
    spec: ModelSpec
    precision: str
    cases: tuple[GenerationCase, ...]
    new_tokens: int


@dataclass
class GenerationWork:
    spec: ModelSpec
    precision: str  # what the counted file holds (a folder's own precision where it has one)
    onnx_path: Path
    # per case, the work fields and the step's counts (nodes; weight, KV cache and activation bytes)
    work: dict[GenerationCase, dict[str, Any]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


def count_generation(job: GenerationJob) -> Iterator[GenerationWork]:
    """Worker entry point: the graph a generate run would run (the export with past, cached or exported now;
    an .onnx file with past as it is), converted to the asked precision as a run converts it, counted at each
    case. Raises with the reason where there is no such graph."""
    from harness.core.graph_cost import generation_work
    from harness.prepare.folders import past_shape
    from harness.prepare.variants import model_for_precision

    graph, facts = _generation_graph(job.spec)
    path, precision, conversion = model_for_precision(graph, job.precision)
    converted = {"conversion": conversion} if conversion else {}
    counted = GenerationWork(job.spec, precision, path, facts=facts | converted)
    for batch, prompt, depth in job.cases:
        fields, found = generation_work(path, batch, prompt, depth, job.new_tokens, past_shape(path))
        step = {name: found[name] for name in ("kv_bytes_per_step", "step_nodes", "step_activation_bytes")}
        counted.work[(batch, prompt, depth)] = fields | step | {"weight_bytes": sum(found["weight_bytes"].values())}
    yield counted


def _cached_past(spec: ModelSpec) -> Any:
    """A generate run's export with past key/values of the spec, from the cache (None: not exported yet); torch-free."""
    from harness.prepare.export import cached_export, export_dir, export_key
    from harness.prepare.weights import find_weights

    weights, _ = find_weights(spec)
    return cached_export(export_dir(f"{export_key(spec, weights)}-past"))


def generation_needs_torch(spec: ModelSpec) -> bool:
    """Whether counting the spec's generation graph exports it (its worker then forks from the torch fork server)."""
    return not spec.is_onnx_file and spec.has_past_export and not spec.is_seq2seq and _cached_past(spec) is None


def _generation_graph(spec: ModelSpec) -> tuple[Path, dict[str, Any]]:
    if spec.is_onnx_file:
        import onnx

        from harness.prepare.greedy import takes_past

        assert spec.local_path is not None
        graph = onnx.load(str(spec.local_path), load_external_data=False).graph
        if not takes_past([i.name for i in graph.input], [o.name for o in graph.output]):
            raise RuntimeError(f"{spec.local_path.name} has no past key/value inputs: it does not generate by steps")
        return spec.local_path, {"export": "the file itself"}
    if not spec.has_past_export or spec.is_seq2seq:
        raise RuntimeError(f"{spec.name} is not a decoder-only language model: its generation is not predicted")
    outcome = _cached_past(spec)
    if outcome is None:  # exported now, as a generate run would (which then finds it in the cache)
        from harness.prepare.export_past import export_with_past
        from harness.prepare.workload import build_module

        module, weights = build_module(spec)
        outcome = export_with_past(spec, module.model, weights)
    if outcome.path is None:
        raise RuntimeError(f"{spec.name} could not be exported with past key/values: {outcome.error}")
    return outcome.path, {"export": "cached" if outcome.cache_hit else f"exported now ({outcome.exporter})"}
