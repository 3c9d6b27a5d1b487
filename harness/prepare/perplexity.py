"""Perplexity on the harness's passage: every generate row's engine teacher-forced on one fixed, versioned text,
outside any timing, beside the fp32 reference (llama.cpp's `llama-perplexity` is the anchor: its PPL, the ratio
of a quantization's PPL to the fp32 model's, and the mean KL divergence from the fp32 model's distributions).

The text is harness.prepare.audio.PASSAGE at PASSAGE_VERSION: the same passage the speech rows speak (espeak-ng)
and score their WER against. Its ids: the model folder's tokenizer.json where it has one; a model without a
tokenizer (a built-in spec's random weights) reads the passage's words and punctuation marks, each as the one of
its regular ids (harness.prepare.prompts.Vocabulary) the piece's SHA-256 picks, so every engine and the page force
the same ids.
At most MAX_PASSAGE_TOKENS ids, and no more than the model's positions.

The ids are forced from an empty KV cache, batch 1 (one prefill where the graph returns every position's logits,
else one step per id, as generation runs): each position's next-token distribution predicts the next id. PPL =
exp(mean negative log-likelihood) over the L-1 predicted positions. The fp32 reference (native ONNX Runtime CPU on
the fp32 graph) is computed once per graph and passage, its log-probabilities kept in the cache as float32 [L-1,
vocab] (with_reference): the native workers read it, and the page is served it, so a row's KL over the passage
(mean KL(P_fp32 || P_row), nats) is computed on its own engine's distributions.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.prepare.audio import PASSAGE, PASSAGE_VERSION
from harness.prepare.quality import NO_REFERENCE, REFERENCE_ENGINE, engine_against

MAX_PASSAGE_TOKENS = 1024  # ids forced: the passage is 133 words and marks, ~140 BPE tokens
PIECES = re.compile(r"\w+|[^\w\s]")  # a model without a tokenizer: the passage's words and punctuation marks
MAX_REFERENCE_BYTES = 512 * 2**20  # the fp32 reference's log-probabilities kept per graph (L-1 x vocab x 4 bytes)
REFERENCE_CODE = 1  # bump when the reference's computation changes: its cached files are made again
PASSAGE_LABEL = f"the harness's passage v{PASSAGE_VERSION} (harness.prepare.audio.PASSAGE, the text speech rows speak)"
PREFILL, STEPS = "one prefill", "one step per id"  # how a graph's session forced the ids (graph_logits)


class PassageError(ValueError):
    """The passage cannot be forced through this model or graph; the message says why."""


class PassageSkipped(PassageError):
    """Forcing the passage step by step would pass the case's time budget; the message says by how much."""


PROBE_STEPS = 4  # forced steps timed before a pass that must step is projected against its budget


@dataclass(frozen=True)
class StepBudget:
    """What a forced pass that must step (one run per id) may take: the case's --max-time (None: no limit),
    against its own pace, projected from its first PROBE_STEPS steps on (the page does the same)."""

    limit_s: float | None

    def watch(self, total: int) -> Callable[[int], None]:
        """A callback for each step done, raising PassageSkipped once the steps so far project past the budget."""
        started = time.perf_counter()

        def after(done: int) -> None:
            if self.limit_s is None or done < PROBE_STEPS:
                return
            pace_ms = (time.perf_counter() - started) * 1000 / done
            if pace_ms * total > self.limit_s * 1000:
                raise PassageSkipped(over_budget(total, pace_ms, pace_ms * total, self.limit_s))

        return after


def over_budget(steps: int, step_ms: float, estimate_ms: float, limit_s: float) -> str:
    """The sentence a row states where its forced steps would pass the case's --max-time."""
    return (f"not measured: its {steps} forced steps, at its first ones' pace ({step_ms:.3g} ms each), would take "
            f"~{estimate_ms / 1000:.0f} s, over the case's --max-time {limit_s:g} s (give a larger one, or 0 for "
            "none)")  # fmt: skip


@dataclass(frozen=True)
class Passage:
    """A model's forced ids of the passage (empty where there are none: `source` then says why), and the fp32
    reference's log-probabilities over them where one is at hand (`reference`: a float32 [len(ids)-1, vocab]
    file; else `reference_why`)."""

    ids: tuple[int, ...]
    source: str
    reference: str | None = None
    reference_graph: str | None = None
    vocab: int | None = None
    reference_why: str = NO_REFERENCE
    reference_note: str = ""  # where the reference graph comes from, when not the model's own fp32 graph

    @property
    def positions(self) -> int:
        """The positions scored: every id but the first is predicted."""
        return max(len(self.ids) - 1, 0)


def passage_ids(spec: Any) -> Passage:
    """The model's ids of the passage (module docstring), or a Passage without ids saying why."""
    from harness.prepare.prompts import PromptError, Vocabulary, encode, load_tokenizer, table_rows, tokenizer_folder

    try:
        rows = table_rows(spec)
        folder = tokenizer_folder(spec.local_path)
        if folder is not None and load_tokenizer(folder) is not None:
            ids = list(encode(folder, PASSAGE, chat=False))
            source = "the model folder's tokenizer.json"
        elif rows:
            regular = Vocabulary(rows).regular_ids()
            ids = [int(regular[_digest(piece) % regular.size]) for piece in PIECES.findall(PASSAGE)]
            source = (f"no tokenizer: the passage's words and punctuation marks, each the one of the model's "
                      f"{regular.size:,} regular ids its SHA-256 picks")  # fmt: skip
        else:
            return Passage((), "not measured: the model states no vocabulary to draw the passage's ids from")
    except (PromptError, OSError, ValueError) as exc:
        return Passage((), f"not measured: the passage cannot be tokenized: {str(exc)[:300]}")
    if rows and any(not 0 <= i < rows for i in ids):
        return Passage((), f"not measured: the tokenizer's ids of the passage leave the model's {rows:,} rows")
    limit = min(MAX_PASSAGE_TOKENS, _positions(spec) or MAX_PASSAGE_TOKENS)
    if len(ids) > limit:
        source += f"; its first {limit:,} of {len(ids):,} ids (the model's positions or the harness's bound)"
        ids = ids[:limit]
    if len(ids) < 2:
        return Passage((), "not measured: the passage gives fewer than two ids")
    return Passage(tuple(ids), source)


def _digest(piece: str) -> int:
    return int(hashlib.sha256(piece.encode()).hexdigest()[:12], 16)


def _positions(spec: Any) -> int | None:
    """The positions a model takes: its spec's config, else its folder's config.json or genai_config.json."""
    if spec.context_length:
        return int(spec.context_length)
    from harness.prepare.folder_checks import FolderError, read_config
    from harness.prepare.prompts import tokenizer_folder

    folder = tokenizer_folder(spec.local_path)  # an HF folder, or the folder a graph's layout lives in
    for name, path in (("config.json", ()), ("genai_config.json", ("model",))):
        if folder is None or not (folder / name).is_file():
            continue
        try:
            config = read_config(folder, name)
        except (FolderError, OSError, ValueError):
            continue
        for key in path:
            config = config.get(key) if isinstance(config.get(key), dict) else {}
        found = (config.get(key) for key in ("max_position_embeddings", "n_positions", "n_ctx", "context_length"))
        limit = next((v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
        if limit:
            return limit
    return None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def graph_logits(session: Any, ids: tuple[int, ...], shape: tuple[int, int] | None,
                 budget: StepBudget | None = None, device: str | None = None) -> tuple[np.ndarray, str]:  # fmt: skip
    """An ONNX Runtime session's logits [L-1, vocab] predicting ids[1:] with `ids` forced from an empty KV cache
    (batch 1): one prefill where the graph returns every position's logits, else (the harness's export returns the
    last position's only) the first id's prefill then one step per id (harness.prepare.greedy.forced_logits), as
    web/page/generate.mjs's passage runs the same ids. Returns them and which way they were forced; steps the
    `budget` stops raise PassageSkipped; device: the presents kept on that ORT device, as the timed loop keeps them."""
    from harness.prepare.greedy import forced_logits, prefill_feeds

    sequence = np.asarray([ids], dtype=np.int64)
    feeds = prefill_feeds(session, {"input_ids": sequence, "attention_mask": np.ones_like(sequence)}, shape)
    logits = np.asarray(session.run([session.get_outputs()[0].name], feeds)[0])
    if logits.ndim == 3 and logits.shape[1] == len(ids):
        return logits[0, :-1].astype(np.float32), PREFILL
    first = {"input_ids": sequence[:, :1], "attention_mask": np.ones_like(sequence[:, :1])}
    after = None if budget is None else budget.watch(len(ids) - 1)
    return forced_logits(session, first, sequence[:, 1:], shape, device=device, after=after)[0], STEPS


def _reference_path(graph: Path, ids: tuple[int, ...]) -> Path:
    from harness.prepare.cache import cache_root

    stat = graph.stat()
    key = f"{graph.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{ids}|{PASSAGE_VERSION}|{REFERENCE_CODE}"
    return cache_root() / "passage" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.f32"


def with_reference(passage: Passage, graph: Path | None, note: str = "") -> Passage:
    """The passage with the fp32 reference's log-probabilities over it: native ORT CPU on the fp32 `graph`, written
    once to the cache (its file read back by every row of the model); or saying why there is none."""
    from dataclasses import replace

    if not passage.ids:
        return passage
    if graph is None:
        return replace(passage, reference_why=f"{NO_REFERENCE}: no fp32 graph of the model")
    try:
        path = _reference_path(graph, passage.ids)
        if not path.exists():
            _write_reference(graph, passage.ids, path)
        vocab = path.stat().st_size // 4 // passage.positions
    except Exception as exc:  # the reference's own failure leaves every row without it, never the run
        return replace(passage, reference_why=f"{NO_REFERENCE}: the fp32 graph's passage failed: "
                                              f"{type(exc).__name__}: {str(exc)[:300]}")  # fmt: skip
    return replace(passage, reference=str(path), reference_graph=str(graph), vocab=vocab, reference_note=note)


def _write_reference(graph: Path, ids: tuple[int, ...], path: Path) -> None:
    from harness.prepare.folders import past_shape
    from harness.prepare.greedy import cpu_session

    logits, _ = graph_logits(cpu_session(graph), ids, past_shape(graph))
    if logits.size * 4 > MAX_REFERENCE_BYTES:
        raise PassageError(f"its log-probabilities would pass {MAX_REFERENCE_BYTES // 2**20} MB")
    values = log_softmax(logits).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:  # renamed into place: a reader never sees half a file, two writers never share one
        with os.fdopen(handle, "wb") as file:
            values.tofile(file)
        os.replace(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)


@cache
def reference_logprobs(path: str, positions: int) -> np.ndarray:
    """The fp32 reference's log-probabilities [positions, vocab] from its file (read once per process)."""
    values = np.fromfile(path, dtype=np.float32)
    if positions <= 0 or values.size % positions:
        raise PassageError(f"the reference file holds {values.size} values, not {positions} positions' worth")
    # renormalized in doubles: float32 log-probabilities sum to 1 only within their rounding (a KL then dips below 0)
    return log_softmax(values.reshape(positions, -1))


def scores(logits: np.ndarray, passage: Passage) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From a row's logits [L-1, vocab] predicting the passage's ids[1:]: each position's negative log-likelihood
    of the next id, its argmax and the row's log-probabilities."""
    if logits.shape[0] != passage.positions:
        raise PassageError(f"{logits.shape[0]} positions' logits for the passage's {passage.positions}")
    logprobs = log_softmax(logits)
    nexts = np.asarray(passage.ids[1:], dtype=np.int64)
    return -logprobs[np.arange(nexts.size), nexts], logprobs.argmax(axis=-1), logprobs


def kl_per_position(logprobs: np.ndarray, passage: Passage) -> np.ndarray | None:
    """KL(P_fp32 || P_row) at each predicted position (nats), where the reference is at hand and as wide."""
    if passage.reference is None:
        return None
    reference = reference_logprobs(passage.reference, passage.positions)
    if reference.shape != logprobs.shape:
        raise PassageError(f"the fp32 reference's distributions are {list(reference.shape)}, the row's "
                           f"{list(logprobs.shape)}")  # fmt: skip
    return np.sum(np.exp(reference) * (reference - logprobs), axis=-1)


def passage_facts(nll: np.ndarray, argmax: np.ndarray, kl: np.ndarray | None, passage: Passage,
                  how: str) -> dict[str, Any]:  # fmt: skip
    """A row's details from its scores over the passage: `perplexity` (exp of the mean NLL), the passage's name,
    version and ids, and beside the fp32 reference its PPL, the ratio, the mean KL, the share of positions whose
    argmax is the reference's and the first position where they part (None: never). how: what computed it."""
    facts: dict[str, Any] = {
        "perplexity": float(np.exp(np.mean(nll))),
        "perplexity_passage": PASSAGE_LABEL,
        "perplexity_passage_version": PASSAGE_VERSION,
        "perplexity_tokens": int(nll.size),
        "perplexity_ids": passage.source,
        "perplexity_method": how,
    }
    if passage.reference is None:
        return facts | {"perplexity_ratio_not_measured": passage.reference_why}
    reference = reference_logprobs(passage.reference, passage.positions)
    nexts = np.asarray(passage.ids[1:], dtype=np.int64)
    fp32 = float(np.exp(-np.mean(reference[np.arange(nexts.size), nexts])))
    same = argmax == reference.argmax(axis=-1)
    facts |= {
        "perplexity_fp32": fp32,
        "perplexity_ratio": facts["perplexity"] / fp32,
        "passage_agreement_top1": float(same.mean()),
        "passage_first_divergence": None if same.all() else int(np.argmin(same)),
        "perplexity_reference": f"{REFERENCE_ENGINE} on {passage.reference_graph} (fp32{passage.reference_note})",
    }
    if kl is None:
        return facts | {"kl_passage_not_measured": "the row's whole distributions over the passage are not at hand"}
    return facts | {"kl_passage": float(np.mean(kl))}


def engine_perplexity(session: Any, passage: Passage | None, engine: str,
                      budget: StepBudget | None = None) -> dict[str, Any]:  # fmt: skip
    """A native row's passage facts from its own session's logits (its forced_logits, which says how it forced the
    ids in forced_method), untimed, after its timed loop; or `perplexity_not_measured` saying why."""
    if passage is None or not passage.ids:
        return {"perplexity": None, "perplexity_not_measured": passage.source if passage else "no passage prepared"}
    forced = getattr(session, "forced_logits", None)
    if forced is None:
        return {"perplexity": None, "perplexity_not_measured": f"{engine}'s session here returns no logits for a "
                                                               "forced sequence (its API yields tokens)"}  # fmt: skip
    try:
        started = time.perf_counter()
        logits = forced(passage.ids, budget)
        took = {"perplexity_ms": (time.perf_counter() - started) * 1000}  # the untimed phase's own cost
        nll, argmax, logprobs = scores(logits, passage)
        how = (f"{engine}'s own session, {getattr(session, 'forced_method', 'forced')} from an empty KV cache, batch "
               "1, untimed, after the timed loop")  # fmt: skip
        return passage_facts(nll, argmax, kl_per_position(logprobs, passage), passage, how) | took
    except PassageSkipped as exc:
        return {"perplexity": None, "perplexity_not_measured": str(exc)}
    except Exception as exc:  # the passage's failure is this row's missing figure, never its error
        return {"perplexity": None, "perplexity_not_measured": f"{type(exc).__name__}: {str(exc)[:300]}"}


def row_passage(prepared: Any) -> Passage:
    """The passage a prepared model's rows force: the one its preparation made (with the fp32 reference), else its
    ids alone (the run made no ONNX graph with past: torch alone)."""
    if prepared.passage is not None:
        return prepared.passage
    from dataclasses import replace

    return replace(passage_ids(prepared.spec), reference_why=f"{NO_REFERENCE}: the run made no ONNX graph with past")


def engine_quality(session: Any, prepared: Any, feeds: dict[str, np.ndarray], tokens: list[list[int]] | None,
                   depth: int, engine: str, budget: StepBudget | None = None) -> dict[str, Any]:  # fmt: skip
    """A native generate row's quality from its own session, untimed, after its timed loop: its perplexity on the
    passage and, on its generated sequence beside the fp32 graph, top-1 agreement, KL and the first divergence
    (harness.prepare.quality.engine_against). A parent's check on the same graph (harness.run.native) may state
    them again on native ORT CPU's logits; an engine without forced logits has the passage's reason alone. A
    forced pass that must step is held to `budget` (the case's --max-time, at the row's own decode step)."""
    passage = row_passage(prepared)
    facts = engine_perplexity(session, passage, engine, budget)
    forced = getattr(session, "forced_logits", None)
    if forced is None or not tokens or passage.reference_graph is None:
        return facts
    try:
        return facts | engine_against(lambda ids: forced(ids, budget), Path(passage.reference_graph), feeds, tokens,
                                      depth)  # fmt: skip
    except PassageSkipped as exc:
        return facts | {"quality": str(exc)}
    except Exception as exc:  # the comparison's own failure is a missing figure, never the row's error
        return facts | {"quality": f"not measured: {type(exc).__name__}: {str(exc)[:300]}"}
