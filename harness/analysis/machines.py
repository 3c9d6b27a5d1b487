"""Results across machines (issue 26): which machines a store holds, and a case's latency on each
machine, or on each hardware class, side by side. Runs imported from other stores carry their
machine (harness.store: machine_id, machine_label, hardware_class)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.analysis.tables import AnalysisError, Table
from harness.core.labels import case_label, target_label
from harness.store import copy_runs, open_store

GROUPINGS = ("machine", "hardware-class")
UNRECORDED = "unrecorded machine"  # a run made before machines were recorded (schema < 7)
MACHINES_SQL = """
SELECT machine_label, machine_id, hardware_class, count(DISTINCT run_id) AS runs, count(result_id) AS results,
       min(started_at) AS first_run, max(started_at) AS last_run
FROM runs LEFT JOIN results USING (run_id) GROUP BY ALL ORDER BY last_run DESC
"""


def machine_name(run: Mapping[str, Any]) -> str:
    """What a report calls a run's machine: its label, else the start of its id."""
    if run.get("machine_label"):
        return run["machine_label"]
    return f"machine {run['machine_id'][:8]}" if run.get("machine_id") else UNRECORDED


def group_name(run: Mapping[str, Any], by: str) -> str:
    return machine_name(run) if by == "machine" else (run.get("hardware_class") or "unknown hardware class")


def machines_table(db_path: Path) -> Table:
    """`query --report machines`: every machine the store holds runs of."""
    with open_store(db_path, read_only=True) as store:
        rows = store.query(MACHINES_SQL)
    for row in rows:
        row["machine"] = machine_name(row)
    columns = ["machine", "machine_id", "hardware_class", "runs", "results", "first_run", "last_run"]
    return Table("Machines", columns, rows, ["one row per machine (its label, else its id) the store holds runs of"])


def across(runs: list[tuple[Mapping[str, Any], list[Mapping[str, Any]]]], by: str = "machine") -> Table:
    """Each case's median latency (ms) on each machine or hardware class: `runs` is (run row, its result
    rows), oldest first, so a machine's latest run gives its value. A case that did not run ok shows its status."""
    columns: list[str] = []
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    for run, results in runs:
        name = group_name(run, by)
        if name not in columns:
            columns.append(name)
        for row in results:
            key = (row["model"], target_label(row), case_label(row))
            ok = row["status"] == "ok" and row.get("latency_p50_ms") is not None
            cells.setdefault(key, {})[name] = row["latency_p50_ms"] if ok else row["status"]
    rows = [
        {"model": model, "target": target, "case": case, **values}
        for (model, target, case), values in sorted(cells.items())
    ]
    what = "machine (its label, else its id)" if by == "machine" else "hardware class (CPU · GPU · memory)"
    notes = [f"median latency (ms) of each case, one column per {what}; a column's latest run where it has several"]
    return Table(f"Across {len(columns)} {'machines' if by == 'machine' else 'hardware classes'}",
                 ["model", "target", "case", *columns], rows, notes)  # fmt: skip


MIN_ID_PREFIX = 8  # a shorter prefix of a 16-character machine id matches too many by chance
MACHINE_RULE = f"an exact machine id, a unique id prefix of at least {MIN_ID_PREFIX} characters, or an exact label"


def _candidates(rows: list[dict[str, Any]]) -> str:
    return ", ".join(sorted({f"{r['machine_label'] or '(no label)'} (id {r['machine_id']})" for r in rows}))


def resolve_machine(db_path: Path, machine: str) -> tuple[str, str]:
    """--machine (every command that takes it): ("machine_id", id) or ("machine_label", label), the column
    and value its runs carry. An exact id first, then an exact label (held by one machine id), then a unique
    id prefix of at least MIN_ID_PREFIX characters; empty, short, ambiguous or unknown is an AnalysisError
    listing the candidates (the CLI prints it through terminal_text)."""
    with open_store(db_path, read_only=True) as store:
        rows = store.query("SELECT DISTINCT machine_id, machine_label FROM runs WHERE machine_id IS NOT NULL")
    known = ", ".join(sorted({machine_name(r) for r in rows})) or "none recorded"
    if not machine.strip():
        raise AnalysisError(f"--machine is empty; it takes {MACHINE_RULE}; machines: {known}")
    if any(r["machine_id"] == machine for r in rows):
        return "machine_id", machine
    labelled = [r for r in rows if r["machine_label"] == machine]
    if len({r["machine_id"] for r in labelled}) > 1:
        raise AnalysisError(
            f"--machine '{machine}' is the label of several machines; give an id: {_candidates(labelled)}"
        )
    if labelled:
        return "machine_label", machine
    prefixed = [r for r in rows if r["machine_id"].startswith(machine)]
    if prefixed and len(machine) < MIN_ID_PREFIX:
        raise AnalysisError(f"--machine '{machine}' is too short for an id prefix; it takes {MACHINE_RULE}: "
                            f"{_candidates(prefixed)}")  # fmt: skip
    if len({r["machine_id"] for r in prefixed}) > 1:
        raise AnalysisError(f"--machine '{machine}' is the start of several machine ids: {_candidates(prefixed)}")
    if prefixed:
        return "machine_id", prefixed[0]["machine_id"]
    raise AnalysisError(f"no run in {db_path} was made on machine '{machine}'; machines: {known}")


def machine_ids(db_path: Path, machine: str) -> set[str]:
    """The machine ids --machine names (resolve_machine: one id, or every id a label is held by)."""
    column, value = resolve_machine(Path(db_path), machine)
    if column == "machine_id":
        return {value}
    with open_store(db_path, read_only=True) as store:
        return {r["machine_id"] for r in store.query("SELECT DISTINCT machine_id FROM runs WHERE machine_label = ?",
                                                    [value])}  # fmt: skip


@contextmanager
def one_machine(db_path: Path, machine: str | None) -> Iterator[Path]:
    """The store as if it held only the runs of `machine` (resolve_machine): a temporary store holding a copy of
    those runs' rows, for analyses that learn from every row (`recommend`, `predict`). None: the store itself."""
    if machine is None:
        yield Path(db_path)
        return
    column, value = resolve_machine(Path(db_path), machine)
    with tempfile.TemporaryDirectory(prefix="accelharness-machine-") as directory:
        scoped = Path(directory) / "machine.duckdb"
        with open_store(db_path, read_only=True) as store, open_store(scoped) as copy:
            runs = [r["run_id"] for r in store.query(f"SELECT run_id FROM runs WHERE {column} = ?", [value])]
            copy_runs(store, copy.connection, runs)
        yield scoped
