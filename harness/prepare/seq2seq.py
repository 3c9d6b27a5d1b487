"""Greedy encoder–decoder generation on ONNX graphs (T5, Whisper), written once: native ONNX Runtime's timed
loop (harness.native.onnxruntime_backend) and the reference tokens the browser's are checked against.

The graphs are Optimum's layout in one folder (harness.prepare.export_seq2seq): encoder_model.onnx, and
either decoder_model.onnx + decoder_with_past_model.onnx or decoder_model_merged.onnx (its use_cache_branch
picks the step). The encoder runs once; the first decoder step reads its output and returns both caches
(self-attention, and cross-attention computed once); every later step feeds back the self-attention presents
and the first step's cross-attention ones. The decoder starts from config.json's decoder_start_token_id;
exactly new_tokens tokens, EOS ignored. web/page/seq2seq.mjs runs the same steps in the page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.precision import GRAPHS, graph_label, graph_precision
from harness.core.records import UnsupportedError
from harness.prepare.folder_checks import FolderError, read_config
from harness.prepare.folder_layouts import DECODER_MERGED, DECODER_SPLIT, encoder_beside, split_name
from harness.prepare.folders import folder_root
from harness.prepare.greedy import PAST_DTYPES, Greedy

# The inputs the loop fills besides the caches; any other one is refused by name.
FILLED = ("input_ids", "attention_mask", "input_features", "encoder_attention_mask", "encoder_hidden_states",
          "use_cache_branch")  # fmt: skip


@dataclass(frozen=True)
class Seq2SeqFiles:
    """One encoder–decoder model's graphs: the encoder, the first decoder step's and the later steps' (the
    same file for a merged decoder)."""

    encoder: Path
    decoder: Path
    decoder_past: Path
    # the layout's own first decoder step (beside its config.json, whose start token begins the decoder) where
    # these are conversions of its graphs cached elsewhere; None: `decoder` is it
    origin: Path | None = field(default=None, compare=False)

    @property
    def merged(self) -> bool:
        return self.decoder == self.decoder_past

    def names(self) -> dict[str, str]:
        """Each graph's file as a row names it (graph_name): the encoder, the decoder and, split, the later steps'."""
        found = {"encoder": graph_name(self.encoder), "decoder": graph_name(self.decoder)}
        return found if self.merged else found | {"decoder_past": graph_name(self.decoder_past)}

    def label(self) -> str:
        """The files as one line: 'onnx/encoder_model.onnx + onnx/decoder_model_merged_q4.onnx'."""
        return " + ".join(self.names().values())


def graph_name(graph: Path) -> str:
    """A graph as a row names it: its folder and file name (a transformers.js folder's onnx/model_q4.onnx; the
    cache's folder says the export and precision)."""
    return f"{graph.parent.name}/{graph.name}"


def seq2seq_files(decoder: Path) -> Seq2SeqFiles | None:
    """The layout `decoder` belongs to (its first decoder step's file, any transformers.js suffix: _q4, _fp16, …),
    with the encoder beside it (at the decoder's suffix, else the layout's: harness.prepare.folder_layouts), or
    None: not such a layout."""
    stem, suffix = split_name(decoder)
    encoder = encoder_beside(decoder)
    if encoder is None or not decoder.is_file():
        return None
    if stem == DECODER_MERGED:
        return Seq2SeqFiles(encoder, decoder, decoder)
    past = decoder.parent / f"{DECODER_SPLIT[1]}{suffix}.onnx"
    if stem == DECODER_SPLIT[0] and past.is_file():
        return Seq2SeqFiles(encoder, decoder, past)
    return None


@cache
def start_token(graph: Path) -> int:
    """The decoder's first token: the folder's config.json's decoder_start_token_id, else its pad_token_id as
    transformers' generate() takes for T5 (read as data: bounded, typed)."""
    folder = folder_root(graph)
    try:
        if folder is None:
            raise FolderError(f"no config.json beside {graph.name} or in its parent folder")
        config = read_config(folder, "config.json")
        value = config.get("decoder_start_token_id")
        value = config.get("pad_token_id") if value is None else value  # T5's configs: it starts from pad
    except FolderError as exc:
        raise UnsupportedError(f"encoder–decoder generation needs config.json beside the graphs: {exc}") from exc
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise UnsupportedError(
            "config.json's decoder_start_token_id (or pad_token_id) is not a token id (a non-negative integer)"
        )
    return value


WHISPER_HOP_S = 0.01  # Whisper's log-mel frames: a 160-sample hop at 16 kHz (3000 frames: its 30 s window)


def audio_seconds(feeds: dict[str, np.ndarray]) -> float | None:
    """The seconds of audio a speech case's log-mel features cover (None: not speech)."""
    features = feeds.get("input_features")
    return None if features is None else features.shape[-1] * WHISPER_HOP_S


def _names(session: Any) -> list[str]:
    return [i.name for i in session.get_inputs()]


def _empty(meta: Any, batch: int) -> np.ndarray:
    """An empty past for a merged decoder's no-cache branch: [batch, heads, 0, head size] from the graph."""
    heads, size = meta.shape[1], meta.shape[3]
    if not (isinstance(heads, int) and isinstance(size, int)) or meta.type not in PAST_DTYPES:
        raise UnsupportedError(f"past input '{meta.name}' needs fixed heads and head size and a float type "
                               f"(got {meta.type} {meta.shape})")  # fmt: skip
    return np.zeros((batch, heads, 0, size), dtype=PAST_DTYPES[meta.type])


def _past(present: str) -> str:
    return "past_key_values." + present.removeprefix("present.")


class Seq2SeqGreedy:
    """Sessions on a layout's graphs and the loop over them. stamp() runs as each decoder step's logits are on
    the host (run() returns host arrays); encoded() as the encoder's output is."""

    def __init__(self, sessions: tuple[Any, Any, Any], start: int) -> None:
        self.encoder, self.decoder, self.decoder_past = sessions
        self.start = start
        for session in sessions:
            for name in _names(session):
                if name not in FILLED and not name.startswith("past_key_values."):
                    raise UnsupportedError(f"the graph's input '{name}' is not one encoder–decoder generation fills "
                                           f"({', '.join(FILLED)}, past_key_values.*)")  # fmt: skip

    def encode(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.encoder.run(None, {n: inputs[n] for n in _names(self.encoder)})[0]

    def forced(self, inputs: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
        """Teacher forcing: each step's last-position logits [batch, N, vocab] (float32) when fed `tokens`
        [batch, N] (another side's generation) instead of its own choices; the prefix up to a first difference
        is greedy's own."""
        kept: list[np.ndarray] = []
        self.generate(inputs, tokens.shape[1], forced=tokens.astype(np.int64), logits=kept)
        return np.concatenate(kept, axis=1)

    def generate(self, inputs: dict[str, np.ndarray], new_tokens: int, stamp: Callable[[], None] = lambda: None,
                 encoded: Callable[[], None] = lambda: None, keep: bool = False, forced: np.ndarray | None = None,
                 logits: list[np.ndarray] | None = None) -> Greedy:  # fmt: skip
        hidden = self.encode(inputs)
        encoded()
        batch = hidden.shape[0]
        common = {"encoder_hidden_states": hidden, "encoder_attention_mask": inputs.get("attention_mask")}
        token = np.full((batch, 1), self.start, dtype=np.int64)
        session, feeds = self.decoder, self._first(token, common, batch)
        cross: dict[str, np.ndarray] = {}
        tokens, margins, prefill = [], [], None
        for step in range(new_tokens):
            names = [o.name for o in session.get_outputs()]
            out, *presents = session.run(names, feeds)
            stamp()
            last = out[:, -1]
            token = (
                last.argmax(axis=-1, keepdims=True).astype(np.int64) if forced is None else forced[:, step : step + 1]
            )
            if logits is not None:
                logits.append(np.asarray(out[:, -1:], dtype=np.float32))
            tokens.append(token)
            if keep:
                prefill = out[:, -1:].astype(np.float32) if prefill is None else prefill
                top2 = np.sort(last.astype(np.float64), axis=-1)[:, -2:]
                margins.append(top2[:, 1] - top2[:, 0])
            cache = {_past(n): v for n, v in zip(names[1:], presents, strict=True)}
            cross = cross or {n: v for n, v in cache.items() if ".encoder." in n}  # the first step's, kept
            session = self.decoder_past
            step = common | {"input_ids": token, "use_cache_branch": np.array([True])} | cache | cross
            feeds = {n: step[n] for n in _names(session)}
        kept = np.stack(margins, axis=1) if keep else None
        return Greedy(np.concatenate(tokens, axis=1), kept, prefill)

    def _first(self, token: np.ndarray, common: dict[str, Any], batch: int) -> dict[str, np.ndarray]:
        """The first step's feeds: the start token, the encoder's output and, for a merged decoder, its
        no-cache branch with empty pasts."""
        feeds = common | {"input_ids": token, "use_cache_branch": np.array([False])}
        for meta in self.decoder.get_inputs():
            if meta.name.startswith("past_key_values."):
                feeds[meta.name] = _empty(meta, batch)
        return {n: feeds[n] for n in _names(self.decoder)}


def precision_files(decoder: Path, precision: str) -> tuple[Seq2SeqFiles, str, dict[str, Any]]:
    """Each graph of the layout `decoder` belongs to at its precision (a plain precision every graph's; a
    per-graph one, encoder=fp32,decoder=q4, each its own): a folder's own file or the harness's conversion of
    that graph (harness.prepare.variants); the precision they ran in (a per-graph label where they differ) and
    the facts: the decoder's conversion, each graph's file and precision (graph_files, graph_precision)."""
    from harness.prepare.variants import model_for_precision

    layout = seq2seq_files(decoder)
    if layout is None:
        raise UnsupportedError(f"{decoder.name} has no encoder_model.onnx and later-step decoder beside it")
    asked = {graph: graph_precision(precision, graph) for graph in GRAPHS}
    encoder, encoder_ran, _ = model_for_precision(layout.encoder, asked["encoder"])
    first, ran, facts = model_for_precision(layout.decoder, asked["decoder"])
    later = first if layout.merged else model_for_precision(layout.decoder_past, asked["decoder"])[0]
    files, ran_by_graph = Seq2SeqFiles(encoder, first, later, decoder), {"encoder": encoder_ran, "decoder": ran}
    facts = facts | {"graph_files": files.names(), "graph_precision": ran_by_graph}
    return files, graph_label(ran_by_graph), facts


def load_seq2seq(files: Seq2SeqFiles, open_session: Callable[[Path], Any]) -> Seq2SeqGreedy:
    """The loop over a layout's graphs, each opened by open_session (a merged decoder once)."""
    encoder, decoder = open_session(files.encoder), open_session(files.decoder)
    past = decoder if files.merged else open_session(files.decoder_past)
    return Seq2SeqGreedy((encoder, decoder, past), start_token(files.origin or files.decoder))


def cpu_session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def forced_seq2seq(files: Seq2SeqFiles, inputs: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """Native ORT CPU's logits at each step on these graphs, teacher-forced on `tokens` (Seq2SeqGreedy.forced)."""
    return load_seq2seq(files, cpu_session).forced(inputs, tokens)


def reference_seq2seq(files: Seq2SeqFiles, inputs: dict[str, np.ndarray], new_tokens: int) -> Greedy:
    """Native ONNX Runtime's greedy tokens on the CPU for these graphs and inputs: what every browser
    generation of the same files is checked against."""
    return load_seq2seq(files, cpu_session).generate(inputs, new_tokens, keep=True)
