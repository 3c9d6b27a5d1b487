"""The second ONNX export of decoder-only language models, "with past", for the KV-cache loop.

One graph serves prefill and every decode step:
  inputs   input_ids [batch, sequence], attention_mask [batch, past + sequence],
           position_ids [batch, sequence], then past_key_i, past_value_i [batch, kv_heads, past,
           head_dim] for each layer i
  outputs  logits of the last position [batch, 1, vocab], then present_key_i, present_value_i
           [batch, kv_heads, past + sequence, head_dim]
Prefill feeds a past of length 0 (ONNX Runtime takes zero-size dimensions), so no second graph is
needed. It is cached next to the plain export, under the same key with a "-past" suffix.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.prepare.export import ExportOutcome, export_cached, export_dir, export_key
from harness.prepare.greedy import positions
from harness.prepare.specs import ModelSpec
from harness.prepare.weights import Weights

# Only decoder-only LM heads get this export (ModelSpec.has_past_export). Encoder-decoder models
# (T5, Whisper) would need an encoder graph and a decoder with cross-attention caches, LLaVA its
# vision tower in the prefill: they generate on torch only.


def past_names(prefix: str, layers: int) -> list[str]:
    """past_key_0, past_value_0, past_key_1, ... (or present_*): one key and one value per layer."""
    return [f"{prefix}_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]


class WithPast(torch.nn.Module):
    """Flat tensors in and out around a transformers DynamicCache: the form ONNX export needs.

    forward takes *args, like OutputSelector, so torch.export sees one input named `args`.
    """

    def __init__(self, model: Any, layers: int) -> None:
        super().__init__()
        self.model = model
        self.input_names = ["input_ids", "attention_mask", "position_ids", *past_names("past", layers)]
        self.output_names = ["logits", *past_names("present", layers)]

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        input_ids, attention_mask, position_ids, *past = args
        cache = DynamicCache(list(zip(past[0::2], past[1::2], strict=True)))
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # greedy decoding reads the last position only, as generate() computes
        )
        presents = output.past_key_values.layers
        return (output.logits, *(t for layer in presents for t in (layer.keys, layer.values)))


def prefill_case(model: Any, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """A prompt's inference case on this export (harness.prepare.prepared.inference_on_past): its inputs as the
    graph takes them, with a past of length 0 per layer, and torch's outputs for them in the graph's order (the
    last position's logits, then each layer's present key and value), as WithPast computes them from no cache."""
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    graph = {"input_ids": ids, "attention_mask": mask, "position_ids": positions(mask, ids.shape[1])}
    with torch.inference_mode():
        output = model(**{k: torch.from_numpy(v) for k, v in graph.items()}, use_cache=True, logits_to_keep=1)
    presents = [t.float().numpy() for layer in output.past_key_values.layers for t in (layer.keys, layer.values)]
    empty = {name: np.zeros((t.shape[0], t.shape[1], 0, t.shape[3]), dtype=np.float32)
             for name, t in zip(past_names("past", len(presents) // 2), presents, strict=True)}  # fmt: skip
    return graph | empty, [output.logits.float().numpy(), *presents]


def _example(model: Any) -> tuple[int, dict[str, np.ndarray]]:
    """(layers, example feeds): batch 2, a past of 3 tokens from a real prefill, 4 new tokens.

    Sizes of 2 and more keep torch.export from specialising any dimension to 0 or 1.
    """
    batch, past, new = 2, 3, 4
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.get_text_config().vocab_size, size=(batch, past + new), dtype=np.int64)
    with torch.inference_mode():
        cache = model(input_ids=torch.from_numpy(ids[:, :past]), use_cache=True).past_key_values
    flat = [t.numpy() for layer in cache.layers for t in (layer.keys, layer.values)]
    feeds = {
        "input_ids": ids[:, past:],
        "attention_mask": np.ones((batch, past + new), dtype=np.int64),
        "position_ids": np.tile(np.arange(past, past + new, dtype=np.int64), (batch, 1)),
    } | dict(zip(past_names("past", len(cache.layers)), flat, strict=True))
    return len(cache.layers), feeds


def _dynamic_shapes(module: WithPast) -> tuple[dict[str, tuple], dict[str, dict[int, str]]]:
    """Batch, new tokens, past and total (past + new) lengths are independent dims: torch.export
    cannot declare a sum of two dims, and it checks the relation itself while tracing."""
    dim = torch.export.Dim
    batch, sequence = dim("batch", min=1, max=4096), dim("sequence", min=1, max=8192)
    past, total = dim("past", min=0, max=8192), dim("total", min=1, max=16384)
    tokens = {0: batch, 1: sequence}
    shapes = [tokens, {0: batch, 1: total}, tokens] + [{0: batch, 2: past}] * (len(module.input_names) - 3)
    axes = {name: {i: d.__name__ for i, d in s.items()} for name, s in zip(module.input_names, shapes, strict=True)}
    axes |= {"logits": {0: "batch"}} | {name: {0: "batch", 2: "total"} for name in module.output_names[1:]}
    return {"args": tuple(shapes)}, axes


def export_with_past(spec: ModelSpec, model: Any, weights: Weights) -> ExportOutcome:
    """Export `model` (a transformers causal LM) with past key/values, or reuse the cached file."""
    layers, feeds = _example(model)
    module = WithPast(model, layers).eval()
    shapes, axes = _dynamic_shapes(module)
    return export_cached(export_dir(f"{export_key(spec, weights)}-past"), module, feeds, shapes, axes)
