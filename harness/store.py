"""The DuckDB store: one file, a versioned schema, and this process as its only writer.

Each result and its raw samples are committed in one transaction as soon as the result
arrives, so an interrupted run keeps everything it finished. Samples go in through Arrow.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from harness.result import Result
from harness.stats import summarize

SCHEMA_VERSION = 1
DEFAULT_DB = Path("accelharness.duckdb")

SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP NOT NULL, finished_at TIMESTAMP,
    status VARCHAR NOT NULL, command VARCHAR, arguments JSON, git_sha VARCHAR,
    harness_version VARCHAR, hostname VARCHAR, platform VARCHAR, python_version VARCHAR,
    cpu_model VARCHAR, cpu_cores INTEGER, memory_gb DOUBLE, host JSON
);
CREATE TABLE IF NOT EXISTS hardware (
    run_id VARCHAR NOT NULL, platform VARCHAR NOT NULL, available BOOLEAN NOT NULL, reason VARCHAR,
    device_name VARCHAR, details JSON
);
CREATE TABLE IF NOT EXISTS results (
    result_id VARCHAR PRIMARY KEY, run_id VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL,
    model VARCHAR NOT NULL, family VARCHAR NOT NULL, weights VARCHAR NOT NULL,
    hardware VARCHAR NOT NULL, engine VARCHAR NOT NULL, provider VARCHAR,
    batch_size INTEGER NOT NULL, seq_len INTEGER, requested_precision VARCHAR NOT NULL,
    precision VARCHAR NOT NULL, status VARCHAR NOT NULL, error VARCHAR, iterations INTEGER,
    latency_mean_ms DOUBLE, latency_p50_ms DOUBLE, latency_p90_ms DOUBLE, latency_p95_ms DOUBLE,
    latency_p99_ms DOUBLE, latency_min_ms DOUBLE, latency_max_ms DOUBLE, latency_std_ms DOUBLE,
    latency_cv DOUBLE, noisy BOOLEAN, throughput_per_s DOUBLE, load_ms DOUBLE, first_run_ms DOUBLE,
    memory_load_mb DOUBLE, memory_peak_mb DOUBLE, device_memory_peak_mb DOUBLE,
    max_abs_diff DOUBLE, max_rel_diff DOUBLE, load_avg_1m DOUBLE, cpu_percent DOUBLE,
    git_sha VARCHAR, details JSON
);
CREATE TABLE IF NOT EXISTS samples (
    result_id VARCHAR NOT NULL, iteration INTEGER NOT NULL, latency_ms DOUBLE NOT NULL
);
"""

TABLES = ("schema_version", "runs", "hardware", "results", "samples")


class StoreError(RuntimeError):
    """The database cannot be used (locked by another writer, corrupt, newer schema)."""


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Store:
    def __init__(self, connection: duckdb.DuckDBPyConnection, path: Path) -> None:
        self.connection = connection
        self.path = path

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- schema -------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        self.connection.execute(SCHEMA)
        row = self.connection.execute("SELECT max(version) FROM schema_version").fetchone()
        version = row[0] if row else None
        if version is None:
            self.connection.execute("INSERT INTO schema_version VALUES (?, ?)", [SCHEMA_VERSION, _now()])
        elif version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}; this accelharness knows up to {SCHEMA_VERSION}"
            )

    # --- writes -------------------------------------------------------------------------------
    def start_run(self, command: str, arguments: dict[str, Any], host: dict[str, Any]) -> str:
        run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.connection.execute(
            "INSERT INTO runs VALUES (?, ?, NULL, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                run_id,
                _now(),
                command,
                json.dumps(arguments, default=str),
                host.get("git_sha"),
                host.get("harness_version"),
                host.get("hostname"),
                host.get("platform"),
                host.get("python_version"),
                host.get("cpu_model"),
                host.get("cpu_cores"),
                host.get("memory_gb"),
                json.dumps(host, default=str),
            ],
        )
        return run_id

    def finish_run(self, run_id: str, status: str) -> None:
        self.connection.execute(
            "UPDATE runs SET finished_at = ?, status = ? WHERE run_id = ?", [_now(), status, run_id]
        )

    def add_hardware(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        self.connection.executemany(
            "INSERT INTO hardware VALUES (?, ?, ?, ?, ?, ?)",
            [
                [
                    run_id,
                    r["platform"],
                    r["available"],
                    r["reason"],
                    r.get("device_name"),
                    json.dumps(r.get("details", {}), default=str),
                ]
                for r in rows
            ],
        )

    def add_result(self, run_id: str, result: Result, git_sha: str | None) -> str:
        """Commit one result with its samples; returns its result_id."""
        result_id = uuid.uuid4().hex
        summary = summarize(result.samples_ms, result.case.batch_size)
        stats = (
            [
                summary.iterations,
                summary.mean_ms,
                summary.median_ms,
                summary.p90_ms,
                summary.p95_ms,
                summary.p99_ms,
                summary.min_ms,
                summary.max_ms,
                summary.std_ms,
                summary.cv,
                summary.noisy,
                summary.throughput_per_s,
            ]
            if summary
            else [None] * 12
        )
        row = [
            result_id,
            run_id,
            _now(),
            result.model,
            result.family,
            result.weights,
            result.target.hardware,
            result.target.engine,
            result.target.provider,
            result.case.batch_size,
            result.case.seq_len,
            result.case.precision,
            result.precision,
            result.status,
            result.error,
            *stats,
            result.load_ms,
            result.first_run_ms,
            result.memory_load_mb,
            result.memory_peak_mb,
            result.device_memory_peak_mb,
            result.max_abs_diff,
            result.max_rel_diff,
            result.load_avg_1m,
            result.cpu_percent,
            git_sha,
            json.dumps(result.details, default=str),
        ]
        samples = pa.table(
            {
                "result_id": pa.array([result_id] * len(result.samples_ms), pa.string()),
                "iteration": pa.array(range(len(result.samples_ms)), pa.int32()),
                "latency_ms": pa.array(result.samples_ms, pa.float64()),
            }
        )
        cursor = self.connection
        cursor.execute("BEGIN TRANSACTION")
        try:
            cursor.execute(f"INSERT INTO results VALUES ({', '.join('?' * len(row))})", row)
            cursor.register("new_samples", samples)
            cursor.execute("INSERT INTO samples SELECT * FROM new_samples")
            cursor.unregister("new_samples")
            cursor.execute("COMMIT")
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        return result_id

    # --- reads --------------------------------------------------------------------------------
    def query(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        cursor = self.connection.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def resolve_run(self, selector: str) -> str:
        if selector == "latest":
            rows = self.query("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")
            if not rows:
                raise StoreError(f"{self.path} has no runs yet")
            return rows[0]["run_id"]
        if not self.query("SELECT 1 FROM runs WHERE run_id = ?", [selector]):
            recent = [r["run_id"] for r in self.query("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 5")]
            raise StoreError(f"no run '{selector}' in {self.path}; recent runs: {', '.join(recent) or 'none'}")
        return selector

    def run_info(self, run_id: str) -> dict[str, Any]:
        return self.query("SELECT * FROM runs WHERE run_id = ?", [run_id])[0]

    def hardware_rows(self, run_id: str) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM hardware WHERE run_id = ? ORDER BY platform", [run_id])

    def results(self, run_id: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT * FROM results WHERE run_id = ? ORDER BY family, model, hardware, engine, provider, "
            "batch_size, seq_len, created_at",
            [run_id],
        )

    def samples(self, result_id: str) -> list[float]:
        rows = self.connection.execute(
            "SELECT latency_ms FROM samples WHERE result_id = ? ORDER BY iteration", [result_id]
        ).fetchall()
        return [r[0] for r in rows]


def _open(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        message = str(exc)
        if "lock" in message.lower():
            raise StoreError(f"{path} is in use by another accelharness process: {message}") from exc
        raise StoreError(f"cannot open {path}: {message}") from exc
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {path} as a DuckDB database: {exc}") from exc


def open_store(path: Path = DEFAULT_DB, read_only: bool = False) -> Store:
    """Open (and on first write use, create) the store at `path`."""
    path = Path(path)
    if read_only and not path.exists():
        raise StoreError(f"no database at {path}; run a benchmark first or pass --db")
    store = Store(_open(path, read_only), path)
    if not read_only:
        store.ensure_schema()
    return store


def init_store(path: Path, overwrite: bool) -> None:
    """`accelharness db init`: create the schema; with overwrite, start from an empty file."""
    path = Path(path)
    if overwrite:
        for suffix in ("", ".wal"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    with open_store(path):
        pass


def result_as_dict(result: Result) -> dict[str, Any]:
    """A Result as plain data (for JSON output before it reaches the store)."""
    return asdict(result)
