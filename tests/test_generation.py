"""The generation figures, defined once for native and browser rows (harness.core.generation)."""

from __future__ import annotations

import pytest

from harness.core.generation import generation_figures, step_curve, token_parity


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


def test_token_parity_notes_a_near_tie_and_flags_a_real_divergence() -> None:
    reference = [[1, 2, 3], [4, 5, 6]]
    margins = [[1.0, 1.0, 1.0], [1.0, 0.0001, 1.0]]
    agree, facts = token_parity([[1, 2, 3], [4, 5, 6]], reference, margins, 0.001)
    assert agree and facts["tokens_matched"] == 3
    agree, facts = token_parity([[1, 2, 3], [4, 9, 6]], reference, margins, 0.001)
    assert agree and facts["tokens_matched"] == 1 and facts["token_parity"].startswith("noted: a near tie")
    agree, facts = token_parity([[1, 7, 3], [4, 5, 6]], reference, margins, 0.001)
    assert not agree and facts["divergence_row"] == 0 and facts["token_parity"].startswith("mismatch")


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
