"""Build what a spec describes: the torch module (pretrained or seeded random) and its inputs.

Inputs are numpy arrays generated from a seed derived from (model, batch, seq), so every
backend — native or browser — runs on exactly the same tensors.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.specs import ModelSpec

WEIGHT_SEED = 0
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")


@dataclass(frozen=True)
class Weights:
    kind: str  # "pretrained" | "random"
    source: str  # directory the weights came from, or the seed used
    fingerprint: str  # changes whenever the weights would change


def _weights_fingerprint(directory: Path) -> str:
    parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(directory.iterdir())]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def find_weights(spec: ModelSpec) -> tuple[Weights, Path | None]:
    """Pretrained weights from --model-path or the local HF cache when present, else random.

    Never downloads: the hub is consulted with local_files_only.
    """
    directory: Path | None = None
    if spec.local_path is not None and spec.local_path.is_dir():
        directory = spec.local_path
    elif spec.pretrained_id:
        from huggingface_hub import snapshot_download

        try:
            directory = Path(snapshot_download(spec.pretrained_id, local_files_only=True))
        except Exception:  # not in the cache: any hub error means "not available offline"
            directory = None
    if directory is not None and any((directory / name).exists() for name in WEIGHT_FILES):
        return Weights("pretrained", str(directory), _weights_fingerprint(directory)), directory
    return Weights("random", f"seed={WEIGHT_SEED}", f"seed={WEIGHT_SEED}"), directory


def build_module(spec: ModelSpec) -> tuple[Any, Weights]:
    """The spec's torch module in eval mode, wrapped to return its compared outputs as a tuple."""
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    weights, directory = find_weights(spec)
    model_class = getattr(transformers, spec.architecture)
    if weights.kind == "pretrained":
        model = model_class.from_pretrained(directory)
    else:
        config = (
            transformers.AutoConfig.from_pretrained(directory)
            if directory is not None
            else transformers.AutoConfig.for_model(spec.model_type, **spec.config)
        )
        torch.manual_seed(WEIGHT_SEED)
        model = model_class(config)
    return OutputSelector(model, input_names(spec), spec.outputs).eval(), weights


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


def _sub(config: Any, attribute: str) -> Any:
    """The text/vision sub-config of a multimodal config, or the config itself."""
    return getattr(config, attribute, None) or config


def input_names(spec: ModelSpec) -> list[str]:
    kind = spec.inputs.kind
    names = list(spec.inputs.text_inputs) if kind in ("text", "text+vision") else []
    if kind in ("vision", "text+vision"):
        names.append("pixel_values")
    if kind == "audio":
        names.append("input_values")
    return names


def max_sequence_length(config: Any) -> int | None:
    text = _sub(config, "text_config")
    return getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)


def case_seed(model: str, batch: int, seq: int | None) -> int:
    return int(hashlib.sha256(f"{model}|{batch}|{seq}".encode()).hexdigest()[:8], 16)


def make_inputs(spec: ModelSpec, config: Any, batch: int, seq: int | None) -> dict[str, np.ndarray]:
    """Deterministic inputs for one (batch, seq) case, named as the ONNX graph's inputs."""
    rng = np.random.default_rng(case_seed(spec.name, batch, seq))
    feeds: dict[str, np.ndarray] = {}
    kind = spec.inputs.kind
    if kind in ("text", "text+vision"):
        vocab = _sub(config, "text_config").vocab_size
        for name in spec.inputs.text_inputs:
            if name == "input_ids":
                feeds[name] = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
            elif name == "attention_mask":
                feeds[name] = np.ones((batch, seq), dtype=np.int64)
            else:
                feeds[name] = np.zeros((batch, seq), dtype=np.int64)
    if kind in ("vision", "text+vision"):
        vision = _sub(config, "vision_config")
        size = vision.image_size
        feeds["pixel_values"] = rng.standard_normal(
            (batch, getattr(vision, "num_channels", 3), size, size), dtype=np.float32
        )
    if kind == "audio":
        samples = int(spec.inputs.audio_seconds * spec.inputs.sampling_rate)
        feeds["input_values"] = rng.standard_normal((batch, samples), dtype=np.float32)
    return feeds


_ONNX_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


def make_signature_inputs(
    graph_inputs: list[tuple[str, list[Any], str]], model: str, batch: int, seq: int | None
) -> dict[str, np.ndarray]:
    """Inputs for an arbitrary ONNX file from its signature (name, shape, type).

    Fixed dimensions are kept; the first symbolic dimension is the batch, later ones the sequence.
    Integer inputs get small ids (valid for any embedding table); masks get ones.
    """
    rng = np.random.default_rng(case_seed(model, batch, seq))
    feeds = {}
    for name, shape, type_name in graph_inputs:
        dtype = _ONNX_DTYPES.get(type_name)
        if dtype is None:
            raise ValueError(f"input '{name}' has type {type_name}, which input generation does not cover")
        dims = []
        for position, dim in enumerate(shape):
            if isinstance(dim, int) and dim > 0:
                dims.append(dim)
            else:
                dims.append(batch if position == 0 else (seq or 1))
        if "mask" in name:
            feeds[name] = np.ones(dims, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            feeds[name] = rng.integers(0, 100, size=dims).astype(dtype)
        elif dtype is np.bool_:
            feeds[name] = np.ones(dims, dtype=dtype)
        else:
            feeds[name] = rng.standard_normal(dims).astype(dtype)
    return feeds
