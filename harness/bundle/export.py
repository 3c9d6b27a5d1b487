"""`accelharness export --bundle FILE`: the chosen runs of a store, every row that belongs to them,
as one file another store can import (harness.bundle.importer).

The rows are copied into a store in memory (the source is only read), brought to the current schema,
given any identity an older file lacks (the migration's own statements), redacted if asked, and
written as Parquet with a manifest of versions, runs, checksums and row counts. A run carries one ceiling per
target, kind and precision class: the one its rows are held against (a resumed run, or a Ray suite's jobs on one
target, measured it again; import refuses a bundle with two, harness.bundle.checks)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from harness.bundle.checks import CEILING_KEY
from harness.bundle.fmt import BUNDLE_FORMAT, REDACTIONS, BundleError, file_sha256, write_bundle
from harness.bundle.redact import REMOVED, redact_public
from harness.store import RUN_TABLES, SCHEMA_VERSION, Store, copy_runs, open_store

MANIFEST_RUN_FIELDS = ("run_id", "run_uuid", "started_at", "status", "command", "machine_id", "machine_label",
                       "hardware_class")  # fmt: skip


@dataclass
class ExportSummary:
    path: Path
    runs: list[str]
    rows: dict[str, int]
    bytes: int
    redacted: str | None


def export_bundle(
    db_path: Path, out: Path, runs: str = "all", since: datetime | None = None, redact: str | None = None
) -> ExportSummary:
    """Write the runs `runs` names (or every run started at or after `since`) to the bundle `out`."""
    out = Path(out)
    if redact is not None and redact not in REDACTIONS:
        raise BundleError(f"unknown --redact '{redact}'; valid: {', '.join(REDACTIONS)}")
    if out.exists():
        raise BundleError(f"{out} exists; a bundle is never overwritten: choose another name or remove it")
    if not out.parent.is_dir():
        raise BundleError(f"--bundle {out}: directory {out.parent} does not exist")
    with duckdb.connect() as staging:
        staged = Store(staging, Path(":memory:"))
        staged.ensure_schema()
        run_ids = _copy_runs(Path(db_path), staging, runs, since)
        _keep_held_ceilings(staging)
        if redact == "public":
            redact_public(staging, RUN_TABLES)
        with tempfile.TemporaryDirectory(prefix="accelharness-bundle-") as directory:
            files, entries = _write_tables(staging, Path(directory))
            manifest = _manifest(staged, entries, redact)
            write_bundle(out, manifest, files)
    rows = {table: entry["rows"] for table, entry in entries.items()}
    return ExportSummary(out, run_ids, rows, out.stat().st_size, redact)


def _copy_runs(db_path: Path, staging: duckdb.DuckDBPyConnection, runs: str, since: datetime | None) -> list[str]:
    with open_store(db_path, read_only=True) as store:
        if since is not None:
            chosen = [
                r["run_id"]
                for r in store.query("SELECT run_id FROM runs WHERE started_at >= ? ORDER BY started_at", [since])
            ]
            if not chosen:
                raise BundleError(f"no run in {db_path} started at or after {since:%Y-%m-%d %H:%M:%S}")
        else:
            chosen = store.resolve_runs(runs)
        copy_runs(store, staging, chosen)
    return chosen


def _keep_held_ceilings(staging: duckdb.DuckDBPyConnection) -> None:
    """Of a target's ceilings of one kind and class in a run, the one its rows are held against: the latest
    with a value, as harness.store.roofline_sql takes it (else the latest, which holds the reason); the others
    were superseded when it was measured, and no figure of the run is theirs."""
    key = ", ".join(CEILING_KEY)
    staging.execute(
        f"DELETE FROM ceilings WHERE rowid NOT IN (SELECT arg_max(rowid, (coalesce(value > 0, false), measured_at, "
        f"rowid)) FROM ceilings GROUP BY {key})"
    )


def _write_tables(staging: duckdb.DuckDBPyConnection, directory: Path) -> tuple[dict[str, Path], dict[str, Any]]:
    files, entries = {}, {}
    for table in RUN_TABLES:
        path = directory / f"{table}.parquet"
        staging.execute(f"COPY {table} TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
        files[table] = path
        rows = staging.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        entries[table] = {"sha256": file_sha256(path), "rows": rows, "bytes": path.stat().st_size}
    return files, entries


def _manifest(staged: Store, entries: dict[str, Any], redact: str | None) -> dict[str, Any]:
    from harness import __version__

    fields = ", ".join(MANIFEST_RUN_FIELDS)
    runs = [
        json.loads(json.dumps(r, default=str)) for r in staged.query(f"SELECT {fields} FROM runs ORDER BY started_at")
    ]
    return {
        "bundle_format": BUNDLE_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "accelharness_version": __version__,
        "duckdb_version": duckdb.__version__,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": runs,
        "files": {f"{table}.parquet": entry for table, entry in entries.items()},
        "redacted": {"level": redact, "removed": REMOVED} if redact else None,
    }
