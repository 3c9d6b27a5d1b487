"""How much of a change between two runs is the machine: the drift control and the run-to-run spread.

Every run measures a fixed control workload on each target it ran (harness.run.control), at the
start, middle and end of each job. Between two runs of the same code the control's ratio is the
machine's own drift on that target (other load, clocks, thermal state): a case whose ratio lies
within control ratio × (1 ± threshold) moved with the machine, and compare calls it `drift`, not
`regressed` or `improved`.

Where the store holds >= MIN_SPREAD_RUNS earlier runs of a case, its run-to-run spread (slowest /
fastest median among them) says how far this machine moves that case with nothing changed; a
verdict inside it is flagged.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

from harness.core.labels import target_label
from harness.store import Store

MIN_SPREAD_RUNS = 3
MOVED = ("regressed", "improved")  # the verdicts the drift control and the spread can explain


def run_controls(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """The run's control measurements per target label, in the order they were taken."""
    by_target: dict[str, list[dict[str, Any]]] = {}
    for row in store.controls(run_id):
        by_target.setdefault(target_label(row), []).append(row)
    return by_target


def control_ms(rows: list[dict[str, Any]]) -> float | None:
    """A run's control time on a target: the median of its measurements (None: none succeeded)."""
    medians = [r["median_ms"] for r in rows if r["median_ms"] is not None]
    return statistics.median(medians) if medians else None


def within_run(rows: list[dict[str, Any]]) -> float | None:
    """How much the control moved inside one run: last measurement / first (None: fewer than two)."""
    medians = [r["median_ms"] for r in rows if r["median_ms"] is not None]
    return medians[-1] / medians[0] if len(medians) >= 2 else None


def control_drift(store: Store, run_a: str, run_b: str) -> dict[str, dict[str, float | None]]:
    """Per target both runs measured the control on: A's and B's control time, and their ratio B/A."""
    controls_a, controls_b = run_controls(store, run_a), run_controls(store, run_b)
    drift = {}
    for target in sorted(controls_a.keys() & controls_b.keys()):
        a_ms, b_ms = control_ms(controls_a[target]), control_ms(controls_b[target])
        drift[target] = {
            "a_ms": a_ms,
            "b_ms": b_ms,
            "ratio": b_ms / a_ms if a_ms and b_ms else None,
            "within_a": within_run(controls_a[target]),
            "within_b": within_run(controls_b[target]),
        }
    return drift


def drift_verdict(verdict: str, ratio: float | None, control_ratio: float | None, threshold: float) -> str | None:
    """`drift` when a change lies within the control's drift ± threshold, else None (the verdict stands)."""
    if verdict not in MOVED or ratio is None or control_ratio is None:
        return None
    return "drift" if control_ratio * (1 - threshold) <= ratio <= control_ratio * (1 + threshold) else None


def case_spread(store: Store, case: dict[str, Any], before: datetime, exclude: tuple[str, ...]) -> tuple[float, int]:
    """A case's run-to-run spread over the runs started before `before` (except `exclude`): the
    slowest median / the fastest, and how many runs that is (spread 1.0 with fewer than MIN_SPREAD_RUNS)."""
    where = " AND ".join(f"r.{name} IS NOT DISTINCT FROM ?" for name in case)
    rows = store.query(
        f"SELECT r.run_id, min(r.latency_p50_ms) AS p50 FROM results r JOIN runs u ON r.run_id = u.run_id "
        f"WHERE {where} AND r.status = 'ok' AND r.variant IS NULL AND u.started_at < ? "
        f"AND r.run_id NOT IN ({', '.join('?' * len(exclude))}) GROUP BY r.run_id",
        [*case.values(), before, *exclude],
    )
    medians = [r["p50"] for r in rows if r["p50"]]
    if len(medians) < MIN_SPREAD_RUNS:
        return 1.0, len(medians)
    return max(medians) / min(medians), len(medians)


def spread_note(verdict: str, ratio: float | None, spread: float, runs: int) -> str | None:
    """What a verdict inside the case's run-to-run spread must say, or None."""
    if verdict not in MOVED or ratio is None or runs < MIN_SPREAD_RUNS or not 1 / spread <= ratio <= spread:
        return None
    return f"inside this case's run-to-run spread (×{spread:.2f} over {runs} earlier runs)"
