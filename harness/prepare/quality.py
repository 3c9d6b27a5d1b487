"""A generate row checked natively, on the graph it ran: the kernel check (harness.core.generation.token_check
against native ONNX Runtime teacher-forced on the row's tokens) and its quality beside the fp32 model.

Quality (llama.cpp's `llama-perplexity --kl-divergence` is the anchor): the fp32 graph and the row's graph are
both fed the row's own sequence (the prompt, then its generated tokens), and at every position both compute
(every prompt position where the graph returns them all, then each generated token's) the next-token
distributions are compared: top-1 agreement (the share of positions whose argmax is the same) and the mean of
KL(P_fp32 || P_row) in nats. A quantized row is never a mismatch for this: it is what the precision costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.generation import StepTop, token_check
from harness.core.parity import GGML_SIDE, MODULE_SIDE
from harness.core.records import UnsupportedError
from harness.prepare.folders import file_precision, past_shape
from harness.prepare.greedy import cpu_session, filler, forced_logits
from harness.prepare.seq2seq import Seq2SeqFiles, forced_seq2seq, graph_name, precision_files, seq2seq_files
from harness.prepare.variants import model_for_precision

# What a generation ran: its graph with past, or an encoder–decoder's graphs (each at its own precision)
Graphs = Path | Seq2SeqFiles

# the engine every generation's tokens are checked against, named on the row (token_reference)
REFERENCE_ENGINE = "onnxruntime CPUExecutionProvider"
NO_REFERENCE = "no fp32 reference at hand"
GIVEN_REFERENCE = "exported from --reference-model"  # a reference the folder does not hold: the user's HF weights
# a row's quality beside fp32 on its generated sequence: what a check on the graph states, replacing a worker's
QUALITY_KEYS = ("agreement_top1", "kl_mean", "quality_positions", "first_divergence", "quality_reference", "quality",
                "kl_mean_not_measured")  # fmt: skip


@lru_cache(maxsize=2)  # a row's graph and the fp32 one: loaded once for a run's rows of the same files
def _session(graph: Path) -> Any:
    return cpu_session(graph)


def forced(graph: Graphs, prompt: dict[str, np.ndarray], tokens: np.ndarray, depth: int = 0) -> np.ndarray:
    """Native ORT CPU's logits on `graph`, teacher-forced on the prompt then `tokens` (greedy.forced_logits),
    after a KV cache filled to `depth`; an encoder–decoder's graphs: their loop, the prompt the encoder's inputs
    (harness.prepare.seq2seq.forced_seq2seq)."""
    if isinstance(graph, Seq2SeqFiles):
        return forced_seq2seq(graph, prompt, tokens)
    return forced_logits(_session(graph), prompt, tokens, past_shape(graph), depth)


def ran_graphs(source: Path, precision: str) -> Graphs:
    """The graphs a generation of `source` (the model's graph for generation) ran at a precision: the file
    model_for_precision gives, or each graph of an encoder–decoder's layout at its own precision."""
    if seq2seq_files(source) is not None:
        return precision_files(source, precision)[0]
    return model_for_precision(source, precision)[0]


def graphs_name(graph: Graphs) -> str:
    """The graphs as a row names them: the file, or an encoder–decoder's files joined by '+'."""
    return graph.label() if isinstance(graph, Seq2SeqFiles) else graph_name(graph)


@dataclass(frozen=True)
class Quality:
    agreement_top1: float  # share of positions where both argmaxes agree
    kl_mean: float  # mean KL(P_fp32 || P_row) over those positions, nats
    positions: int  # positions compared per batch row


def quality(fp32_logits: np.ndarray, logits: np.ndarray) -> Quality:
    """Agreement and mean KL divergence over the positions both computed (the trailing ones: a graph that
    returns only the prefill's last position has fewer)."""
    width = min(fp32_logits.shape[1], logits.shape[1])
    p, q = (_log_softmax(x[:, -width:]) for x in (fp32_logits, logits))
    kl = np.sum(np.exp(p) * (p - q), axis=-1)
    agree = p.argmax(axis=-1) == q.argmax(axis=-1)
    return Quality(float(agree.mean()), float(kl.mean()), width)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _sequence_logits(graph: Graphs, prompt: dict[str, np.ndarray], ids: np.ndarray, depth: int = 0) -> np.ndarray:
    """Logits at every position of the prompt and the generated tokens but the last, whatever positions the
    graph's prefill returns: the first token as a prefill, every later one as a step (a padded prompt: the
    prompt as the prefill; after a filled KV cache: the prompt as the prefill after it)."""
    if depth or isinstance(graph, Seq2SeqFiles) or not np.all(prompt["attention_mask"] == 1):
        return forced(graph, prompt, ids, depth)
    sequence = np.concatenate([prompt["input_ids"], ids], axis=1).astype(np.int64)
    first = {"input_ids": sequence[:, :1], "attention_mask": np.ones_like(sequence[:, :1])}
    return forced(graph, first, sequence[:, 1:])


def fp32_graph(source: Path) -> Graphs | None:
    """The fp32 graph of a generation's model where it is at hand (the export, an fp32 file given, a folder
    that ships one; an encoder–decoder's, every graph's), or None (a genai int4 folder)."""
    try:
        graph = ran_graphs(source, "fp32")
    except UnsupportedError:
        return None
    files = [graph.encoder, graph.decoder, graph.decoder_past] if isinstance(graph, Seq2SeqFiles) else [graph]
    return graph if all(file_precision(file) == "fp32" for file in files) else None


Checked = tuple[bool, dict[str, Any], np.ndarray]  # (agree, facts for the row, native's logits per step)


def check_generation(graph: Graphs, source: Path, prompt: dict[str, np.ndarray], tokens: list[list[int]],
                     precision: str, side: str, top: StepTop | None = None, depth: int = 0,
                     log_probs: bool = False, fp32: Graphs | None = None) -> Checked:  # fmt: skip
    """A generation that ran `graph` (the file `source`'s precision gave, or an encoder–decoder's files)
    checked: token_check against native ORT CPU teacher-forced on the same graph and, with the fp32 graph of
    `source` at hand, agreement_top1, kl_mean and first_divergence on the same sequence (the fp32 graph itself: 1,
    0 by identity, its tokens compared; llama.cpp's F32 GGUF: its tokens alone, tokens_against); with native's
    logits at each generated step [batch, N, vocab]. depth: the KV cache the generation filled first (--depths);
    fp32: the reference where `source` holds no fp32 graph (--reference-model's export)."""
    ids = np.asarray(tokens, dtype=np.int64)
    logits = forced(graph, prompt, ids, depth)
    steps = logits[:, -ids.shape[1] :]
    # log_probs: the other side's top-k are log-probabilities (llama.cpp's n_probs), compared with native's
    # log-softmax; a gap between two tokens is the same in either, so the near-tie rule reads them alike
    agree, facts = token_check(ids, _log_softmax(steps) if log_probs else steps, precision, side, top)
    facts["token_reference"] = f"{REFERENCE_ENGINE} on {graphs_name(graph)}"
    own = fp32_graph(source)
    reference = own or fp32
    if reference is None:
        facts["quality"] = f"not measured: {NO_REFERENCE}"
        return agree, facts, steps
    given = "" if own is not None else f", {GIVEN_REFERENCE}"  # --reference-model's export, not the folder's own
    if reference == graph and side == GGML_SIDE:  # llama.cpp's F32 GGUF of the same weights: its tokens alone
        return agree, facts | tokens_against(reference, prompt, tokens, steps), steps
    if reference == graph:  # the fp32 reference itself: agreement and KL by identity, its tokens still compared
        facts |= {"agreement_top1": 1.0, "kl_mean": 0.0, "first_divergence": first_divergence(steps, ids),
                  "quality_reference": f"{REFERENCE_ENGINE} on {graphs_name(graph)} (fp32): the row ran the fp32 "
                                       "reference graph itself, so agreement 1 and KL 0 by identity; first_divergence: "
                                       "where its tokens leave that graph's argmax"}  # fmt: skip
        return agree, facts, steps
    fp32 = _sequence_logits(reference, prompt, ids, depth)
    found = quality(fp32, _sequence_logits(graph, prompt, ids, depth))
    facts |= {"agreement_top1": found.agreement_top1, "kl_mean": found.kl_mean, "quality_positions": found.positions,
              "first_divergence": first_divergence(fp32[:, -ids.shape[1] :], ids),
              "quality_reference": f"{REFERENCE_ENGINE} on {graphs_name(reference)} (fp32{given})"}  # fmt: skip
    return agree, facts, steps


def module_check(source: Path, prompt: dict[str, np.ndarray], tokens: list[list[int]], precision: str,
                 top: StepTop | None, depth: int = 0) -> tuple[bool | None, dict[str, Any]]:  # fmt: skip
    """A generation of an engine's own module of the weights (torch) checked against native ORT CPU on the fp32 graph
    of the same weights (`source`'s, the export the run made), teacher-forced on its tokens after a KV cache filled to
    `depth`: token_check at MODULE_SIDE's tolerance, its top-k logits per step compared where it returned them; and,
    under `tokens_against`, its tokens against that graph's argmax (the quality a row whose own distributions were
    not forced takes). (None, why) where no graph computes what it ran."""
    if precision != "fp32":
        why = f"{precision} is the engine's own cast of its module, which no ONNX graph computes"
        return None, {"token_parity": f"not checked: {why}; its agreement with the fp32 graph is its quality"}
    graph = fp32_graph(source)
    if graph is None:
        return None, {"token_parity": f"not checked: {NO_REFERENCE}"}
    ids = np.asarray(tokens, dtype=np.int64)
    steps = forced(graph, prompt, ids, depth)[:, -ids.shape[1] :]
    agree, facts = token_check(ids, steps, "fp32", MODULE_SIDE, top)
    facts["token_reference"] = f"{REFERENCE_ENGINE} on {graphs_name(graph)} (the fp32 export of the same weights)"
    return agree, facts | {"tokens_against": tokens_against(graph, prompt, tokens, steps)}


def first_divergence(reference_steps: np.ndarray, ids: np.ndarray) -> int | None:
    """The first generated position (0-based, the earliest over the batch's rows) where a row's tokens leave the
    reference's greedy tokens, from the reference's logits teacher-forced on them [batch, N, vocab] (up to that
    position the forced prefix is the reference's own greedy one); None where they never do."""
    same = reference_steps.argmax(axis=-1) == ids
    parted = [int(np.argmin(row)) for row in same if not row.all()]
    return min(parted) if parted else None


def engine_against(forced: Callable[[tuple[int, ...]], np.ndarray], reference: Path, feeds: dict[str, np.ndarray],
                   tokens: list[list[int]], depth: int) -> dict[str, Any]:  # fmt: skip
    """A generation beside the fp32 graph on its own engine's distributions (`forced`: its session's logits over a
    forced sequence, each position's predicting the next id): both teacher-forced on the row's prompt and tokens
    (after the KV-cache filler at a `depth`), top-1 agreement and mean KL(P_fp32 || P_row) over the positions, and the
    first divergence of its tokens from the fp32 graph's greedy ones."""
    prompt = {name: feeds[name] for name in ("input_ids", "attention_mask")}
    if not np.all(prompt["attention_mask"] == 1):
        return {"quality": "not measured on the engine's own logits: a padded prompt"}
    ids = np.asarray(tokens, dtype=np.int64)
    # at a depth, the filler the cache was filled with leads the forced sequence: one causal pass over filler, prompt
    # and tokens from an empty cache computes what filling it, then forcing the rest, computes
    sequences = np.concatenate([filler(prompt["input_ids"], depth), prompt["input_ids"], ids], axis=1)
    rows = [forced(tuple(int(i) for i in row)) for row in sequences]
    fp32 = _sequence_logits(reference, prompt, ids, depth)
    found = quality(fp32, np.stack(rows))
    return {"agreement_top1": found.agreement_top1, "kl_mean": found.kl_mean, "quality_positions": found.positions,
            "first_divergence": first_divergence(fp32[:, -ids.shape[1] :], ids),
            "quality_reference": f"{REFERENCE_ENGINE} on {graph_name(reference)} (fp32) beside the row's own "
                                 "engine, both teacher-forced on the row's tokens"}  # fmt: skip


def tokens_against(reference: Graphs, prompt: dict[str, np.ndarray], tokens: list[list[int]],
                   steps: np.ndarray | None = None) -> dict[str, Any]:  # fmt: skip
    """A generation of other weights than any graph at hand (a GGUF's own quantized blocks) beside the fp32 graph:
    teacher-forced on the generation's tokens, the share of its tokens that are the fp32 graph's argmax after the
    same prefix (agreement_top1 over the generated positions) and the first position where they part. KL needs the
    row's whole distribution, which such a runtime's answer does not carry: not measured."""
    ids = np.asarray(tokens, dtype=np.int64)
    steps = forced(reference, prompt, ids)[:, -ids.shape[1] :] if steps is None else steps
    same = steps.argmax(axis=-1) == ids
    return {"agreement_top1": float(same.mean()), "quality_positions": int(ids.shape[1]),
            "first_divergence": first_divergence(steps, ids),
            "quality_reference": f"{REFERENCE_ENGINE} on {graphs_name(reference)} (fp32), teacher-forced on the "
                                 "row's tokens: each token against its argmax",
            "kl_mean_not_measured": "the runtime returns no whole next-token distribution"}  # fmt: skip


def gguf_quality(source: Path, prompt: dict[str, np.ndarray], tokens: list[list[int]],
                 precision: str, fp32: Graphs | None = None) -> dict[str, Any]:  # fmt: skip
    """A llama.cpp row (native or in the page) at another precision than fp32: its GGUF's own blocks (Q4_0, F16,
    Q8_0), which no ONNX graph holds, so no kernel check; its tokens beside the fp32 graph's argmax (tokens_against),
    where that graph is at hand. Quality, never a mismatch."""
    facts: dict[str, Any] = {"token_parity": f"not checked: no graph computes this GGUF's {precision} blocks; its "
                                             "agreement with the fp32 graph is its quality"}  # fmt: skip
    reference = fp32_graph(source) or fp32
    return facts if reference is None else facts | tokens_against(reference, prompt, tokens)


class ReferenceModelError(ValueError):
    """A --reference-model that cannot be the model's fp32 reference; the message says why and what is valid."""


def check_reference_model(path: Path, model: Any) -> Any:
    """--reference-model checked before a run: a Hugging Face checkpoint folder (not ONNX files) of a decoder-only
    model, whose token table has the model's rows (the same ids mean the same tokens). Returns its spec."""
    from harness.prepare.prompts import PromptError, table_rows
    from harness.prepare.specs import SpecError, spec_from_path

    shown = f"--reference-model {path}"
    if not path.is_dir():
        raise ReferenceModelError(f"{shown}: not a folder; a Hugging Face model folder (config.json and weights)")
    try:
        spec = spec_from_path(path, None)
    except SpecError as exc:
        raise ReferenceModelError(str(exc).replace(f"--model-path {path}", shown)) from None
    if spec.is_onnx_file or not spec.has_past_export or spec.is_seq2seq:
        raise ReferenceModelError(f"{shown}: the reference is the fp32 export of a decoder-only model; give the "
                                  "Hugging Face checkpoint folder of one (config.json and weights)")  # fmt: skip
    try:
        rows, theirs = table_rows(model), table_rows(spec)
    except (PromptError, ValueError, OSError) as exc:
        raise ReferenceModelError(f"{shown}: its vocabulary cannot be read: {str(exc)[:200]}") from None
    if rows and theirs and rows != theirs:
        raise ReferenceModelError(f"{shown}: its token table has {theirs:,} rows, the model's {rows:,}: not the same "
                                  "model's weights")  # fmt: skip
    return spec
