"""The generation figures, defined once for native and browser rows (harness.core.generation)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.generation import StepTop, generation_figures, step_curve, token_check


def test_prefill_and_decode_rates_are_separate_phases() -> None:
    # a slow prefill (2 s for 128 prompt tokens) and fast decode steps (10 ms each) over two generations
    figures = generation_figures(2, 128, [2000.0, 2000.0], [[10.0, 10.0, 20.0], [10.0, 10.0, 10.0]])
    assert figures["ttft_ms"] == 2000.0
    assert figures["prefill_tokens_per_s"] == pytest.approx(2 * 128 / 2.0)
    assert figures["decode_tokens_per_s"] == pytest.approx(2 * 6 * 1000 / 70.0)  # never folded with the prefill
    assert figures["tpot_ms"] == 10.0 and figures["tpot_p90_ms"] == 20.0


def test_one_token_has_no_decode_phase_and_nothing_measured_is_null() -> None:
    figures = generation_figures(1, 8, [5.0], [[]])
    assert figures["decode_tokens_per_s"] is None and figures["tpot_ms"] is None and figures["tpot_p90_ms"] is None
    assert generation_figures(1, 8, [], []) == {}


def test_step_curve_is_the_median_per_position() -> None:
    assert step_curve([[1.0, 4.0], [3.0, 2.0], [2.0, 3.0]]) == [2.0, 3.0]


def _forced(rows: list[list[list[float]]]) -> np.ndarray:
    """Native logits [batch, steps, vocab] as a teacher-forced run would give them."""
    return np.asarray(rows, dtype=np.float32)


# two rows, three steps, a vocabulary of 4: native's argmax is [[0, 1, 2], [3, 1, 0]]; row 1 step 1 is a near
# tie at fp32 (1 against 0.9999 for token 2: below twice the tolerance, 2 x (1e-4 + 1e-4 x 1)), row 0 step 1
# is not (1 against 0.2 for token 3)
FORCED = _forced([[[1, 0, 0, 0], [0, 1, 0, 0.2], [0, 0, 1, 0]], [[0, 0, 0, 1], [0, 1, 0.9999, 0], [1, 0, 0, 0]]])


def _top(forced: np.ndarray, k: int = 2) -> StepTop:
    ids = np.argsort(-forced, axis=-1, kind="stable")[..., :k]
    return StepTop(ids, np.take_along_axis(forced, ids, axis=-1).astype(np.float64))


def test_the_token_check_passes_equal_tokens_and_a_near_tie_and_fails_a_real_divergence() -> None:
    agree, facts = token_check([[0, 1, 2], [3, 1, 0]], FORCED, "fp32", "browser", _top(FORCED))
    assert agree and facts["tokens_matched"] == 3 and facts["step_logit_max_diff"] == 0.0
    agree, facts = token_check([[0, 1, 2], [3, 2, 0]], FORCED, "fp32", "browser")  # a near tie: within the gap
    assert agree and facts["tokens_matched"] == 1 and facts["token_parity"].startswith("ok: row 1 leaves")
    agree, facts = token_check([[0, 3, 2], [3, 1, 0]], FORCED, "fp32", "browser")
    assert not agree and facts["divergence_row"] == 0 and facts["reference_gap"] == pytest.approx(0.8)
    assert "row 0 step 1: token 3 where native ORT's is 1" in facts["token_parity"]


def test_the_token_check_fails_logits_beyond_the_tolerance_even_when_the_tokens_agree() -> None:
    shifted = _top(FORCED)
    shifted.values[0, 2, 0] += 0.01  # one step's winning logit off by 0.01: a kernel bug, same tokens
    agree, facts = token_check([[0, 1, 2], [3, 1, 0]], FORCED, "fp32", "browser", shifted)
    assert not agree and "row 0 step 2: a top-2 logit differs from native ORT's by 0.01" in facts["token_parity"]
    nan = _top(FORCED)
    nan.values[1, 0, 1] = np.nan  # a non-finite logit never passes
    agree, facts = token_check([[0, 1, 2], [3, 1, 0]], FORCED, "fp32", "browser", nan)
    assert not agree and facts["step_logit_max_diff"] is None
    missing = _top(FORCED, k=1)
    missing.ids[0, 0, 0], missing.values[0, 0, 0] = 1, 0.0  # native's winner absent from the page's top-k
    agree, facts = token_check([[0, 1, 2], [3, 1, 0]], FORCED, "fp32", "browser", missing)
    assert not agree and "top-1 token 0 (logit 1) is missing" in facts["token_parity"]


def test_the_token_check_refuses_a_shape_other_than_natives() -> None:
    agree, facts = token_check([[0, 1]], FORCED, "fp32", "browser")
    assert not agree and facts["token_parity"].startswith("mismatch: tokens [1, 2]")


def test_quality_is_agreement_and_kl_from_the_fp32_distributions() -> None:
    from harness.prepare.quality import quality

    fp32 = np.log(np.asarray([[[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]]))
    same = quality(fp32, fp32)
    assert same.agreement_top1 == 1.0 and same.kl_mean == pytest.approx(0.0, abs=1e-12) and same.positions == 2
    other = np.log(np.asarray([[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]]))
    found = quality(fp32, other + 5.0)  # a shift of every logit changes no distribution
    kl = 0.6 * np.log(0.6 / 0.3) + 0.3 * np.log(0.3 / 0.6)  # KL(P_fp32 || P_q) at the second position
    assert found.agreement_top1 == 0.5 and found.kl_mean == pytest.approx(kl / 2)


def test_memory_that_grows_over_the_repeats_is_flagged() -> None:
    from harness.browser.generate import memory_growth

    mb = 2**20
    steady = memory_growth({"memory_before": {"bytes": 40 * mb}, "memory_after": {"bytes": 41 * mb}}, {})
    assert steady["memory_growth_flag"] is False and steady["memory_growth_mb"] == 1.0
    # a page whose own heaps stay flat while the GPU process grows (a WebGPU cache never disposed)
    leaking = memory_growth({"memory_before": {"bytes": 40 * mb}, "memory_after": {"bytes": 40 * mb}},
                            {"gpu_process_loop_start_mb": 300.0, "gpu_process_loop_end_mb": 420.0})  # fmt: skip
    assert leaking["memory_growth_flag"] is True and leaking["memory_growth_mb"] == 120.0
    assert "a KV cache that is not disposed" in leaking["memory_growth"]
    unmeasured = memory_growth({"memory_before": {"error": "not isolated"}, "memory_after": None}, {})
    assert unmeasured["memory_growth"] == "not measured: not isolated" and "memory_growth_flag" not in unmeasured
    # wasm: its cache never reaches the GPU process, whose flat line is then no verdict
    gpu = {"gpu_process_loop_start_mb": 300.0, "gpu_process_loop_end_mb": 300.0}
    wasm = memory_growth({"memory_before": {"error": "not available"}, "memory_after": None}, gpu, on_gpu=False)
    assert wasm["memory_growth"] == "not measured: not available" and "memory_growth_flag" not in wasm
