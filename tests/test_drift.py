"""The drift control and the run-to-run spread in `compare` and `history`, on real DuckDB files
written through the store (runs whose case and control times are set, so the verdicts are known)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.analysis.compare import compare_runs, render
from harness.analysis.history import history
from harness.core.records import Case, Control, Result, Target
from harness.run.control import POSITIONS, control_positions
from harness.store import open_store

TARGET = Target("cpu", "onnxruntime", "CPUExecutionProvider")
CASE = Case(1, 16, "fp32")


def add_run(db: Path, case_ms: float, control_ms: float | None, seed: int) -> str:
    """A completed run: 40 samples of the case around case_ms (1% noise), and the control at its three
    positions around control_ms (none when None, as in runs made before the control existed)."""
    rng = np.random.default_rng(seed)
    with open_store(db) as store:
        run_id = store.start_run("native", {}, {})
        samples = list(case_ms * (1 + 0.01 * rng.standard_normal(40)))
        store.add_result(run_id, Result("m", "embedding", "random", TARGET, CASE, "ok", samples_ms=samples), None)
        for position in POSITIONS if control_ms else ():
            measured = list(control_ms * (1 + 0.01 * rng.standard_normal(15)))
            store.add_control(run_id, Control("matmul-chain", TARGET, position, "m", measured, 0.5))
        store.finish_run(run_id, "completed")
    return run_id


def test_a_change_the_control_also_shows_is_drift_not_a_regression(tmp_path: Path) -> None:
    db = tmp_path / "d.duckdb"
    a, b = add_run(db, 10.0, 1.0, 1), add_run(db, 13.0, 1.3, 2)  # the whole machine 30% slower
    comparison = compare_runs(db, a, b, threshold=0.10)
    (row,) = comparison.rows
    assert row.verdict == "drift" and row.control_ratio == pytest.approx(1.3, rel=0.02)
    assert "drift control moved ×1.3" in row.note and not comparison.regressed
    assert comparison.controls[TARGET.label]["ratio"] == pytest.approx(1.3, rel=0.02)
    assert "drift control" in render(comparison, "md")


def test_a_change_beyond_the_control_is_regressed(tmp_path: Path) -> None:
    db = tmp_path / "d.duckdb"
    a, b = add_run(db, 10.0, 1.0, 1), add_run(db, 13.0, 1.0, 2)  # the machine steady, the case 30% slower
    (row,) = compare_runs(db, a, b, threshold=0.10).rows
    assert row.verdict == "regressed" and row.control_ratio == pytest.approx(1.0, abs=0.02)


def test_runs_without_a_control_keep_their_verdict_and_say_so(tmp_path: Path) -> None:
    db = tmp_path / "d.duckdb"
    a, b = add_run(db, 10.0, None, 1), add_run(db, 13.0, None, 2)
    comparison = compare_runs(db, a, b, threshold=0.10)
    assert comparison.rows[0].verdict == "regressed" and comparison.rows[0].control_ratio is None
    assert "drift control: not measured in both runs" in render(comparison, "md")


def test_a_change_inside_the_cases_run_to_run_spread_says_so(tmp_path: Path) -> None:
    db = tmp_path / "d.duckdb"
    for seed, earlier_ms in enumerate((10.0, 12.0, 14.0)):  # nothing changed, the machine moved the case ×1.4
        add_run(db, earlier_ms, None, 10 + seed)
    a, b = add_run(db, 10.0, 1.0, 1), add_run(db, 13.0, 1.0, 2)
    (row,) = compare_runs(db, a, b, threshold=0.10).rows
    assert row.verdict == "regressed" and row.spread_runs == 3 and row.spread == pytest.approx(1.4, rel=0.02)
    assert "inside this case's run-to-run spread (×1.40 over 3 earlier runs)" in row.note


def test_history_shows_each_runs_control_beside_the_case(tmp_path: Path) -> None:
    db = tmp_path / "d.duckdb"
    add_run(db, 10.0, None, 1)
    add_run(db, 10.0, 2.0, 2)
    (series,) = history(db, "m").series
    assert series.points[0].control_ms is None and series.points[1].control_ms == pytest.approx(2.0, rel=0.02)


@pytest.mark.parametrize(
    ("cases", "expected"),
    [
        (1, {-1: "start", 0: "end"}),
        (2, {-1: "start", 0: "middle", 1: "end"}),
        (5, {-1: "start", 2: "middle", 4: "end"}),
    ],
)
def test_control_positions(cases: int, expected: dict[int, str]) -> None:
    assert control_positions(cases) == expected
