"""The generation figures, defined once for native and browser rows (pure functions, no I/O).

One generation of N tokens from a prompt of P tokens (batch B) is timed as:
  TTFT          prefill + the first token's logits on the CPU (the prefill phase)
  decode steps  the N-1 later steps, each until its logits are on the CPU
  end to end    the whole generation (a row's samples_ms)
and gives two rates that never mix the phases (llama-bench's spelling in tables):
  pp  prefill tokens/s = B x P / TTFT
  tg  decode tokens/s  = B x (N-1) / the sum of the decode steps
A rate over the whole generation would fold a slow prefill into a per-token figure. A generation stopped at EOS
(--stop-at-eos) has fewer steps: the rates count the steps it made, never the tokens asked.

A generated token, on every engine, is one the model chose: the argmax of a step's logits, fed back as the next
step's input. A decoder-only model's N tokens are the N after the prompt; an encoder–decoder's the N after its
decoder start token (config.json's decoder_start_token_id, else pad_token_id), which is fed and never counted. No
token is forced or suppressed: Whisper's language, task and no-timestamps tokens, which transformers' generate()
forces and strips from its output, are the model's own argmax here and counted like any other. Native ORT's loops
(harness.prepare.greedy, harness.prepare.seq2seq), torch's (native/torch_greedy.py) and the page's
(web/page/generate.mjs, seq2seq.mjs) count alike, so the same N positions are compared across engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from harness.core.parity import logit_tolerance
from harness.core.stats import nearest_rank

# The tables' names of the two phases' rates (llama-bench's pp / tg).
PREFILL_RATE = "pp tokens/s"
DECODE_RATE = "tg tokens/s"
# A page whose memory grows by more than this over its repeated generations is flagged: a KV cache that
# is not disposed grows it by the cache's size every generation.
MEMORY_GROWTH_BOUND_MB = 16.0
# The logits a page returns per generated step (its warm-up's): its top-k ids and values, checked against
# native ORT's at the same ids (token_check). 8 catches a wrong winner and its runners-up; a generation of
# 4096 tokens then returns 32 K pairs per batch row.
STEP_TOP_K = 8
# The most untimed warm-up generations a page runs after its first (web/page/generate.mjs warmedUp: on until the
# generation time stops falling): a page whose time never settles costs this many generations, or its budget.
PAGE_MAX_WARMUP_GENERATIONS = 50
# A page's wasm is compiled twice: a baseline tier at load, then its hot functions by the optimizing compiler in the
# background (V8: Liftoff, then TurboFan per function once its tiering budget is spent; SpiderMonkey: baseline, then
# Ion), each swapped in when ready. Between the two the generation time can hold still for a second and then fall
# again, so "stops falling" alone ended a warm-up early: qwen2-small at 1 thread held 44-47 ms per generation for
# ~20 generations, then fell to 17-19 ms at ~1.7 s; in 12 s runs every wasm row (llama-tiny, qwen2-small; 1 and 2
# threads) was at its steady median from 2-3 s of generating on (docs/browser.md). So the page also warms up for at
# least PAGE_MIN_WARMUP_S, and at most PAGE_WARMUP_BUDGET_SHARE of the case's --max-time (the rest is the timed
# loop's); --warmup 0 asks for no floor.
PAGE_MIN_WARMUP_S = 4.0
PAGE_WARMUP_BUDGET_SHARE = 0.4


def page_min_warmup_ms(warmup: int, max_time_s: float | None) -> float:
    """The least time (ms) a page's generate case warms up for, from its first generation on (see above)."""
    if warmup == 0:
        return 0.0
    floor_s = PAGE_MIN_WARMUP_S if max_time_s is None else min(PAGE_MIN_WARMUP_S, PAGE_WARMUP_BUDGET_SHARE * max_time_s)
    return floor_s * 1000.0


def decode_steps(stamps_ns: Sequence[int]) -> list[float]:
    """The decode steps' times (ms) from the moments each token's logits were ready."""
    return [(later - earlier) / 1e6 for earlier, later in pairwise(stamps_ns)]


def mean_steps(steps_ms: Sequence[Sequence[float]]) -> list[float]:
    """Time per output token of each generation: the mean of its decode steps (none for N = 1)."""
    return [float(np.mean(steps)) for steps in steps_ms if len(steps)]


def generation_figures(batch: int, prompt_tokens: int | None, ttft_ms: Sequence[float],
                       steps_ms: Sequence[Sequence[float]]) -> dict[str, float | None]:  # fmt: skip
    """A generate row's figures over its timed generations; NULL (None) where nothing was measured."""
    if not ttft_ms:
        return {}
    ttft = float(np.median(ttft_ms))
    every_step = np.asarray([s for steps in steps_ms for s in steps], dtype=np.float64)
    decode_ms = float(every_step.sum()) if every_step.size else 0.0
    return {
        "ttft_ms": ttft,
        "prefill_tokens_per_s": batch * prompt_tokens * 1000.0 / ttft if prompt_tokens and ttft > 0 else None,
        "decode_tokens_per_s": batch * every_step.size * 1000.0 / decode_ms if decode_ms > 0 else None,
        "tpot_ms": float(np.median(every_step)) if every_step.size else None,
        "tpot_p90_ms": nearest_rank(every_step, 90) if every_step.size else None,
    }


def encoder_figures(encoder_ms: Sequence[float], samples_ms: Sequence[float],
                    audio_seconds: float | None) -> dict[str, float | None]:  # fmt: skip
    """An encoder–decoder generation's own figures: the encoder's run (median ms; it is inside TTFT, which
    runs from the encoder's start to the first token's logits) and, for speech, the real-time factor: the
    audio's seconds over the median generation's seconds, the encoder's and every decoder step's (above 1:
    faster than real time; an engine that times no encoder apart has the factor alone).
    NULL where nothing was measured."""
    if not encoder_ms and not audio_seconds:
        return {}
    total = float(np.median(samples_ms)) if samples_ms else None
    rtf = audio_seconds * 1000.0 / total if audio_seconds and total else None
    return {"encoder_ms": float(np.median(encoder_ms)) if encoder_ms else None, "real_time_factor": rtf}


def summarize_generation(result: Any) -> dict[str, float | None]:
    """The figures of a generate Result (its case gives the batch and the prompt length)."""
    if result.case.mode != "generate":
        return {}
    details = result.details or {}
    # speech has no prompt tokens: its case's sequence is the teacher-forced decoder's, which generation never reads
    prompt = None if details.get("audio_seconds") else result.case.seq_len
    figures = generation_figures(result.case.batch_size, prompt, result.ttft_samples_ms, result.step_samples_ms)
    if not figures:
        return figures
    encoder = encoder_figures(details.get("encoder_samples_ms") or [], result.samples_ms, details.get("audio_seconds"))
    return figures | {"encoder_ms": None, "real_time_factor": None} | encoder


def step_curve(steps_ms: Sequence[Sequence[float]]) -> list[float]:
    """The median time of each decode position over the generations (the step-time curve)."""
    lengths = {len(steps) for steps in steps_ms}
    if not steps_ms or len(lengths) != 1:
        return []
    return [float(v) for v in np.median(np.asarray(steps_ms, dtype=np.float64), axis=0)]


@dataclass(frozen=True)
class StepTop:
    """The other side's own logits at each generated step, where it returns them: its top-k token ids and
    their logits, [batch, new_tokens, k] each (NaN where it held a non-finite value)."""

    ids: np.ndarray
    values: np.ndarray


def token_check(tokens: Sequence[Sequence[int]], forced: np.ndarray, precision: str, side: str,
                top: StepTop | None = None) -> tuple[bool, dict[str, Any]]:  # fmt: skip
    """Whether a generation agrees with native ONNX Runtime on the same graph: (agree, facts for the row).

    forced: native ORT's logits [batch, N, vocab] teacher-forced on `tokens` (the prefix up to a first
    difference is native greedy's own). Agree only if (1) at every step the other side's top-k logits stay
    within the precision's logit tolerance of native's at the same ids (and native's top-1 is among them
    or below their k-th), and (2) at every step where the token differs from native's argmax, native's gap
    between its top-1 and that token is below twice the step's logit tolerance, measured for the precision
    and side (harness.core.parity.LOGIT_TOLERANCES): two sides within it can only swap a near tie."""
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.shape != forced.shape[:2]:
        return False, {"token_parity": f"mismatch: tokens {list(ids.shape)} against native's {list(forced.shape[:2])}"}
    native = forced.argmax(axis=-1)
    matched, row = common_prefix(ids.tolist(), native.tolist())
    facts: dict[str, Any] = {"tokens_matched": matched, "tokens_compared": int(ids.shape[1])}
    atol, rtol = logit_tolerance(precision, side)
    facts["step_logit_tolerance"] = [atol, rtol]
    problems = [] if top is None else _logit_problems(forced, top, (atol, rtol), facts)
    for r, s in zip(*np.nonzero(ids != native), strict=True):
        gap = float(forced[r, s, native[r, s]] - forced[r, s, ids[r, s]])
        gap_limit = 2 * (atol + rtol * _scale(forced[r, s]))
        if (r, s) == (row, matched):
            facts |= {"divergence_row": int(r), "divergence_position": int(s), "reference_gap": gap,
                      "gap_tolerance": gap_limit}  # fmt: skip
        if not gap < gap_limit:
            problems.append(f"row {r} step {s}: token {ids[r, s]} where native ORT's is {native[r, s]}, whose "
                            f"logit is {gap:.3g} above it (a near tie is below {gap_limit:g})")  # fmt: skip
    if problems:
        facts["token_parity"] = "mismatch: " + "; ".join(problems[:3])
    elif row is None:
        facts["token_parity"] = f"all {matched} tokens of every row equal native ORT's on the same graph"
    else:
        facts["token_parity"] = (f"ok: row {row} leaves native ORT's tokens at step {matched} on a near tie "
                                 f"(gap {facts['reference_gap']:.3g} < {facts['gap_tolerance']:.3g}); teacher-forced "
                                 "on its tokens after it, native ORT agrees within the tolerances")  # fmt: skip
    return not problems, facts


def _scale(logits: np.ndarray) -> float:
    """A step's largest finite |logit|: what the relative part of a tolerance is relative to."""
    return float(np.max(np.abs(logits[np.isfinite(logits)]), initial=0.0))


def _logit_problems(
    forced: np.ndarray, top: StepTop, tolerance: tuple[float, float], facts: dict[str, Any]
) -> list[str]:
    """Steps where the other side's top-k logits leave native's by more than the tolerance (atol, rtol)."""
    problems, worst, worst_rel = [], 0.0, 0.0
    atol, rtol = tolerance
    for r, s in np.ndindex(*forced.shape[:2]):
        mine, theirs = forced[r, s], top.values[r, s]
        scale = _scale(mine)
        diff = float(np.max(np.abs(theirs - mine[top.ids[r, s]])))  # NaN on either side: not a number below
        worst, worst_rel = _worse(worst, diff), _worse(worst_rel, diff / scale if scale else diff)
        best = int(mine.argmax())
        if not diff <= atol + rtol * scale:
            problems.append(f"row {r} step {s}: a top-{top.ids.shape[2]} logit differs from native ORT's by "
                            f"{diff:.3g} (tolerance {atol + rtol * scale:.3g})")  # fmt: skip
        elif best not in top.ids[r, s] and mine[best] > np.nanmin(theirs) + atol + rtol * scale:
            problems.append(f"row {r} step {s}: native ORT's top-1 token {best} (logit {mine[best]:.4g}) is missing "
                            f"from the other side's top-{top.ids.shape[2]}")  # fmt: skip
    facts |= {"step_logit_max_diff": None if np.isnan(worst) else worst,
              "step_logit_max_rel": None if np.isnan(worst_rel) else worst_rel}  # fmt: skip
    return problems


def _worse(a: float, b: float) -> float:
    """The larger, a NaN on either side winning (a non-finite logit is the worst difference)."""
    return float("nan") if np.isnan(a) or np.isnan(b) else max(a, b)


def common_prefix(tokens: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> tuple[int, int | None]:
    """(the shortest common prefix over the batch's rows, the row where it ends or None if all match)."""
    shortest, row_at = None, None
    for row, (mine, theirs) in enumerate(zip(tokens, reference, strict=True)):
        length = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b), len(mine))
        if length < len(mine) and (shortest is None or length < shortest):
            shortest, row_at = length, row
    return (len(tokens[0]) if shortest is None else shortest), row_at
