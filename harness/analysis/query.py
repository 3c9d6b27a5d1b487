"""`accelharness query` and `accelharness export`: canned reports, read-only ad-hoc SQL, table exports.

Everything here reads the store through a read-only connection. Ad-hoc SQL is checked twice:
DuckDB's own parser must find exactly one SELECT (or EXPLAIN of a SELECT) statement, and the
connection it runs on is read-only with external access switched off and the configuration
locked, so neither a write nor an ATTACH/COPY/read_csv of another file can slip through.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from harness.analysis.machines import machines_table
from harness.analysis.options import EXPORT_FORMATS, EXPORT_TABLES, REPORTS  # declared with their options
from harness.analysis.tables import AnalysisError, Table
from harness.core.escaping import csv_cell
from harness.core.labels import case_label, target_label
from harness.core.paths import unwritable_directory
from harness.core.records import MEASURED, STATUSES
from harness.store import open_store

# a column per status, the measured ones first
COMPATIBILITY_COLUMNS = (*MEASURED, *(s for s in STATUSES if s not in MEASURED))
READ_TYPES = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)
# EXPLAIN [ANALYZE] [(options)] <statement>: the wrapped statement must itself be a read.
EXPLAIN_PREFIX = re.compile(r"^\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^)]*\)\s*)?", re.IGNORECASE)


# --- ad-hoc SQL --------------------------------------------------------------------------------
def check_read_only(sql: str) -> None:
    """Refuse anything but one SELECT / EXPLAIN-of-SELECT statement, using DuckDB's parser."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise AnalysisError(f"cannot parse --sql: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise AnalysisError(f"--sql takes exactly one SELECT statement (got {len(statements)} statements)")
    statement = statements[0]
    if statement.type not in READ_TYPES:
        # by its own first word: DuckDB files INSTALL under LOAD, and "LOAD statements" would name another one
        keyword = re.match(r"\s*((?:FORCE\s+)?[A-Za-z]+)", statement.query, re.IGNORECASE)
        named = keyword.group(1).upper() if keyword else statement.type.name
        raise AnalysisError(f"--sql is read-only: {named} statements are refused; use SELECT")
    if statement.type == duckdb.StatementType.EXPLAIN:
        inner = EXPLAIN_PREFIX.sub("", statement.query, count=1)
        try:
            wrapped = duckdb.extract_statements(inner)
        except duckdb.Error:
            wrapped = []
        if len(wrapped) != 1 or wrapped[0].type != duckdb.StatementType.SELECT:
            raise AnalysisError("--sql is read-only: EXPLAIN is allowed only around a SELECT")


def run_sql(db_path: Path, sql: str) -> Table:
    check_read_only(sql)
    with open_store(db_path, read_only=True) as store:
        # Defence in depth: no file access beyond the open database, and no way to turn it back on.
        store.connection.execute("SET enable_external_access = false")
        store.connection.execute("SET lock_configuration = true")
        try:
            cursor = store.connection.execute(sql)
            columns = [d[0] for d in cursor.description] if cursor.description else []
            rows = [dict(zip(columns, r, strict=True)) for r in cursor.fetchall()]
        except duckdb.Error as exc:
            raise AnalysisError(f"query failed: {str(exc).splitlines()[0]}") from None
    return Table("Query", columns, rows, [f"`{' '.join(sql.split())}`"])


# --- canned reports --------------------------------------------------------------------------
LATEST_COLUMNS = [
    "model", "family", "hardware", "engine", "provider", "device", "batch_size", "seq_len", "precision", "status",
    "latency_p50_ms", "throughput_per_s", "noisy", "max_abs_diff", "error",
]  # fmt: skip

BEST_SQL = """
WITH ranked AS (
    SELECT model, mode, new_tokens, batch_size, seq_len, precision, hardware, engine, provider, device, latency_p50_ms,
           noisy, row_number() OVER w_sorted AS rank, count(*) OVER w AS ok_targets,
           max(latency_p50_ms) OVER w AS slowest_p50_ms
    FROM results WHERE run_id = ? AND status = 'ok'
    WINDOW w AS (PARTITION BY model, mode, new_tokens, batch_size, seq_len, precision),
           w_sorted AS (w ORDER BY latency_p50_ms, hardware, engine, provider, device)
)
SELECT * EXCLUDE (rank) FROM ranked WHERE rank = 1 ORDER BY model, mode, new_tokens, batch_size, seq_len, precision
"""


def _latest(store: Any, run_id: str) -> Table:
    rows = store.results(run_id)
    for row in rows:
        row["error"] = row["error"].splitlines()[0][:120] if row["error"] else None
    return Table(f"Results of run {run_id}", LATEST_COLUMNS, rows)


def _best_hardware(store: Any, run_id: str) -> Table:
    rows = store.query(BEST_SQL, [run_id])
    for row in rows:
        row["target"] = target_label(row)
    columns = ["model", "mode", "batch_size", "seq_len", "precision", "target", "latency_p50_ms", "noisy", "ok_targets"]
    note = "Fastest target with status ok by median latency, per model, mode and case."
    return Table(f"Best hardware in run {run_id}", [*columns, "slowest_p50_ms"], rows, [note])


def _compatibility(store: Any, run_id: str) -> Table:
    counts = store.query(
        "SELECT family, mode, hardware, engine, provider, device, status, count(*) AS n FROM results WHERE run_id = ? "
        "GROUP BY ALL ORDER BY family, mode, hardware, engine, provider, device",
        [run_id],
    )
    table: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in counts:
        key = (row["family"], row["mode"], target_label(row))
        entry = table.setdefault(
            key, {"family": key[0], "mode": key[1], "target": key[2], **dict.fromkeys(COMPATIBILITY_COLUMNS, 0)}
        )
        entry[row["status"]] = entry.get(row["status"], 0) + row["n"]
    return Table(
        f"Compatibility in run {run_id}", ["family", "mode", "target", *COMPATIBILITY_COLUMNS], list(table.values())
    )


OPS_SQL = """
SELECT r.model, r.hardware, r.engine, r.provider, r.batch_size, r.seq_len, r.mode, r.new_tokens, r.precision,
       o.node, o.op_type, o.op_class, o.provider AS ran_on, o.kernel, o.calls / o.profile_iterations AS calls_per_iter,
       o.total_ms / o.profile_iterations AS ms_per_iter, o.share, o.flops, o.bytes, o.fallback
FROM operators o JOIN results r USING (result_id)
WHERE r.run_id = ?
ORDER BY r.model, r.hardware, r.engine, r.provider, r.batch_size, r.seq_len, r.precision, o.share DESC, o.node
"""
OPS_COLUMNS = [
    "model", "target", "case", "precision", "node", "op_type", "op_class", "ran_on", "kernel", "calls_per_iter",
    "ms_per_iter", "share", "flops", "bytes", "fallback",
]  # fmt: skip


def _ops(store: Any, run_id: str) -> Table:
    rows = store.query(OPS_SQL, [run_id])
    for row in rows:
        row["target"], row["case"] = target_label(row), case_label(row)
    notes = [
        "Per operator, from the profiled iterations run after each timed loop (--profile): share is of the "
        "result's operator time; flops and bytes are the ONNX graph's for the case's shapes (empty where no "
        "graph node stands behind the operator). fallback: ran on another provider than the target's."
    ]
    unprofiled = store.query(
        "SELECT model, hardware, engine, provider, batch_size, seq_len, mode, new_tokens, "
        "details->>'$.profile.error' AS why FROM results WHERE run_id = ? AND why IS NOT NULL ORDER BY ALL",
        [run_id],
    )
    notes += [f"not profiled: {target_label(r)} {r['model']} {case_label(r)}: {r['why']}" for r in unprofiled]
    if not rows and not unprofiled:
        notes.append("this run has no profiles: run with --profile")
    return Table(f"Operators in run {run_id}", OPS_COLUMNS, rows, notes)


def _regressions(db_path: Path, threshold: float) -> Table:
    from harness.analysis.compare import compare_runs, comparison_table  # compare renders through this module

    comparison = compare_runs(db_path, "previous", "latest", threshold)
    table = comparison_table(comparison)
    table.rows = [r for r in table.rows if r["verdict"] in ("regressed", "broken")]
    table.title = f"Regressions: {comparison.run_b} vs {comparison.run_a}"
    return table


def run_report(db_path: Path, report: str, run: str = "latest", threshold: float = 0.05) -> Table:
    """A canned report: latest, best-hardware, compatibility and ops read one run; regressions compares two;
    machines lists the machines the store holds runs of."""
    if report not in REPORTS:
        raise AnalysisError(f"unknown report '{report}'; valid: {', '.join(REPORTS)}")
    if report == "regressions":
        return _regressions(db_path, threshold)
    if report == "machines":  # the whole store: every machine it holds runs of
        return machines_table(db_path)
    with open_store(db_path, read_only=True) as store:
        run_id = store.resolve_run(run)
        builders = {"latest": _latest, "best-hardware": _best_hardware, "compatibility": _compatibility, "ops": _ops}
        builder = builders[report]
        return builder(store, run_id)


# --- export --------------------------------------------------------------------------------------
CSV_CELL_SQL = "accelharness_csv_cell"  # core.escaping.csv_cell as a DuckDB function, for the time of an export


def _csv_cells(values: pa.Array) -> pa.Array:
    return pa.array([None if v is None else csv_cell(v) for v in values.to_pylist()], pa.string())


def _csv_select(store: Any, table: str) -> str:
    """SELECT of every column of `table`, its text columns made safe by core.escaping.csv_cell itself (no control
    character; a cell a spreadsheet would run as a formula gets a leading quote); numbers stay numbers."""
    columns = []
    for column in store.query(f"DESCRIBE {table}"):
        name = '"' + column["column_name"].replace('"', '""') + '"'
        if column["column_type"] in ("VARCHAR", "JSON"):
            columns.append(f"{CSV_CELL_SQL}(CAST({name} AS VARCHAR)) AS {name}")
        else:
            columns.append(name)
    return f"SELECT {', '.join(columns)} FROM {table}"


def export_tables(db_path: Path, out_dir: Path, fmt: str, table: str = "all") -> list[Path]:
    """COPY each table to out_dir/<table>.<fmt> from a read-only connection."""
    if fmt not in EXPORT_FORMATS:
        raise AnalysisError(f"unknown export format '{fmt}'; valid: {', '.join(EXPORT_FORMATS)}")
    if table != "all" and table not in EXPORT_TABLES:
        raise AnalysisError(f"unknown table '{table}'; valid: {', '.join(EXPORT_TABLES)}, all")
    if why := unwritable_directory(out_dir):
        raise AnalysisError(f"--out {out_dir}: {why}; --out is the directory the tables are written to")
    names = EXPORT_TABLES if table == "all" else (table,)
    options = "FORMAT parquet" if fmt == "parquet" else "FORMAT csv, HEADER true"
    paths = []
    with open_store(db_path, read_only=True) as store:
        out_dir.mkdir(parents=True, exist_ok=True)
        copying = store.connection.cursor()  # a connection of its own, for the function it is lent
        copying.create_function(CSV_CELL_SQL, _csv_cells, ["VARCHAR"], "VARCHAR", type="arrow")
        try:
            for name in names:
                path = out_dir / f"{name}.{fmt}"
                quoted = str(path).replace("'", "''")  # COPY takes no parameter for its target
                select = _csv_select(store, name) if fmt == "csv" else f"SELECT * FROM {name}"
                copying.execute(f"COPY ({select}) TO '{quoted}' ({options})")
                paths.append(path)
        finally:  # a Python function left registered outlives the connection's objects at exit
            copying.remove_function(CSV_CELL_SQL)
            copying.close()
    return paths
