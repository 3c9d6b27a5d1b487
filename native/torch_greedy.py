"""torch's greedy KV-cache loop over a transformers module: the same steps as native ONNX Runtime's
(harness.prepare.greedy for a decoder-only model, harness.prepare.seq2seq for an encoder–decoder), so a torch row
counts the same tokens and can be checked against ORT's teacher-forced on them (harness.core.generation defines a
generated token once).

Decoder-only: the prompt as one prefill (position ids counted over the unpadded tokens, as ORT's loop and
transformers' generate() count them), then one forward per new token feeding back the module's own cache. At a depth
the cache is first filled with the prompt's ids repeated (harness.prepare.greedy.filler, ORT's and the page's filler),
outside the timed region; the filled cache is kept for the next generation of the same prompt and depth and copied
before each (a forward appends to its cache). Encoder–decoder: the encoder once, then the decoder from config.json's
decoder_start_token_id (else pad_token_id, as ORT's loop), every later token the argmax: nothing forced or suppressed.
Imported in a torch worker only (native/torch_session.py).
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from harness.core.generation import STEP_TOP_K
from harness.core.records import UnsupportedError
from harness.prepare.greedy import filler, positions

ENCODER_INPUTS = ("input_ids", "attention_mask", "input_features", "pixel_values")  # what an encoder may take


@dataclass
class Loop:
    """One generation's callbacks and what it keeps: stamp() as each step's logits are ready (the device
    synchronised), begin() once the cache is filled (what is timed starts there); `top`: each step's top-k logits
    where asked (the case's first generation)."""

    stamp: Callable[[], None]
    begin: Callable[[], None]
    synchronize: Callable[[], None]
    eos: tuple[int, ...] = ()
    want_top: bool = False
    tokens: list[torch.Tensor] = field(default_factory=list)
    top: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    encoder_ms: float | None = None
    ended: torch.Tensor | None = None  # each row: made an eos id yet

    def chose(self, logits: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The step's tokens [batch, 1] from its last position's logits, and whether every row has made an `eos`
        id by now (--stop-at-eos)."""
        self.synchronize()
        self.stamp()
        last = logits[:, -1]
        token = last.argmax(dim=-1, keepdim=True)
        self.tokens.append(token)
        if self.want_top:
            values, ids = last.float().topk(min(STEP_TOP_K, last.shape[-1]), dim=-1)
            self.top.append((ids, values))
        if not self.eos:
            return token, False
        hit = torch.isin(token[:, 0], torch.tensor(self.eos, device=token.device))
        self.ended = hit if self.ended is None else self.ended | hit
        return token, bool(self.ended.all())

    def result(self) -> np.ndarray:
        return torch.cat(self.tokens, dim=1).cpu().numpy().astype(np.int64)

    def step_top(self) -> dict[str, Any] | None:
        """The top-k per step as the row's details carry it: ids and values [batch, steps, k]."""
        if not self.top:
            return None
        ids = torch.stack([i for i, _ in self.top], dim=1).cpu().numpy()
        values = torch.stack([v for _, v in self.top], dim=1).cpu().numpy().astype(np.float64)
        return {"ids": ids.tolist(), "values": np.where(np.isfinite(values), values, np.nan).tolist()}


def _keeps_last(model: Any) -> dict[str, Any]:
    """logits_to_keep=1 where the module takes it: the prefill's last position alone, as ORT's export computes."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


class DecoderGreedy:
    """The decoder-only loop, with the filled cache of the latest prompt and depth kept between generations."""

    def __init__(self, model: Any, device: torch.device) -> None:
        self.model, self.device = model, device
        self.filled: tuple[bytes, Any, np.ndarray] | None = None  # (key, cache, mask) of the latest fill

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _fill(self, ids: np.ndarray, mask: np.ndarray, depth: int) -> tuple[Any, np.ndarray]:
        """A copy of the cache filled to `depth` (made once per prompt and depth, untimed), and the mask after it."""
        key = np.asarray([depth], np.int64).tobytes() + ids.tobytes() + mask.tobytes()
        if self.filled is None or self.filled[0] != key:
            fill = filler(ids, depth)
            ones = np.ones_like(fill)
            feeds = {"input_ids": fill, "attention_mask": ones, "position_ids": positions(ones, depth)}
            out = self.model(
                **{k: self._tensor(v) for k, v in feeds.items()}, use_cache=True, **_keeps_last(self.model)
            )
            self.filled = (key, out.past_key_values, np.concatenate([ones, mask], axis=1))
        return copy.deepcopy(self.filled[1]), self.filled[2]

    def run(self, inputs: dict[str, torch.Tensor], new_tokens: int, loop: Loop, depth: int = 0) -> None:
        """One generation of the prepared prompt (its tensors on the device; other inputs, a VLM's pixel values,
        fed to the prefill alone)."""
        ids = inputs["input_ids"].cpu().numpy().astype(np.int64)
        mask = (
            inputs["attention_mask"].cpu().numpy().astype(np.int64) if "attention_mask" in inputs else np.ones_like(ids)
        )
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        cache = None
        if depth:
            if extra:
                raise UnsupportedError(f"--depths {depth}: the KV cache is filled with the prompt's ids alone; this "
                                       f"model's prompt carries {', '.join(extra)} too")  # fmt: skip
            cache, mask = self._fill(ids, mask, depth)
        feeds = {"input_ids": inputs["input_ids"], "position_ids": self._tensor(positions(mask, ids.shape[1]))} | extra
        loop.begin()
        for step in range(new_tokens):
            out = self.model(**feeds, attention_mask=self._tensor(mask), past_key_values=cache, use_cache=True,
                             **(_keeps_last(self.model) if step == 0 else {}))  # fmt: skip
            token, ended = loop.chose(out.logits)
            if ended:
                break
            cache = out.past_key_values
            mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
            feeds = {"input_ids": token, "position_ids": self._tensor(positions(mask, 1))}


def start_id(model: Any) -> int:
    """An encoder–decoder's first decoder token: config.json's decoder_start_token_id, else its pad_token_id (T5),
    as ORT's loop reads it (harness.prepare.seq2seq.start_token)."""
    config = model.config
    value = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.pad_token_id
    if not isinstance(value, int):
        raise UnsupportedError("the model's config has no decoder_start_token_id or pad_token_id to start from")
    return value


def seq2seq_run(model: Any, inputs: dict[str, torch.Tensor], new_tokens: int, loop: Loop) -> None:
    """The encoder once (its run timed into loop.encoder_ms, the device synchronised), then the decoder from the
    start token, each step feeding back both caches (the cross-attention ones computed at the first)."""
    encoder = model.get_encoder()
    taken = inspect.signature(encoder.forward).parameters
    loop.begin()
    started = time.perf_counter_ns()
    hidden = encoder(**{k: v for k, v in inputs.items() if k in ENCODER_INPUTS and k in taken})
    loop.synchronize()
    loop.encoder_ms = (time.perf_counter_ns() - started) / 1e6
    batch = next(iter(inputs.values())).shape[0]
    device = next(iter(inputs.values())).device
    token = torch.full((batch, 1), start_id(model), dtype=torch.long, device=device)
    mask = {"attention_mask": inputs["attention_mask"]} if "attention_mask" in inputs else {}
    cache = None
    for _ in range(new_tokens):
        out = model(encoder_outputs=hidden, decoder_input_ids=token, past_key_values=cache, use_cache=True, **mask)
        token, ended = loop.chose(out.logits)
        if ended:
            break
        cache = out.past_key_values
