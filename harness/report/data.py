"""Everything a report shows about one run, read from the store in one place."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.store import Store, open_store


@dataclass
class RunReport:
    run: dict[str, Any]
    hardware: list[dict[str, Any]]
    results: list[dict[str, Any]]
    samples: dict[str, list[float]] = field(default_factory=dict)  # result_id -> raw latencies (ms)
    operators: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # result_id -> --profile rows
    steps: dict[str, list[list[float]]] = field(default_factory=dict)  # generate rows: result_id -> decode steps
    ceilings: list[dict[str, Any]] = field(default_factory=list)  # each target's measured ceilings (table ceilings)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # rendered plots, shared by the writers

    @property
    def host(self) -> dict[str, Any]:
        return json.loads(self.run["host"]) if self.run.get("host") else {}


def _samples(store: Store, run_id: str) -> dict[str, list[float]]:
    rows = store.connection.execute(
        "SELECT s.result_id, s.latency_ms FROM samples s JOIN results r USING (result_id) "
        "WHERE r.run_id = ? ORDER BY s.result_id, s.iteration",
        [run_id],
    ).fetchall()
    grouped: dict[str, list[float]] = defaultdict(list)
    for result_id, latency in rows:
        grouped[result_id].append(latency)
    return dict(grouped)


def _steps(store: Store, run_id: str) -> dict[str, list[list[float]]]:
    rows = store.connection.execute(
        "SELECT s.result_id, s.steps_ms FROM samples s JOIN results r USING (result_id) "
        "WHERE r.run_id = ? AND s.steps_ms IS NOT NULL ORDER BY s.result_id, s.iteration",
        [run_id],
    ).fetchall()
    grouped: dict[str, list[list[float]]] = defaultdict(list)
    for result_id, steps in rows:
        grouped[result_id].append(list(steps))
    return dict(grouped)


def _operators(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    rows = store.query(
        "SELECT o.* FROM operators o JOIN results r USING (result_id) WHERE r.run_id = ? ORDER BY o.share DESC",
        [run_id],
    )
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[row["result_id"]].append(row)
    return dict(grouped)


def _load(store: Store, run_id: str) -> RunReport:
    return RunReport(
        store.run_info(run_id),
        store.hardware_rows(run_id),
        store.results(run_id),
        _samples(store, run_id),
        _operators(store, run_id),
        _steps(store, run_id),
        store.ceilings(run_id),
    )


def load_run_report(db_path: Path, run_selector: str) -> RunReport:
    with open_store(db_path, read_only=True) as store:
        return _load(store, store.resolve_run(run_selector))


def load_run_reports(db_path: Path, run_selector: str) -> list[RunReport]:
    """One RunReport for RUN_ID or 'latest', one per run for 'RUN,RUN,…'; for 'all', every run, oldest first."""
    with open_store(db_path, read_only=True) as store:
        return [_load(store, run_id) for run_id in store.resolve_runs(run_selector)]
