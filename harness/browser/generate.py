"""A generate case in the browser (web/page/generate.mjs): the page job's generation part, and the row
built from the page's answer, with the figures of harness.core.generation and token-level parity against
native ONNX Runtime's greedy tokens on the same graph (harness.prepare.greedy.reference_generation)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.generation import MEMORY_GROWTH_BOUND_MB, mean_steps, token_parity
from harness.core.parity import compare
from harness.core.records import Case, Result
from harness.prepare.folders import past_shape
from harness.prepare.greedy import Greedy
from harness.prepare.prepared import PreparedModel
from harness.web.page_job import GenerateJob

# the graph the reference tokens ran on: the fp32 export, or a model file or folder as given (a genai folder: int4)
TOKEN_REFERENCE = "onnxruntime CPU greedy tokens on the graph with past key/values (the fp32 export, or the file given)"


@cache
def _outputs(path: Path) -> tuple[tuple[str, int | None], ...]:
    """An ONNX file's outputs, read from the proto (weights not loaded): each name and its last dimension
    where the graph fixes it."""
    import onnx

    found = []
    for value in onnx.load(str(path), load_external_data=False).graph.output:
        dims = value.type.tensor_type.shape.dim
        last = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None
        found.append((value.name, last or None))
    return tuple(found)


def graph_outputs(path: Path) -> tuple[str, ...]:
    """An ONNX file's output names."""
    return tuple(name for name, _ in _outputs(path))


def vocab_size(path: Path) -> int | None:
    """The width of a generation graph's logits (its first output): the vocabulary a served page's token ids
    are checked against (harness.web.answers); None where the graph leaves it symbolic."""
    return _outputs(path)[0][1]


def generate_job(model: Path, case: Case, keeps_on_gpu: bool, eos: tuple[int, ...] = ()) -> GenerateJob:
    """A page job's generation part: the token count, the EOS ids it stops at (--stop-at-eos; none: it makes
    exactly new_tokens), the KV-cache depth filled first (untimed), the logits width (the vocabulary its token
    ids are checked against), a model folder's past heads and head size and, on WebGPU, present.* kept on the
    GPU (only the logits, the first output, come back to the CPU)."""
    assert case.new_tokens is not None  # a generate case always has its count (harness.run.plan)
    options = None
    if keeps_on_gpu:
        logits, *presents = graph_outputs(model)
        options = {"preferredOutputLocation": {logits: "cpu"} | dict.fromkeys(presents, "gpu-buffer")}
    shape = past_shape(model)  # a folder's config: the page uses it where the graph is symbolic
    return GenerateJob(
        new_tokens=case.new_tokens,
        vocab_size=vocab_size(model),
        past_shape=None if shape is None else list(shape),
        session_options=options,
        depth=case.depth or 0,
        eos_ids=list(eos),
    )


def prompt_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The prompt a generation starts from (the page builds positions and the empty past itself)."""
    return {name: feeds[name] for name in ("input_ids", "attention_mask")}


def memory_growth(generation: dict[str, Any], details: dict[str, Any]) -> dict[str, Any]:
    """How memory moved over the repeated generations, and a flag when it grew beyond MEMORY_GROWTH_BOUND_MB
    (what a KV cache that is never disposed does): the page's own figure after the warm-up and after the
    repeats (JS and wasm heaps), and for a launched browser its GPU process's RSS at the timed loop's start
    and end (where a WebGPU cache lives on a software adapter)."""
    before, after = generation.get("memory_before") or {}, generation.get("memory_after") or {}
    facts: dict[str, Any] = {"memory_growth_bound_mb": MEMORY_GROWTH_BOUND_MB}
    growth: dict[str, float] = {}
    if before.get("bytes") is not None and after.get("bytes") is not None:
        facts["page_memory_before_mb"], facts["page_memory_after_mb"] = before["bytes"] / 2**20, after["bytes"] / 2**20
        growth["the page's heaps"] = facts["page_memory_after_mb"] - facts["page_memory_before_mb"]
    start, end = details.get("gpu_process_loop_start_mb"), details.get("gpu_process_loop_end_mb")
    if start is not None and end is not None:
        growth["the browser's GPU process"] = end - start
    if not growth:
        why = before.get("error") or after.get("error") or "no figure before and after the repeats"
        return facts | {"memory_growth": f"not measured: {why}"}
    facts["memory_growth_mb"] = max(growth.values())
    facts["memory_growth_flag"] = facts["memory_growth_mb"] > MEMORY_GROWTH_BOUND_MB
    grew = ", ".join(f"{where} {mb:+.1f} MB" for where, mb in growth.items())
    facts["memory_growth"] = f"over the repeated generations: {grew} (bound {MEMORY_GROWTH_BOUND_MB:g} MB)"
    if facts["memory_growth_flag"]:
        facts["memory_growth"] += ": beyond it; a KV cache that is not disposed grows memory every generation"
    return facts


def _prefill_logits(generation: dict[str, Any]) -> np.ndarray:
    logits = generation["prefill_logits"]
    values = [np.nan if v is None else v for v in logits["values"]]  # JSON carries a NaN as null
    return np.asarray(values, dtype=np.float32).reshape(logits["dims"])


def generation_result(prepared: PreparedModel, target: Any, case: Case, answer: dict[str, Any],
                      fields: dict[str, Any], extra: dict[str, Any], details: dict[str, Any]) -> Result:  # fmt: skip
    """The row of a page's generate answer: figures from its samples, token and prefill-logit parity."""
    generation = answer["generation"]
    steps = generation["step_samples_ms"]
    fields |= {
        "ttft_samples_ms": generation["ttft_samples_ms"],
        "step_samples_ms": steps,
        "tpot_samples_ms": mean_steps(steps),
        "generated_tokens": generation["tokens"],
    }
    details |= memory_growth(generation, details) | {"warmup_generations": 1, "token_reference": TOKEN_REFERENCE}
    if not generation["tokens_stable"]:
        details["tokens_unstable"] = "the timed generations did not all give the warm-up's tokens"
    reference = prepared.load_generation((case.batch_size, case.seq_len), case.new_tokens or 1, case.depth or 0)
    status, error, parity_fields = _parity(generation, reference, extra.get("precision") or "fp32", details)
    feeds, _ = prepared.load_case((case.batch_size, case.seq_len))  # the prompt the page's job carried
    fields |= prepared.text_fields(feeds["input_ids"], generation["tokens"], details)
    return prepared.result(target, case, status, error, details=details, **parity_fields, **extra, **fields)


def _parity(generation: dict[str, Any], reference: Greedy | None, precision: str,
            details: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:  # fmt: skip
    """(status, error, fields): the prefill logits within the precision's tolerance, then the tokens;
    at a divergence the reference's top-1/top-2 margin against the same tolerance decides."""
    if reference is None or reference.prefill_logits is None or reference.margins is None:
        details["token_parity"] = "not checked: no reference generation for this case"
        return "ok", None, {}
    try:
        logits = compare([_prefill_logits(generation)], [reference.prefill_logits], precision, ["prefill logits"])
    except ValueError as exc:
        return "error", f"parity check failed: {exc}", {}
    details |= logits.details
    agree, facts = token_parity(generation["tokens"], reference.tokens.tolist(), reference.margins.tolist(),
                                logits.tolerance)  # fmt: skip
    details |= facts
    problems = [text for text in (logits.error, None if agree else facts["token_parity"]) if text]
    return ("ok" if not problems else "mismatch"), "; ".join(problems) or None, logits.fields
