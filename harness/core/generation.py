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
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from harness.core.stats import nearest_rank

# The tables' names of the two phases' rates (llama-bench's pp / tg).
PREFILL_RATE = "pp tokens/s"
DECODE_RATE = "tg tokens/s"
# A page whose memory grows by more than this over its repeated generations is flagged: a KV cache that
# is not disposed grows it by the cache's size every generation.
MEMORY_GROWTH_BOUND_MB = 16.0


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


def summarize_generation(result: Any) -> dict[str, float | None]:
    """The figures of a generate Result (its case gives the batch and the prompt length)."""
    if result.case.mode != "generate":
        return {}
    return generation_figures(result.case.batch_size, result.case.seq_len, result.ttft_samples_ms,
                              result.step_samples_ms)  # fmt: skip


def step_curve(steps_ms: Sequence[Sequence[float]]) -> list[float]:
    """The median time of each decode position over the generations (the step-time curve)."""
    lengths = {len(steps) for steps in steps_ms}
    if not steps_ms or len(lengths) != 1:
        return []
    return [float(v) for v in np.median(np.asarray(steps_ms, dtype=np.float64), axis=0)]


def common_prefix(tokens: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> tuple[int, int | None]:
    """(the shortest common prefix over the batch's rows, the row where it ends or None if all match)."""
    shortest, row_at = None, None
    for row, (mine, theirs) in enumerate(zip(tokens, reference, strict=True)):
        length = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b), len(mine))
        if length < len(mine) and (shortest is None or length < shortest):
            shortest, row_at = length, row
    return (len(tokens[0]) if shortest is None else shortest), row_at


def token_parity(tokens: Sequence[Sequence[int]], reference: Sequence[Sequence[int]],
                 margins: Sequence[Sequence[float]], tolerance: float) -> tuple[bool, dict[str, Any]]:  # fmt: skip
    """Whether generated tokens agree with the reference greedy tokens: (agree, facts for the row).

    At the first divergence the reference's top-1/top-2 logit margin decides: below the precision's
    tolerance the two logits tie within what the precision can tell apart (noted, not a mismatch)."""
    if [len(r) for r in tokens] != [len(r) for r in reference]:
        shapes = f"{[len(r) for r in tokens]} tokens per row against the reference's {[len(r) for r in reference]}"
        return False, {"token_parity": f"mismatch: {shapes}"}
    matched, row = common_prefix(tokens, reference)
    facts: dict[str, Any] = {"tokens_matched": matched, "tokens_compared": len(tokens[0])}
    if row is None:
        return True, facts | {"token_parity": f"all {matched} tokens of every row equal the reference's"}
    margin = float(margins[row][matched])
    facts |= {"divergence_row": row, "divergence_position": matched, "reference_margin": margin}
    tie = margin < tolerance
    verdict = "noted: a near tie" if tie else "mismatch"
    facts["token_parity"] = (
        f"{verdict}: row {row} diverges at token {matched} where the reference's top-1/top-2 logit margin is "
        f"{margin:.3g} ({'below' if tie else 'above'} the tolerance {tolerance:g})"
    )
    return tie, facts
