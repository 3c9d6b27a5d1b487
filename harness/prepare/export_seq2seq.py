"""The ONNX export of encoder–decoder models (T5, Whisper) for greedy generation, in Optimum's split
layout (the names transformers.js and Optimum read):

  encoder_model.onnx            input_ids + attention_mask (T5) or input_features (Whisper)
                                -> last_hidden_state
  decoder_model.onnx            input_ids [batch, seq], encoder_attention_mask (T5), encoder_hidden_states
                                -> logits, present.N.decoder.{key,value}, present.N.encoder.{key,value}
  decoder_with_past_model.onnx  input_ids [batch, 1], encoder_attention_mask (T5),
                                past_key_values.N.{decoder,encoder}.{key,value}
                                -> logits, present.N.decoder.{key,value}

The first decoder step computes the cross-attention keys and values from the encoder's output once; every
later step reads them as past and grows only the self-attention cache. Split rather than merged
(`decoder_model_merged.onnx`, one graph with an If on `use_cache_branch`): two plain graphs export with
torch.export as they are, and harness.prepare.seq2seq runs a merged file from a folder the same way.
Each graph is cached as the other exports are (harness.prepare.export.export_cached), under the model's
export key with a suffix, and the three are linked into one folder under their layout names, with the
model's config.json and both decoders merged as transformers.js ships them (decoder_model_merged.onnx,
harness.prepare.merged_decoder), which the same loop runs.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.prepare.export import ExportOutcome, export_cached, export_dir, export_key
from harness.prepare.merged_decoder import merge_decoders
from harness.prepare.specs import ModelSpec
from harness.prepare.workload import Weights

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
DECODER_PAST_FILE = "decoder_with_past_model.onnx"
MERGED_FILE = "decoder_model_merged.onnx"  # both decoders as one graph (harness.prepare.merged_decoder)
KINDS = ("decoder", "encoder")  # self-attention, then cross-attention: Optimum's order within a layer


def cache_names(prefix: str, layers: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """past_key_values.0.decoder.key, ... (or present.*): per layer, each kind's key and value."""
    return [f"{prefix}.{i}.{kind}.{part}" for i in range(layers) for kind in kinds for part in ("key", "value")]


def encoder_inputs(spec: ModelSpec) -> list[str]:
    """The encoder's inputs: Whisper's log-mel features, T5's tokens and mask."""
    return ["input_features"] if spec.inputs.kind == "audio-features" else ["input_ids", "attention_mask"]


def uses_encoder_mask(spec: ModelSpec) -> bool:
    return spec.inputs.kind != "audio-features"


class Encoder(torch.nn.Module):
    def __init__(self, model: Any, names: list[str]) -> None:
        super().__init__()
        self.encoder = model.get_encoder()
        self.input_names, self.output_names = names, ["last_hidden_state"]

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.encoder(**dict(zip(self.input_names, args, strict=True))).last_hidden_state,)


class Decoder(torch.nn.Module):
    """One decoder step around transformers' EncoderDecoderCache: flat tensors in and out. Without past it
    returns both caches (cross-attention computed here, once); with past only the self-attention one."""

    def __init__(self, model: Any, layers: int, masked: bool, with_past: bool) -> None:
        super().__init__()
        self.model, self.layers, self.masked, self.with_past = model, layers, masked, with_past
        mask = ["encoder_attention_mask"] if masked else []
        source = cache_names("past_key_values", layers) if with_past else ["encoder_hidden_states"]
        self.input_names = ["input_ids", *mask, *source]
        kinds = ("decoder",) if with_past else KINDS
        self.output_names = ["logits", *cache_names("present", layers, kinds)]

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache, EncoderDecoderCache

        ids, *rest = args
        mask = rest.pop(0) if self.masked else None
        if self.with_past:
            pairs = list(zip(rest[0::2], rest[1::2], strict=True))
            cache = EncoderDecoderCache(DynamicCache(pairs[0::2]), DynamicCache(pairs[1::2]))
            encoder_outputs = (torch.zeros(ids.shape[0], 1, 1),)  # unread: the cross-attention cache is filled
        else:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            encoder_outputs = (rest[0],)
        extra = {"attention_mask": mask} if self.masked else {}
        output = self.model(decoder_input_ids=ids, encoder_outputs=encoder_outputs, past_key_values=cache,
                            use_cache=True, **extra)  # fmt: skip
        present = output.past_key_values
        caches = [present.self_attention_cache] + ([] if self.with_past else [present.cross_attention_cache])
        flat = [t for i in range(self.layers) for c in caches for t in (c.layers[i].keys, c.layers[i].values)]
        return (output.logits, *flat)


@dataclass(frozen=True)
class Seq2SeqExport:
    folder: Path | None  # encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx
    outcomes: dict[str, ExportOutcome]  # per layout file
    error: str | None


def _examples(spec: ModelSpec, model: Any, feeds: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Each graph's example feeds from a real run: batch 2, the encoder's inputs as the case gives them,
    3 decoder tokens then 1 with a past of 3. Sizes of 2 and more keep torch.export from specialising."""
    names = encoder_inputs(spec)
    enc = {n: feeds[n][:2] for n in names}
    vocab = model.config.vocab_size
    ids = np.random.default_rng(0).integers(0, vocab, size=(2, 4), dtype=np.int64)
    masked = uses_encoder_mask(spec)
    with torch.inference_mode():
        hidden = model.get_encoder()(**{n: torch.from_numpy(v) for n, v in enc.items()}).last_hidden_state
        first = Decoder(model, _layers(model), masked, False).eval()
        mask = [torch.from_numpy(enc["attention_mask"])] if masked else []
        _, *presents = first(torch.from_numpy(ids[:, :3]), *mask, hidden)
    decoder = {"input_ids": ids[:, :3]} | ({"encoder_attention_mask": enc["attention_mask"]} if masked else {})
    past = decoder | {"input_ids": ids[:, 3:]}
    past |= dict(zip(cache_names("past_key_values", _layers(model)), (p.numpy() for p in presents), strict=True))
    return {ENCODER_FILE: enc, DECODER_FILE: decoder | {"encoder_hidden_states": hidden.numpy()},
            DECODER_PAST_FILE: past}  # fmt: skip


def _layers(model: Any) -> int:
    config = model.config
    return int(getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None)
               or config.num_layers)  # fmt: skip


def _shapes(module: Any, feeds: dict[str, np.ndarray]) -> tuple[dict[str, tuple], dict[str, dict[int, str]]]:
    encoder = isinstance(module, Encoder)
    """Dynamic dims by name: batch everywhere; the encoder's length on its tokens, mask and hidden states
    (Whisper's 3000 frames are fixed: its encoder requires them); decoder tokens; the past's length."""
    dim = torch.export.Dim
    batch, encoded = dim("batch", min=1, max=4096), dim("encoder_sequence", min=2, max=8192)
    tokens, past = dim("decoder_sequence", min=1, max=8192), dim("past_sequence", min=1, max=8192)
    shapes = []
    for name in module.input_names:
        if name in ("attention_mask", "encoder_attention_mask") or (name == "input_ids" and encoder):
            shapes.append({0: batch, 1: encoded})
        elif name == "input_ids":
            shapes.append({0: batch, 1: tokens} if feeds[name].shape[1] > 1 else {0: batch})
        elif name == "encoder_hidden_states":
            shapes.append({0: batch, 1: encoded})
        elif ".decoder." in name:
            shapes.append({0: batch, 2: past})
        elif ".encoder." in name:
            shapes.append({0: batch, 2: encoded})
        else:  # input_features
            shapes.append({0: batch})
    axes = {n: {i: d.__name__ for i, d in s.items()} for n, s in zip(module.input_names, shapes, strict=True)}
    return {"args": tuple(shapes)}, axes | {n: {0: "batch"} for n in module.output_names}


def export_seq2seq(spec: ModelSpec, model: Any, weights: Weights, feeds: dict[str, np.ndarray]) -> Seq2SeqExport:
    """Export `model` (a transformers encoder–decoder) as the three graphs, or reuse the cached files;
    `feeds`: one case's inputs at batch >= 2 (the encoder's example)."""
    key = export_key(spec, weights)
    examples = _examples(spec, model, feeds)
    layers, masked = _layers(model), uses_encoder_mask(spec)
    modules = {
        ENCODER_FILE: Encoder(model, encoder_inputs(spec)),
        DECODER_FILE: Decoder(model, layers, masked, False),
        DECODER_PAST_FILE: Decoder(model, layers, masked, True),
    }
    outcomes = {}
    for name, module in modules.items():
        shapes, axes = _shapes(module, examples[name])
        suffix = name.removesuffix(".onnx").replace("_", "-")
        outcomes[name] = export_cached(export_dir(f"{key}-{suffix}"), module.eval(), examples[name], shapes, axes)
        if outcomes[name].path is None:
            return Seq2SeqExport(None, outcomes, f"{name}: {outcomes[name].error}")
    folder = _linked(export_dir(f"{key}-seq2seq"), outcomes, model.config.to_json_string(use_diff=False))
    return Seq2SeqExport(folder, outcomes, None)


def _linked(folder: Path, outcomes: dict[str, ExportOutcome], config: str) -> Path:
    """The three cached files under their layout names in one folder (hard links where the file system
    has them) with the model's config.json (its decoder_start_token_id starts the loop), built beside it and
    renamed into place."""
    if all((folder / name).exists() for name in [*outcomes, "config.json", MERGED_FILE]):
        return folder
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    try:
        for name, outcome in outcomes.items():
            assert outcome.path is not None
            try:
                os.link(outcome.path, staging / name)
            except OSError:
                shutil.copyfile(outcome.path, staging / name)
        (staging / "config.json").write_text(config)
        merge_decoders(staging / DECODER_FILE, staging / DECODER_PAST_FILE, staging / MERGED_FILE)
        os.replace(staging, folder)
    except OSError:  # another process linked it first
        pass
    finally:  # renamed into place, failed or interrupted: no staging folder is left behind
        shutil.rmtree(staging, ignore_errors=True)
    return folder
