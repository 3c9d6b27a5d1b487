"""A generate row checked natively, on the graph it ran: the kernel check (harness.core.generation.token_check
against native ONNX Runtime teacher-forced on the row's tokens) and its quality beside the fp32 model.

Quality (llama.cpp's `llama-perplexity --kl-divergence` is the anchor): the fp32 graph and the row's graph are
both fed the row's own sequence (the prompt, then its generated tokens), and at every position both compute
(every prompt position where the graph returns them all, then each generated token's) the next-token
distributions are compared: top-1 agreement (the share of positions whose argmax is the same) and the mean of
KL(P_fp32 || P_row) in nats. A quantized row is never a mismatch for this: it is what the precision costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.generation import StepTop, token_check
from harness.core.records import UnsupportedError
from harness.prepare.folders import file_precision, past_shape
from harness.prepare.greedy import cpu_session, forced_logits
from harness.prepare.seq2seq import Seq2SeqFiles, forced_seq2seq, graph_name, precision_files, seq2seq_files
from harness.prepare.variants import model_for_precision

# What a generation ran: its graph with past, or an encoder–decoder's graphs (each at its own precision)
Graphs = Path | Seq2SeqFiles

# the engine every generation's tokens are checked against, named on the row (token_reference)
REFERENCE_ENGINE = "onnxruntime CPUExecutionProvider"


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
                     log_probs: bool = False) -> Checked:  # fmt: skip
    """A generation that ran `graph` (the file `source`'s precision gave, or an encoder–decoder's files)
    checked: token_check against native
    ORT CPU teacher-forced on the same graph and, at a precision other than fp32 with the fp32 graph of
    `source` at hand, agreement_top1 and kl_mean on the same sequence; with native's logits at each
    generated step [batch, N, vocab]. depth: the KV cache the generation filled first (--depths)."""
    ids = np.asarray(tokens, dtype=np.int64)
    logits = forced(graph, prompt, ids, depth)
    steps = logits[:, -ids.shape[1] :]
    # log_probs: the other side's top-k are log-probabilities (llama.cpp's n_probs), compared with native's
    # log-softmax; a gap between two tokens is the same in either, so the near-tie rule reads them alike
    agree, facts = token_check(ids, _log_softmax(steps) if log_probs else steps, precision, side, top)
    facts["token_reference"] = f"{REFERENCE_ENGINE} on {graphs_name(graph)}"
    reference = fp32_graph(source) if precision != "fp32" else None
    if reference is None or reference == graph:
        facts["quality"] = "not measured: " + ("the row is fp32" if precision == "fp32" else "no fp32 graph at hand")
        return agree, facts, steps
    found = quality(*(_sequence_logits(g, prompt, ids, depth) for g in (reference, graph)))
    facts |= {"agreement_top1": found.agreement_top1, "kl_mean": found.kl_mean, "quality_positions": found.positions,
              "quality_reference": f"{REFERENCE_ENGINE} on {graphs_name(reference)} (fp32)"}  # fmt: skip
    return agree, facts, steps


def tokens_against(reference: Graphs, prompt: dict[str, np.ndarray], tokens: list[list[int]]) -> dict[str, Any]:
    """A generation of other weights than any graph at hand (a GGUF's own quantized blocks) beside the fp32 graph:
    teacher-forced on the generation's tokens, the share of its tokens that are the fp32 graph's argmax after the
    same prefix (agreement_top1 over the generated positions) and the first position where they part. KL needs the
    row's whole distribution, which such a runtime's answer does not carry: not measured."""
    ids = np.asarray(tokens, dtype=np.int64)
    argmax = forced(reference, prompt, ids)[:, -ids.shape[1] :].argmax(axis=-1)
    same = argmax == ids
    parted = [int(np.argmin(row)) for row in same if not row.all()]
    return {"agreement_top1": float(same.mean()), "quality_positions": int(ids.shape[1]),
            "first_divergence": min(parted) if parted else None,
            "quality_reference": f"{REFERENCE_ENGINE} on {graphs_name(reference)} (fp32), teacher-forced on the "
                                 "row's tokens: each token against its argmax",
            "kl_mean_not_measured": "the runtime returns no whole next-token distribution"}  # fmt: skip


def gguf_quality(source: Path, prompt: dict[str, np.ndarray], tokens: list[list[int]],
                 precision: str) -> dict[str, Any]:  # fmt: skip
    """A llama.cpp row (native or in the page) at another precision than fp32: its GGUF's own blocks (Q4_0, F16,
    Q8_0), which no ONNX graph holds, so no kernel check; its tokens beside the fp32 graph's argmax (tokens_against),
    where that graph is at hand. Quality, never a mismatch."""
    facts: dict[str, Any] = {"token_parity": f"not checked: no graph computes this GGUF's {precision} blocks; its "
                                             "agreement with the fp32 graph is its quality"}  # fmt: skip
    reference = fp32_graph(source)
    return facts if reference is None else facts | tokens_against(reference, prompt, tokens)
