"""Deterministic model inputs, per input kind, named as the module's forward() arguments.

Every array comes from a numpy generator seeded with (model, batch, seq) (Whisper's log-mel features from speech:
harness.prepare.audio), so every backend —
native or browser — runs on exactly the same tensors. Shapes follow what each model's forward
(and its processor or feature extractor) produces; `seq` is always the number of text tokens.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from harness.prepare.prompts import Vocabulary, random_prompt, tokenizer_folder, vocabulary
from harness.prepare.specs import ModelSpec

# The non-text inputs each kind adds after the spec's text_inputs (then its extra_inputs).
KIND_INPUTS = {
    "text": (),
    "vision": ("pixel_values",),
    "audio": ("input_values",),
    "text+vision": ("pixel_values",),
    "seq2seq": ("decoder_input_ids",),
    "audio-features": ("input_features",),
    "video+text": ("pixel_values",),
    "image+text-generation": ("pixel_values",),
}


def input_names(spec: ModelSpec) -> list[str]:
    names = () if spec.inputs.kind in ("vision", "audio") else spec.inputs.text_inputs
    return [*names, *KIND_INPUTS[spec.inputs.kind], *spec.inputs.extra_inputs]


def sub_config(config: Any, attribute: str) -> Any:
    """The text/vision/audio sub-config of a composite config, or the config itself."""
    return getattr(config, attribute, None) or config


def case_seed(model: str, batch: int, seq: int | None) -> int:
    return int(hashlib.sha256(f"{model}|{batch}|{seq}".encode()).hexdigest()[:8], 16)


def max_sequence_length(config: Any) -> int | None:
    """The most text tokens the model takes, or None when positions are unbounded (T5)."""
    text = sub_config(config, "text_config")
    limit = (
        getattr(text, "max_position_embeddings", None)
        or getattr(text, "n_positions", None)
        or getattr(text, "max_target_positions", None)  # Whisper's decoder
    )
    if limit and getattr(text, "model_type", None) in ROBERTA_POSITIONS:
        limit -= text.pad_token_id + 1  # position ids start after the padding id
    return limit


# Text models whose position ids start at pad_token_id + 1 (create_position_ids_from_input_ids).
ROBERTA_POSITIONS = ("roberta", "xlm-roberta", "camembert", "clap_text_model")


def image_token_count(config: Any, aspect: tuple[int, int] = (1, 1)) -> int:
    """How many image placeholder tokens LLaVA (-NeXT) expects in input_ids for one image.

    LLaVA: one per vision patch (plus CLS with the "full" strategy). LLaVA-NeXT adds the any-res
    crops, unpadded to the image's aspect, plus one newline token per row, as its processor counts.
    """
    vision = config.vision_config
    side = vision.image_size // vision.patch_size
    base = side * side + (1 if config.vision_feature_select_strategy == "full" else 0)
    if getattr(config, "image_grid_pinpoints", None) is None:
        return base
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

    height, width = (vision.image_size * a for a in aspect)
    best_height, best_width = select_best_resolution([height, width], config.image_grid_pinpoints)
    scale_h, scale_w = best_height // vision.image_size, best_width // vision.image_size
    # _get_unpadded_features does not use the processor's state; reuse it rather than copy it.
    unpadded, newlines = LlavaNextProcessor._get_unpadded_features(None, height, width, side, side, scale_h, scale_w)
    return base + unpadded + newlines


def make_inputs(spec: ModelSpec, config: Any, batch: int, seq: int | None) -> dict[str, np.ndarray]:
    """Deterministic inputs for one (batch, seq) case, named as the ONNX graph's inputs."""
    rng = np.random.default_rng(case_seed(spec.name, batch, seq))
    return {name: _generate(name, spec, config, rng, batch, seq) for name in input_names(spec)}


def _generate(
    name: str, spec: ModelSpec, config: Any, rng: np.random.Generator, batch: int, seq: int | None
) -> np.ndarray:
    kind = spec.inputs.kind
    if name in ("input_ids", "decoder_input_ids"):
        if kind == "image+text-generation":
            return _ids_with_image_tokens(spec, config, rng, batch, seq or 1)
        if name == "input_ids" and spec.prompt is not None:
            return prompt_rows(spec.prompt, batch)
        if name == "input_ids":  # the model's prompt, whatever folder it came in (harness.prepare.prompts)
            rows = sub_config(config, "text_config").vocab_size
            return random_prompt(vocabulary(tokenizer_folder(spec.local_path), rows), batch, seq or 1)
        return rng.integers(0, sub_config(config, "text_config").vocab_size, size=(batch, seq), dtype=np.int64)
    if name in ("attention_mask", "token_type_ids"):
        length = (seq or 1) + (image_token_count(config, spec.inputs.image_aspect) if kind.startswith("image") else 0)
        return (np.ones if name == "attention_mask" else np.zeros)((batch, length), dtype=np.int64)
    if name == "pixel_values":
        return _pixel_values(spec, config, rng, batch)
    if name == "input_values":
        samples = int(spec.inputs.audio_seconds * spec.inputs.sampling_rate)
        return rng.standard_normal((batch, samples), dtype=np.float32)
    if name == "input_features":
        return _log_mel_features(spec, config, rng, batch)
    if name == "is_longer":
        return np.zeros((batch, 1), dtype=np.bool_)  # clips no longer than the 10 s window
    if name == "image_sizes":
        size = config.vision_config.image_size
        return np.tile(np.array([[size * a for a in spec.inputs.image_aspect]], dtype=np.int64), (batch, 1))
    raise ValueError(f"{spec.name}: no generator for input '{name}' (kind {kind})")


def _pixel_values(spec: ModelSpec, config: Any, rng: np.random.Generator, batch: int) -> np.ndarray:
    vision = sub_config(config, "vision_config")
    size = spec.inputs.image_size or vision.image_size
    image = (getattr(vision, "num_channels", 3), size, size)
    if spec.inputs.kind == "video+text":
        return rng.standard_normal((batch, vision.num_frames, *image), dtype=np.float32)
    if getattr(config, "image_grid_pinpoints", None) is not None:
        # LLaVA-NeXT: the base view plus one crop per grid cell of the image's best resolution
        patches = 1 + spec.inputs.image_aspect[0] * spec.inputs.image_aspect[1]
        return rng.standard_normal((batch, patches, *image), dtype=np.float32)
    return rng.standard_normal((batch, *image), dtype=np.float32)


def _log_mel_features(spec: ModelSpec, config: Any, rng: np.random.Generator, batch: int) -> np.ndarray:
    audio = sub_config(config, "audio_config")
    if hasattr(audio, "max_source_positions"):
        # Whisper: [batch, mel bins, frames]; its encoder requires exactly 2 × max_source_positions frames (30 s),
        # what WhisperFeatureExtractor pads every clip to: the window of speech (--audio or espeak-ng's passage)
        from harness.prepare.audio import speech_features, speech_input

        shape = (batch, audio.num_mel_bins, 2 * audio.max_source_positions)
        return speech_features(speech_input(spec.audio), shape)
    # CLAP: [batch, 1, frames, mel bins], one channel without fusion (ClapFeatureExtractor, rand_trunc)
    frames = spec.inputs.audio_frames or 1001
    return rng.standard_normal((batch, 1, frames, audio.num_mel_bins), dtype=np.float32)


def _ids_with_image_tokens(spec: ModelSpec, config: Any, rng: np.random.Generator, batch: int, seq: int) -> np.ndarray:
    """A first text token, the image's placeholder tokens, then the rest of the text (as the
    LLaVA chat template places them). Text ids stay below the image token id, which ends the
    text vocabulary in the LLaVA checkpoints."""
    image_token = config.image_token_id
    text = rng.integers(0, min(image_token, config.text_config.vocab_size), size=(batch, seq), dtype=np.int64)
    count = image_token_count(config, spec.inputs.image_aspect)
    image = np.full((batch, count), image_token, dtype=np.int64)
    return np.concatenate([text[:, :1], image, text[:, 1:]], axis=1)


_ONNX_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


def make_signature_inputs(
    graph_inputs: list[tuple[str, list[Any], str]],
    model: str,
    batch: int,
    seq: int | None,
    tables: dict[str, int] | None = None,
    vocab: Vocabulary | None = None,
    prompt: tuple[int, ...] | None = None,
) -> dict[str, np.ndarray]:
    """Inputs for an arbitrary ONNX file from its signature (name, shape, type).

    Fixed dimensions are kept; the first symbolic dimension is the batch, later ones the sequence. An integer
    input stays inside the table it indexes (`tables`: harness.prepare.graph_tables.index_tables): token_type_ids
    zeros, input_ids the model's prompt (`prompt`, else drawn from `vocab`: harness.prepare.prompts), others
    drawn below the table's rows (below 100 where the graph shows no table); masks get ones.
    """
    rng = np.random.default_rng(case_seed(model, batch, seq))
    tables = tables or {}
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
            feeds[name] = _integer_input(name, dims, tables.get(name), vocab, prompt, rng).astype(dtype)
        elif dtype is np.bool_:
            feeds[name] = np.ones(dims, dtype=dtype)
        else:
            feeds[name] = rng.standard_normal(dims).astype(dtype)
    return feeds


UNKNOWN_TABLE_ROWS = 100  # an integer input no table of the graph bounds: small ids, valid for most


def _integer_input(name: str, dims: list[int], rows: int | None, vocab: Vocabulary | None,
                   prompt: tuple[int, ...] | None, rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    if name == "token_type_ids":  # one segment: what a tokenizer gives a single text
        return np.zeros(dims, dtype=np.int64)
    if name == "input_ids" and len(dims) == 2 and prompt is not None:
        return prompt_rows(prompt, dims[0])
    if name == "input_ids" and len(dims) == 2 and (vocab is not None or rows is not None):
        return random_prompt(vocab or Vocabulary(rows or 0), dims[0], dims[1])
    return rng.integers(0, rows or UNKNOWN_TABLE_ROWS, size=dims)


def prompt_rows(prompt: tuple[int, ...], batch: int) -> np.ndarray:
    """A given prompt as input_ids: the same ids in every batch row."""
    return np.tile(np.asarray(prompt, dtype=np.int64), (batch, 1))


def onnx_file_signature(path: Path) -> list[tuple[str, list[Any], str]]:
    """(name, shape, ORT type name) of a file's graph inputs, read from the proto: for a file ONNX
    Runtime cannot load, whose signature ORT therefore cannot report."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    signature = []
    for value in graph.input:
        if value.name in initializers:  # older IRs list weights as inputs too
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]
        signature.append((value.name, shape, f"tensor({onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})"))
    return signature
