"""Statistics against values computed by hand."""

import math

import numpy as np
import pytest

from harness.core.parity import compare
from harness.core.stats import nearest_rank, summarize


def test_summary_matches_hand_computed_values() -> None:
    samples = [4.0, 1.0, 3.0, 2.0, 10.0]
    s = summarize(samples, batch_size=2)
    assert s is not None
    assert s.iterations == 5
    assert s.mean_ms == pytest.approx(4.0)
    assert s.median_ms == pytest.approx(3.0)
    assert (s.min_ms, s.max_ms) == (1.0, 10.0)
    # sample std: sqrt(((0)^2 + 3^2 + 1^2 + 2^2 + 6^2) / 4) = sqrt(50 / 4)
    assert s.std_ms == pytest.approx(math.sqrt(12.5))
    assert s.cv == pytest.approx(math.sqrt(12.5) / 4.0)
    assert s.noisy  # cv 0.88
    # 2 items per batch over a 4 ms mean: 500 items/s
    assert s.throughput_per_s == pytest.approx(500.0)


def test_nearest_rank_percentiles() -> None:
    values = np.arange(1, 101, dtype=float)  # 1..100
    assert nearest_rank(values, 90) == 90
    assert nearest_rank(values, 95) == 95
    assert nearest_rank(values, 99) == 99
    # With 5 samples, p90 is the ceil(0.9 * 5) = 5th smallest.
    assert nearest_rank(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), 90) == 5.0
    assert nearest_rank(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), 50) == 3.0


def test_steady_samples_are_not_noisy_and_empty_gives_none() -> None:
    s = summarize([1.0, 1.01, 0.99, 1.0], batch_size=1)
    assert s is not None and not s.noisy
    assert summarize([], batch_size=1) is None


def test_parity_tolerance_depends_on_precision() -> None:
    reference = [np.array([1.0, -2.0, 0.5], dtype=np.float32)]
    close = [reference[0] + 1e-4]
    off = [reference[0] + 0.03]
    assert compare(close, reference, "fp32").matches
    assert not compare(off, reference, "fp32").matches
    bf16 = compare(off, reference, "bf16")
    assert bf16.matches
    assert bf16.max_abs_diff == pytest.approx(0.03, rel=1e-3)
    assert bf16.max_rel_diff == pytest.approx(0.03 / 2.0, rel=1e-3)


def test_parity_rejects_shape_disagreement() -> None:
    with pytest.raises(ValueError, match="shape"):
        compare([np.zeros((2, 3))], [np.zeros((3, 2))], "fp32")


def test_nan_or_inf_where_the_reference_is_finite_is_a_mismatch_naming_the_output() -> None:
    """max(0.0, nan) is 0.0: a NaN must never pass as a difference of zero (issue 11, item 1)."""
    reference = [np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32), np.array([0.5, 0.25], dtype=np.float32)]
    got = [reference[0].copy(), np.array([np.nan, np.inf], dtype=np.float32)]
    parity = compare(got, reference, "fp16", names=["last_hidden_state", "pooler_output"])
    assert not parity.matches and parity.status == "mismatch"
    assert parity.max_abs_diff is None and parity.max_rel_diff is None  # unbounded, not the finite part's 0.0
    assert [(n.output, n.nan, n.inf, n.size) for n in parity.non_finite] == [("pooler_output", 1, 1, 2)]
    expected = "output 'pooler_output': 2 of 2 values non-finite (1 NaN, 1 inf) where the reference is finite"
    assert parity.error == expected
    assert parity.details["non_finite_outputs"][0]["output"] == "pooler_output"
    everywhere = compare([np.full((2, 2), np.nan)], reference[:1], "fp32")  # all NaN: no finite pair at all
    assert not everywhere.matches and "output '#0': 4 of 4 values non-finite (4 NaN, 0 inf)" in everywhere.error
    # the reference's own non-finite values: the same value agrees, anything else is counted
    with_inf = [np.array([np.inf, 1.0, np.nan], dtype=np.float32)]
    assert compare([with_inf[0].copy()], with_inf, "fp32").matches
    other = compare([np.array([5.0, 1.0, np.nan])], with_inf, "fp32")
    assert not other.matches and "1 of 3 values differ where the reference is NaN/inf" in other.error
    # the tolerance's scale comes from the finite reference values, not from an infinite one
    assert compare([np.array([np.inf, 1.5, np.nan])], with_inf, "fp32").tolerance == pytest.approx(1e-3 + 1e-3)


def test_what_the_samples_cannot_tell_is_none_not_zero() -> None:
    """Samples of 0 ms (a timer that never advanced) give no items/s and no CV, one sample no spread:
    None, stored NULL, never 0.0 (issue 11, item 3)."""
    s = summarize([0.0, 0.0, 0.0], batch_size=4)
    assert s is not None and s.mean_ms == 0.0 and s.iterations == 3
    assert s.throughput_per_s is None and s.cv is None and s.noisy is None
    single = summarize([2.0], batch_size=1)
    assert single is not None and single.std_ms is None and single.cv is None and single.noisy is None
    assert single.throughput_per_s == pytest.approx(500.0)
