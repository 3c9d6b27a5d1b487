"""A model's graph, counted and not run: its ONNX export (from the cache, or exported now) and the
work per op class at each (batch, seq), for predicting a model that was never measured.

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
    skipped: dict[CaseShape, str] = field(default_factory=dict)  # cases the model cannot take, and why
    facts: dict[str, Any] = field(default_factory=dict)  # how the export was had and the shapes inferred


def count_graph(job: PrepareJob) -> Iterator[GraphWork]:
    """Worker entry point (a generator, as harness.run.isolation expects)."""
    from harness.core.graph_cost import graph_cost

    spec = job.spec
    path, parameters, shapes, skipped, facts = _onnx_file(job) if spec.is_onnx_file else _exported(job)
    counted = GraphWork(spec, parameters, path, skipped=skipped, facts=facts)
    for shape, inputs in shapes.items():
        cost = graph_cost(path, inputs)
        counted.work[shape] = cost.work_by_class()
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
