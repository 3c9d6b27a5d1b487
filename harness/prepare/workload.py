"""Build what a spec describes: the torch module, pretrained or seeded random, offline.

Inputs live in harness/prepare/inputs.py (re-exported here for the modules that import them from here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from harness.prepare.inputs import case_seed, input_names, make_inputs, make_signature_inputs, max_sequence_length
from harness.prepare.specs import ModelSpec
from harness.prepare.weights import WEIGHT_SEED, Weights, find_weights

__all__ = [
    "OutputSelector",
    "Weights",
    "build_config",
    "build_module",
    "case_seed",
    "count_parameters",
    "find_weights",
    "input_names",
    "make_inputs",
    "make_signature_inputs",
    "max_sequence_length",
    "model_config",
]


def build_module(spec: ModelSpec) -> tuple[Any, Weights]:
    """The spec's torch module in eval mode, wrapped to return its compared outputs as a tuple."""
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    weights, directory = find_weights(spec)
    model_class = getattr(transformers, spec.architecture)
    if weights.kind == "pretrained":
        model = model_class.from_pretrained(directory)
    else:
        config = model_config(spec, directory)
        torch.manual_seed(WEIGHT_SEED)
        model = model_class(config)
    return OutputSelector(model, input_names(spec), spec.outputs).eval(), weights


def build_config(spec: ModelSpec) -> Any:
    """The spec's transformers config, built offline (nested sub-configs are dicts with a model_type)."""
    import transformers

    return transformers.AutoConfig.for_model(spec.model_type, **spec.config)


def model_config(spec: ModelSpec, directory: Path | None) -> Any:
    """The config the model is built with: its directory's config.json (--model-path, a pretrained
    model's files) when it has one, else the spec's."""
    import transformers

    return transformers.AutoConfig.from_pretrained(directory) if directory is not None else build_config(spec)


def count_parameters(spec: ModelSpec, config: Any = None) -> int:
    """Parameters of the spec's architecture built with `config` (default: the spec's own), counted on
    the meta device: no weights allocated."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # config-validation notices would drown a listing
    try:
        config = config if config is not None else build_config(spec)
        with torch.device("meta"):
            model = getattr(transformers, spec.architecture)(config)
    finally:
        transformers.logging.set_verbosity(verbosity)
    return sum(p.numel() for p in model.parameters())


class OutputSelector(torch.nn.Module):
    """Positional inputs in, the spec's named outputs out: the shape ONNX export needs."""

    def __init__(self, model: Any, names: list[str], outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = names
        self.output_names = outputs

    def forward(self, *args: Any) -> tuple[Any, ...]:
        result = self.model(**dict(zip(self.input_names, args, strict=True)))
        return tuple(getattr(result, name) for name in self.output_names)
