"""The DuckDB store: one file, a versioned schema, and this process as its only writer.

Each result and its raw samples are committed in one transaction as soon as the result
arrives, so an interrupted run keeps everything it finished. Samples go in through Arrow.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import statistics
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pyarrow as pa

from harness.core.bounds import MAX_ID_CHARS
from harness.core.generation import summarize_generation
from harness.core.git import branch_tip
from harness.core.labels import ceiling_owner_sql
from harness.core.records import WORK_FIELDS, Ceiling, Control, Result
from harness.core.roofline import ceiling_figures, precision_class_sql
from harness.core.stats import summarize

DEFAULT_DB = Path("accelharness.duckdb")
# A run's life, in order: a later copy of a run (a newer bundle of it) moves it forward, never back.
RUN_STATUSES = ("running", "interrupted", "completed")
# What names a run, a result, a machine or a served device, and travels in bundles: never a path (no
# separator, and no '..' anywhere), never a terminal escape. Every id this harness makes fits it (run
# ids, uuids, hashes, machine ids and labels, device ids); an imported row's must (harness.bundle.checks).
IDENTIFIER = f"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_ID_CHARS - 1}}}"


def is_identifier_sql(column: str) -> str:
    """The SQL condition that `column` holds an identifier (NULL for a NULL)."""
    return f"(regexp_full_match({column}, '{IDENTIFIER}') AND NOT contains({column}, '..'))"


ALL_RUNS = "all"  # the run selector for every run in the store
LATEST_ON = "latest-on-"  # latest-on-<branch>: the newest run made at a branch's tip

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

# A result's content hash covers what was measured: these columns and its samples. Not its result_id
# (a local name), its details or error text (notes that --redact public rewrites), so a redacted copy
# of a result is the same result. Listed, not "every column", so a later column changes no stored hash.
RESULT_CONTENT_COLUMNS = (
    "run_id", "result_key", "created_at", "model", "family", "weights", "hardware", "engine", "provider", "device",
    "variant", "batch_size", "seq_len", "mode", "new_tokens", "requested_precision", "precision", "status",
    "iterations", "latency_mean_ms", "latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms",
    "latency_min_ms", "latency_max_ms", "latency_std_ms", "latency_cv", "noisy", "throughput_per_s", "load_ms",
    "first_run_ms", "compile_ms", "memory_load_mb", "memory_peak_mb", "device_memory_peak_mb", "max_abs_diff",
    "max_rel_diff", "load_avg_1m", "cpu_percent", "energy_j_per_item", "ttft_ms", "tpot_ms", "tokens_per_s",
    "prefill_tokens_per_s", "decode_tokens_per_s", "tpot_p90_ms", "generated_tokens", "tokens_matched", "git_sha",
)  # fmt: skip
SAMPLE_CONTENT_COLUMNS = ("iteration", "latency_ms", "ttft_ms", "tpot_ms", "steps_ms", "round")


def _text(column: str) -> str:
    return f"coalesce(CAST({column} AS VARCHAR), '\\N')"  # NULL is not the empty string


def hash_results_sql(where: str = "content_hash IS NULL") -> str:
    """Set content_hash on the results rows matching `where` (a condition on results; a `?` in it is
    bound twice): sha256 over RESULT_CONTENT_COLUMNS and the samples in iteration order. The one
    definition, for new rows, the migration and bundles."""
    fields = ", ".join(_text(f"r.{name}") for name in RESULT_CONTENT_COLUMNS)
    sample = "concat_ws(',', " + ", ".join(_text(name) for name in SAMPLE_CONTENT_COLUMNS) + ")"
    return f"""UPDATE results SET content_hash = hashed.hash FROM (
        SELECT r.result_id, sha256(concat_ws('|', {fields}, coalesce(s.samples, ''))) AS hash
        FROM results r LEFT JOIN (
            SELECT result_id, string_agg({sample}, ';' ORDER BY iteration) AS samples FROM samples
            WHERE result_id IN (SELECT result_id FROM results WHERE {where}) GROUP BY result_id
        ) s USING (result_id) WHERE r.{where}
    ) hashed WHERE results.result_id = hashed.result_id"""


# A machine's hardware class: CPU model, GPU model (the run's available cuda/rocm devices), the GPU
# driver's major version and memory rounded to a power of two GiB. Two runs of one class may be
# compared; across classes `compare` asks for --across-machines.
CLASSIFY_RUNS_SQL = """UPDATE runs SET
    gpu_model = coalesce(gpu_model, (SELECT string_agg(DISTINCT h.device_name, ', ' ORDER BY h.device_name)
        FROM hardware h WHERE h.run_id = runs.run_id AND h.platform IN ('cuda', 'rocm') AND h.available)),
    hardware_class = concat_ws(' · ', coalesce(cpu_model, 'unknown CPU'),
        coalesce(gpu_model, (SELECT string_agg(DISTINCT h.device_name, ', ' ORDER BY h.device_name)
            FROM hardware h WHERE h.run_id = runs.run_id AND h.platform IN ('cuda', 'rocm') AND h.available),
            'no GPU') || coalesce(' (driver ' || gpu_driver_major || ')', ''),
        coalesce(CAST(CAST(pow(2, round(log2(greatest(memory_gb, 0.5)))) AS INTEGER) AS VARCHAR) || ' GiB',
            'unknown memory'))
    WHERE hardware_class IS NULL"""
# A run made before run ids were global: its uuid derived from what it was stored with, so the same old
# run migrated in two stores (or arriving in an older bundle) has the same uuid in both.
BACKFILL_RUN_UUID_SQL = """UPDATE runs SET run_uuid = substr(sha256(concat_ws('|', run_id,
    CAST(started_at AS VARCHAR), coalesce(hostname, ''), coalesce(command, ''))), 1, 32) WHERE run_uuid IS NULL"""
IDENTITY_BACKFILL = [BACKFILL_RUN_UUID_SQL, CLASSIFY_RUNS_SQL, hash_results_sql()]

# What a result's figures of work become (harness.core.roofline): its achieved rates, and their fractions
# of the ceiling measured on its own target in its own run (the latest, should a resumed run have two).
# The one definition, for new rows, a ceiling that arrives after them, and bundles (recomputed on import).
ROOFLINE_COLUMNS = ("achieved_gbps", "achieved_gflops", "bandwidth_fraction", "compute_fraction")


# Whose ceilings a row is held against (harness.core.labels.ceiling_owner, in SQL): its own target's; a page
# runtime's on its EP, onnxruntime-web's there (the one runtime with calibration graphs); a native GGUF runtime's on
# the CPU at N threads, ONNX Runtime's CPU EP's at N threads.
CEILING_ENGINE_SQL, CEILING_PROVIDER_SQL = ceiling_owner_sql("results.")
CEILING_OWNER_BARE_SQL = ceiling_owner_sql()  # the same over a bare `results` (an UPDATE's own columns)


# Every column a ceiling is stored with, in add_ceiling's order (version 10's, then 14's)
CEILING_COLUMNS = ("run_id", "hardware", "engine", "provider", "device", "kind", "precision", "workload", "amount",
                   "measured_at", "iterations", "value", "spread", "samples_ms", "software_adapter", "load_avg_1m",
                   "error", "budget_ms", "sizing", "software", "calibration_s", "reused_from")  # fmt: skip


def _ceiling_sql(kind: str, precision: str) -> str:
    return (
        "(SELECT arg_max(c.value, c.measured_at) FROM ceilings c WHERE c.run_id = results.run_id "
        f"AND c.hardware = results.hardware AND c.engine = {CEILING_ENGINE_SQL} AND c.provider IS NOT DISTINCT FROM "
        f"{CEILING_PROVIDER_SQL} AND c.device IS NOT DISTINCT FROM results.device AND c.kind = '{kind}' "
        f"AND c.precision = {precision} AND c.value > 0)"
    )


def roofline_sql(where: str) -> list[str]:
    """The statements that set ROOFLINE_COLUMNS on the results rows matching `where` (a condition on results;
    `?` in it bound once per statement)."""
    rates = """UPDATE results SET
        achieved_gbps = CASE mode WHEN 'generate' THEN bytes_per_token * decode_tokens_per_s
            WHEN 'inference' THEN bytes_per_item * throughput_per_s END / 1e9,
        achieved_gflops = CASE mode WHEN 'generate' THEN prefill_flops_per_token * prefill_tokens_per_s
            WHEN 'inference' THEN flops_per_item * throughput_per_s END / 1e9"""
    bandwidth = _ceiling_sql("bandwidth", "'bytes'")
    compute = _ceiling_sql("compute", precision_class_sql("results.precision"))
    fractions = f"""UPDATE results SET bandwidth_fraction = achieved_gbps / {bandwidth},
        compute_fraction = achieved_gflops / {compute}"""
    return [f"{rates} WHERE {where}", f"{fractions} WHERE {where}"]


# Versioned migrations: version N's statements bring a version N-1 file up to N. A new file gets
# SCHEMA (version 1) and then every migration, so old and new files end with the same columns.
MIGRATIONS: dict[int, list[str]] = {
    2: [
        # generation and training modes (ttft/tpot/tokens per second), JAX compile time, energy
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS mode VARCHAR DEFAULT 'inference'",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS new_tokens INTEGER",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS ttft_ms DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS tpot_ms DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS tokens_per_s DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS compile_ms DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS energy_j_per_item DOUBLE",
        "ALTER TABLE samples ADD COLUMN IF NOT EXISTS ttft_ms DOUBLE",
        "ALTER TABLE samples ADD COLUMN IF NOT EXISTS tpot_ms DOUBLE",
    ],
    3: [
        # suites: --resume continues a suite's unfinished run, skipping the result keys it holds
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS suite_id VARCHAR",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS result_key VARCHAR",
    ],
    4: [
        # --profile: per-operator rows of a result, summed over its profiled iterations (harness.core.profiles)
        """CREATE TABLE IF NOT EXISTS operators (
            result_id VARCHAR NOT NULL, node VARCHAR NOT NULL, op_type VARCHAR NOT NULL, op_class VARCHAR NOT NULL,
            provider VARCHAR, kernel VARCHAR, profile_iterations INTEGER NOT NULL, calls INTEGER NOT NULL,
            total_ms DOUBLE NOT NULL, share DOUBLE NOT NULL, flops DOUBLE, bytes DOUBLE, fallback BOOLEAN NOT NULL
        )""",
    ],
    5: [
        # web --serve: a browser on another device is a target of the run (its id; facts in details)
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS device VARCHAR",
    ],
    6: [
        # `ab`: which side a row measured, and the round each of its samples was taken in
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS variant VARCHAR",
        "ALTER TABLE samples ADD COLUMN IF NOT EXISTS round INTEGER",
        # the drift control (harness.run.control): the machine's own speed at points of each run
        """CREATE TABLE IF NOT EXISTS controls (
            run_id VARCHAR NOT NULL, workload VARCHAR NOT NULL, hardware VARCHAR NOT NULL, engine VARCHAR NOT NULL,
            provider VARCHAR, device VARCHAR, beside VARCHAR NOT NULL, position VARCHAR NOT NULL,
            measured_at TIMESTAMP NOT NULL, iterations INTEGER NOT NULL, median_ms DOUBLE, samples_ms DOUBLE[],
            load_avg_1m DOUBLE, error VARCHAR
        )""",
    ],
    7: [
        # generation by phase (harness.core.generation): pp and tg rates, TPOT p90, every decode step per
        # generation, the token ids generated and how many agree with native ORT's greedy tokens. The
        # version-2 tokens_per_s (a rate over whole generations, prefill folded in) is no longer written.
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS prefill_tokens_per_s DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS decode_tokens_per_s DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS tpot_p90_ms DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS generated_tokens JSON",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS tokens_matched INTEGER",
        "ALTER TABLE samples ADD COLUMN IF NOT EXISTS steps_ms DOUBLE[]",
    ],
    8: [
        # issue 26, one block: identity that survives travel between stores. A run's global uuid, the
        # machine that made it (an id from hardware facts and the store's salt, a label, a hardware
        # class), each result's content hash; the store's own facts (its salt) and the import log.
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS run_uuid VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS machine_id VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS machine_label VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS gpu_model VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS gpu_driver_major VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS hardware_class VARCHAR",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS content_hash VARCHAR",
        "CREATE TABLE IF NOT EXISTS store_info (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
        """CREATE TABLE IF NOT EXISTS imports (
            bundle_sha256 VARCHAR NOT NULL, bundle_name VARCHAR, imported_at TIMESTAMP NOT NULL,
            bundle_format INTEGER NOT NULL, schema_version INTEGER NOT NULL, exported_by VARCHAR, redacted VARCHAR,
            runs_added INTEGER NOT NULL, results_added INTEGER NOT NULL, results_skipped INTEGER NOT NULL,
            samples_added BIGINT NOT NULL
        )""",
        *IDENTITY_BACKFILL,
    ],
    9: [
        # issue 32: a native row's intra-op threads (--native-threads, or the engine's default read back) and
        # whether its idle threads spin (NULL: the engine has no such setting); the browser's are in its provider
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS native_threads INTEGER",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS spinning BOOLEAN",
        # issue 32: a generate row's prompt ids, its decoded output text and the EOS policy that ran
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS prompt_ids JSON",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS output_text VARCHAR",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS stop_at_eos BOOLEAN",
        # issue 32: a generation's tokens checked on the same graph names its reference (engine and file), and
        # a row at another precision than fp32 its quality beside the fp32 graph on the same sequence
        # (harness.prepare.quality): top-1 agreement and the mean KL(P_fp32 || P_row), in nats.
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS token_reference VARCHAR",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS agreement_top1 DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS kl_mean DOUBLE",
    ],
    10: [
        # issue 34: decode at a KV-cache depth (part of the result key), the work a row's graph implies
        # (harness.core.graph_cost), its achieved rates and their fractions of its target's measured ceilings
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS depth INTEGER",
        *(f"ALTER TABLE results ADD COLUMN IF NOT EXISTS {name} DOUBLE" for name in WORK_FIELDS),
        *(f"ALTER TABLE results ADD COLUMN IF NOT EXISTS {name} DOUBLE" for name in ROOFLINE_COLUMNS),
        # each target's measured ceilings (harness.run.ceilings): value in GB/s or GFLOP/s at the fastest sample
        """CREATE TABLE IF NOT EXISTS ceilings (
            run_id VARCHAR NOT NULL, hardware VARCHAR NOT NULL, engine VARCHAR NOT NULL, provider VARCHAR,
            device VARCHAR, kind VARCHAR NOT NULL, precision VARCHAR NOT NULL, workload VARCHAR NOT NULL,
            amount DOUBLE NOT NULL, measured_at TIMESTAMP NOT NULL, iterations INTEGER NOT NULL, value DOUBLE,
            spread DOUBLE, samples_ms DOUBLE[], software_adapter BOOLEAN NOT NULL, load_avg_1m DOUBLE, error VARCHAR
        )""",
    ],
    11: [
        # issue 35: encoder–decoder generation (T5, Whisper): the encoder's run (median ms, inside TTFT) and, for
        # speech, the real-time factor (audio seconds over the median generation's seconds); NULL elsewhere
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS encoder_ms DOUBLE",
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS real_time_factor DOUBLE",
    ],
    12: [
        # issue 32: every batch row's decoded output text, a JSON list of strings (output_text, v9, holds the
        # first row's alone and keeps it, so older readers and bundles read what they did; not a content column:
        # no stored hash changes). NULL on an older row (read-only views show it so too): readers fall back to
        # output_text, the one text such a row stored.
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS output_texts JSON",
    ],
    13: [
        # issue 35: a speech generation's audio length (--audio-seconds, part of result_key); NULL: the encoder's
        # whole window, or not speech
        "ALTER TABLE results ADD COLUMN IF NOT EXISTS audio_seconds INTEGER",
    ],
    14: [
        # issue 46: a ceiling sized by time (harness.run.ceilings): the time one run was sized to fit and how its
        # size was chosen; what measured it (engine, browser, adapter), its calibration's own seconds, and the run
        # that measured it where this run reused it (measured_at then stays the original's: harness.run.ceiling_reuse)
        "ALTER TABLE ceilings ADD COLUMN IF NOT EXISTS budget_ms DOUBLE",
        "ALTER TABLE ceilings ADD COLUMN IF NOT EXISTS sizing VARCHAR",
        "ALTER TABLE ceilings ADD COLUMN IF NOT EXISTS software VARCHAR",
        "ALTER TABLE ceilings ADD COLUMN IF NOT EXISTS calibration_s DOUBLE",
        "ALTER TABLE ceilings ADD COLUMN IF NOT EXISTS reused_from VARCHAR",
    ],
}
SCHEMA_VERSION = max(MIGRATIONS)
# Tables a migration created: a read-only open of an older file shows them empty.
ADDED_TABLES = {"operators": 4, "controls": 6, "store_info": 8, "imports": 8, "ceilings": 10}

TABLES = ("schema_version", "runs", "hardware", "results", "samples", "operators", "controls", "store_info", "imports",
          "ceilings")  # fmt: skip
# What a run is made of: the tables a bundle carries (the store's own facts and log stay home).
RUN_TABLES = ("runs", "hardware", "results", "samples", "operators", "controls", "ceilings")
# Each run table's rows that belong to the chosen runs (the registered table `chosen` holds their ids):
# what a bundle carries, and what a store scoped to one machine holds.
RUN_ROWS = {
    "runs": "SELECT * FROM runs WHERE run_id IN (SELECT run_id FROM chosen)",
    "hardware": "SELECT * FROM hardware WHERE run_id IN (SELECT run_id FROM chosen)",
    "results": "SELECT * FROM results WHERE run_id IN (SELECT run_id FROM chosen)",
    "samples": "SELECT s.* FROM samples s JOIN results r USING (result_id) "
    "WHERE r.run_id IN (SELECT run_id FROM chosen)",
    "operators": "SELECT o.* FROM operators o JOIN results r USING (result_id) "
    "WHERE r.run_id IN (SELECT run_id FROM chosen)",
    "controls": "SELECT * FROM controls WHERE run_id IN (SELECT run_id FROM chosen)",
    "ceilings": "SELECT * FROM ceilings WHERE run_id IN (SELECT run_id FROM chosen)",
}
MACHINE_COLUMNS = "runs.machine_id, runs.machine_label, runs.hardware_class"  # a result row read with its machine
MACHINE_SALT = "machine_salt"  # store_info key: the random salt of this store's machine ids


class StoreError(RuntimeError):
    """The database cannot be used (locked by another writer, corrupt, newer schema)."""


class StoreLockedError(StoreError):
    """Another process has the database file open (DuckDB allows one writer, or readers only)."""


class StoreWriteError(StoreError):
    """A write DuckDB could not make (a full disk, an I/O error): the run stops; what it committed stays."""

    def __init__(self, message: str, disk_full: bool) -> None:
        super().__init__(message)
        self.disk_full = disk_full


def _mount_point(path: Path) -> Path:
    where = path.absolute().parent
    while not os.path.ismount(where):
        where = where.parent
    return where


def _write_failure(path: Path, exc: duckdb.Error) -> StoreWriteError:
    """One line: the file, DuckDB's reason, and the disk it is on with its free space."""
    mount = _mount_point(path)
    free_mib = shutil.disk_usage(mount).free / 2**20
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    disk = f"the disk mounted at {mount} has {free_mib:.1f} MiB free"
    full = "no space left on device" in str(exc).lower()  # DuckDB passes on the OS's words, not its errno
    return StoreWriteError(f"cannot write to {path}: {reason} ({disk})", disk_full=full)


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

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write DuckDB fails (a full disk) becomes one StoreWriteError naming the disk, not DuckDB's chain."""
        try:
            yield
        except duckdb.Error as exc:
            raise _write_failure(self.path, exc) from None

    # --- schema -------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the tables on first use and apply any migrations the file has not had."""
        version = _stored_version(self.connection)
        _refuse_newer(self.path, version)
        self.connection.execute(SCHEMA)
        if version is None:
            self.connection.execute("INSERT INTO schema_version VALUES (1, ?)", [_now()])
        for target in range((version or 1) + 1, SCHEMA_VERSION + 1):
            self.connection.execute("BEGIN TRANSACTION")
            for statement in MIGRATIONS[target]:
                self.connection.execute(statement)
            self.connection.execute("INSERT INTO schema_version VALUES (?, ?)", [target, _now()])
            self.connection.execute("COMMIT")

    def read_as_current(self) -> None:
        """A read-only open: refuse a newer schema, and show an older file as if it were migrated,
        through temporary views that add the missing columns with their defaults. The file is not
        changed; the next command that writes to it migrates it in place."""
        version = _stored_version(self.connection)
        if version is None:
            raise StoreError(f"{self.path} is not an accelharness store (it has no schema version)")
        _refuse_newer(self.path, version)
        if version == SCHEMA_VERSION:
            return
        catalog = quoted(self.connection.execute("SELECT current_database()").fetchone()[0])
        stored: dict[str, set[str]] = {}
        for table, column in self.connection.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database()"
        ).fetchall():
            stored.setdefault(table, set()).add(column)
        for table, columns in current_columns().items():
            added = table not in stored and version < ADDED_TABLES.get(table, 1)
            if table not in stored and not added:
                raise StoreError(f"{self.path} is not an accelharness store (it has no '{table}' table)")
            present = set() if added else stored[table]
            select = ", ".join(
                quoted(name) if name in present else f"CAST({default or 'NULL'} AS {kind}) AS {quoted(name)}"
                for name, kind, default in columns
            )
            source = "WHERE false" if added else f"FROM {catalog}.main.{quoted(table)}"
            self.connection.execute(f"CREATE TEMP VIEW {quoted(table)} AS SELECT {select} {source}")

    # --- writes -------------------------------------------------------------------------------
    def machine_salt(self) -> str:
        """This store's random salt for machine ids (made on first use): a machine id is not derivable
        from public hardware facts alone, and two stores on one machine name it differently."""
        row = self.connection.execute("SELECT value FROM store_info WHERE key = ?", [MACHINE_SALT]).fetchone()
        if row:
            return row[0]
        salt = uuid.uuid4().hex
        self.connection.execute("INSERT INTO store_info VALUES (?, ?)", [MACHINE_SALT, salt])
        return salt

    def start_run(
        self,
        command: str,
        arguments: dict[str, Any],
        host: dict[str, Any],
        suite_id: str | None = None,
        machine: dict[str, Any] | None = None,
    ) -> str:
        """Open a run; `machine` holds machine_id, machine_label and gpu_driver_major (harness.run.machine)."""
        run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        machine = machine or {}
        self.connection.execute(
            "INSERT INTO runs (run_id, started_at, finished_at, status, command, arguments, git_sha, harness_version,"
            " hostname, platform, python_version, cpu_model, cpu_cores, memory_gb, host, suite_id, run_uuid,"
            " machine_id, machine_label, gpu_driver_major)"
            " VALUES (?, ?, NULL, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                run_id,
                _now(),
                command,
                json.dumps(as_stored(arguments)),
                host.get("git_sha"),
                host.get("harness_version"),
                host.get("hostname"),
                host.get("platform"),
                host.get("python_version"),
                host.get("cpu_model"),
                host.get("cpu_cores"),
                host.get("memory_gb"),
                json.dumps(host, default=str),
                suite_id,
                uuid.uuid4().hex,
                machine.get("machine_id"),
                machine.get("machine_label"),
                machine.get("gpu_driver_major"),
            ],
        )
        self.connection.execute(CLASSIFY_RUNS_SQL)
        return run_id

    def reopen_run(self, run_id: str) -> None:
        """--resume: the run is running again; its finished results stay and are not repeated."""
        self.connection.execute("UPDATE runs SET finished_at = NULL, status = 'running' WHERE run_id = ?", [run_id])

    def finish_run(self, run_id: str, status: str) -> None:
        with self._writing():
            self.connection.execute(
                "UPDATE runs SET finished_at = ?, status = ? WHERE run_id = ?", [_now(), status, run_id]
            )

    def add_hardware(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        if not rows:  # a browser-only run probes no native platform
            return
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
        # the run's class names its GPUs, known from these rows: classified again
        self.connection.execute("UPDATE runs SET hardware_class = NULL WHERE run_id = ?", [run_id])
        self.connection.execute(CLASSIFY_RUNS_SQL)

    def add_result(self, run_id: str, result: Result, git_sha: str | None) -> str:
        """Commit one result with its samples; returns its result_id."""
        result_id = uuid.uuid4().hex
        if self.query("SELECT 1 FROM results WHERE run_id = ? AND result_key = ?", [run_id, result.key]):
            raise StoreError(f"run {run_id} already holds a result for {result.key}; a result is never stored twice")
        columns = self._result_columns(result_id, run_id, result, git_sha)
        samples = pa.table(
            {
                "result_id": pa.array([result_id] * len(result.samples_ms), pa.string()),
                "iteration": pa.array(range(len(result.samples_ms)), pa.int32()),
                "latency_ms": pa.array(result.samples_ms, pa.float64()),
                "ttft_ms": pa.array(result.ttft_samples_ms or [None] * len(result.samples_ms), pa.float64()),
                "tpot_ms": pa.array(result.tpot_samples_ms or [None] * len(result.samples_ms), pa.float64()),
                "round": pa.array(result.sample_rounds or [None] * len(result.samples_ms), pa.int32()),
                "steps_ms": pa.array(result.step_samples_ms or [None] * len(result.samples_ms), pa.list_(pa.float64())),
            }
        )
        with self._writing():
            self._commit_result(result_id, columns, samples, result)
        return result_id

    def _commit_result(self, result_id: str, columns: dict[str, Any], samples: pa.Table, result: Result) -> None:
        cursor = self.connection
        cursor.execute("BEGIN TRANSACTION")
        try:
            cursor.execute(
                f"INSERT INTO results ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                list(columns.values()),
            )
            cursor.register("new_samples", samples)
            cursor.execute("INSERT INTO samples BY NAME SELECT * FROM new_samples")
            cursor.unregister("new_samples")
            if result.operators:
                cursor.register("new_operators", _operator_table(result_id, result))
                cursor.execute("INSERT INTO operators BY NAME SELECT * FROM new_operators")
                cursor.unregister("new_operators")
            cursor.execute(hash_results_sql("result_id = ?"), [result_id, result_id])
            for statement in roofline_sql("result_id = ?"):
                cursor.execute(statement, [result_id])
            cursor.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.TransactionException):  # a COMMIT that failed has rolled back already
                cursor.execute("ROLLBACK")
            raise

    @staticmethod
    def _result_columns(result_id: str, run_id: str, result: Result, git_sha: str | None) -> dict[str, Any]:
        summary = summarize(result.samples_ms, result.case.batch_size)
        stats: dict[str, Any] = {}
        if summary is not None:
            stats = {
                "iterations": summary.iterations,
                "latency_mean_ms": summary.mean_ms,
                "latency_p50_ms": summary.median_ms,
                "latency_p90_ms": summary.p90_ms,
                "latency_p95_ms": summary.p95_ms,
                "latency_p99_ms": summary.p99_ms,
                "latency_min_ms": summary.min_ms,
                "latency_max_ms": summary.max_ms,
                "latency_std_ms": summary.std_ms,
                "latency_cv": summary.cv,
                "noisy": summary.noisy,
                "throughput_per_s": summary.throughput_per_s,
            }
        generation = summarize_generation(result)
        return {
            "result_id": result_id,
            "result_key": result.key,
            "run_id": run_id,
            "created_at": _now(),
            "model": result.model,
            "family": result.family,
            "weights": result.weights,
            "hardware": result.target.hardware,
            "engine": result.target.engine,
            "provider": result.target.provider,
            "device": result.target.device,
            "variant": result.variant,
            "batch_size": result.case.batch_size,
            "seq_len": result.case.seq_len,
            "mode": result.case.mode,
            "new_tokens": result.case.new_tokens,
            "requested_precision": result.case.precision,
            "precision": result.precision,
            "status": result.status,
            "error": result.error,
            **stats,
            **generation,
            "load_ms": result.load_ms,
            "first_run_ms": result.first_run_ms,
            "compile_ms": result.compile_ms,
            "memory_load_mb": result.memory_load_mb,
            "memory_peak_mb": result.memory_peak_mb,
            "device_memory_peak_mb": result.device_memory_peak_mb,
            "max_abs_diff": result.max_abs_diff,
            "max_rel_diff": result.max_rel_diff,
            "load_avg_1m": result.load_avg_1m,
            "cpu_percent": result.cpu_percent,
            "energy_j_per_item": result.energy_j_per_item,
            "depth": result.case.depth,
            "audio_seconds": result.case.audio_seconds,
            **{name: getattr(result, name) for name in WORK_FIELDS},
            "generated_tokens": None if result.generated_tokens is None else json.dumps(result.generated_tokens),
            "tokens_matched": result.details.get("tokens_matched"),
            "native_threads": result.details.get("native_threads"),
            "spinning": result.details.get("spinning"),
            "prompt_ids": None if result.prompt_ids is None else json.dumps(result.prompt_ids),
            "output_text": result.output_text,
            "output_texts": None if result.output_texts is None else json.dumps(result.output_texts),
            "stop_at_eos": result.stop_at_eos,
            "token_reference": result.details.get("token_reference"),
            "agreement_top1": result.details.get("agreement_top1"),
            "kl_mean": result.details.get("kl_mean"),
            "git_sha": git_sha,
            "details": json.dumps(result.details, default=str),
        }

    def add_control(self, run_id: str, control: Control) -> None:
        """Commit one measurement of the drift control (one row, with its samples)."""
        target = control.target
        median = statistics.median(control.samples_ms) if control.samples_ms else None
        with self._writing():
            self.connection.execute(
                "INSERT INTO controls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    run_id, control.workload, target.hardware, target.engine, target.provider, target.device,
                    control.beside, control.position, _now(), len(control.samples_ms), median,
                    control.samples_ms, control.load_avg_1m, control.error,
                ],
            )  # fmt: skip

    def add_ceiling(self, run_id: str, ceiling: Ceiling) -> None:
        """Commit one measured ceiling with its samples, then the fractions of the run's rows on its target."""
        target = ceiling.target
        value, spread = ceiling_figures(ceiling.amount, ceiling.samples_ms)
        engine, provider = CEILING_OWNER_BARE_SQL  # the rows held against this target's ceilings
        on_target = (f"run_id = ? AND hardware = ? AND {engine} = ? AND {provider} IS NOT DISTINCT FROM ? "
                     "AND device IS NOT DISTINCT FROM ?")  # fmt: skip
        with self._writing():
            self.connection.execute("BEGIN TRANSACTION")
            self.connection.execute(
                f"INSERT INTO ceilings ({', '.join(CEILING_COLUMNS)}) VALUES ({', '.join('?' * len(CEILING_COLUMNS))})",
                [
                    run_id, target.hardware, target.engine, target.provider, target.device, ceiling.kind,
                    ceiling.precision, ceiling.workload, ceiling.amount, ceiling.measured_at or _now(),
                    len(ceiling.samples_ms), value, spread, ceiling.samples_ms, ceiling.software_adapter,
                    ceiling.load_avg_1m, ceiling.error, ceiling.budget_ms, ceiling.sizing, ceiling.software,
                    ceiling.calibration_s, ceiling.reused_from,
                ],
            )  # fmt: skip
            for statement in roofline_sql(on_target):
                self.connection.execute(statement, [run_id, target.hardware, target.engine, target.provider,
                                                    target.device])  # fmt: skip
            self.connection.execute("COMMIT")

    def ceilings(self, run_id: str) -> list[dict[str, Any]]:
        """The run's measured ceilings, in the order they were taken."""
        return self.query("SELECT * FROM ceilings WHERE run_id = ? ORDER BY measured_at", [run_id])

    # --- reads --------------------------------------------------------------------------------
    def query(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        cursor = self.connection.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def resolve_run(self, selector: str, cwd: Path | None = None) -> str:
        """The run a selector names, in the one grammar every command taking a run reads: latest |
        previous (the run before latest) | latest-on-<branch> (the newest run made at the branch's tip,
        as git in cwd resolves it) | a run id | a suite name (its newest run) | a unique start of a run id."""
        if selector in ("latest", "previous"):
            newest = self.query("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 2")
            if not newest:
                raise StoreError(f"{self.path} has no runs yet")
            if selector == "previous" and len(newest) < 2:
                raise StoreError(f"'previous' needs two runs; {self.path} has 1")
            return newest[0 if selector == "latest" else 1]["run_id"]
        if selector.startswith(LATEST_ON):
            return self._latest_on(selector.removeprefix(LATEST_ON), cwd)
        if self.query("SELECT 1 FROM runs WHERE run_id = ?", [selector]):
            return selector
        newest_first = "ORDER BY started_at DESC"
        if suite := self.query(f"SELECT run_id FROM runs WHERE suite_id = ? {newest_first} LIMIT 1", [selector]):
            return suite[0]["run_id"]
        rows = self.query(f"SELECT run_id FROM runs WHERE starts_with(run_id, ?) {newest_first}", [selector])
        starting = [r["run_id"] for r in rows]
        if len(starting) == 1:
            return starting[0]
        if starting:
            raise StoreError(
                f"'{selector}' starts {len(starting)} run ids ({', '.join(starting[:5])}): give more of the id"
            )
        recent = [r["run_id"] for r in self.query(f"SELECT run_id FROM runs {newest_first} LIMIT 5")]
        raise StoreError(
            f"no run '{selector}' in {self.path} (a run is latest, previous, latest-on-<branch>, a run id or its "
            f"start, or a suite name); recent runs: {', '.join(recent) or 'none'}"
        )

    def resolve_runs(self, selector: str, cwd: Path | None = None) -> list[str]:
        """Several runs: 'all' (every run, oldest first) or RUN,RUN,… (each a selector), else the one run."""
        if selector == ALL_RUNS:
            runs = [r["run_id"] for r in self.query("SELECT run_id FROM runs ORDER BY started_at")]
            if not runs:
                raise StoreError(f"{self.path} has no runs yet")
            return runs
        return [self.resolve_run(part.strip(), cwd) for part in selector.split(",")]

    def _latest_on(self, branch: str, cwd: Path | None) -> str:
        try:
            tip = branch_tip(branch, cwd)
        except LookupError as exc:
            raise StoreError(str(exc)) from None
        for row in self.query("SELECT run_id, git_sha FROM runs ORDER BY started_at DESC"):
            if (row["git_sha"] or "").removesuffix("-dirty").startswith(tip):
                return row["run_id"]
        raise StoreError(f"no run in {self.path} was made at {branch}'s tip {tip[:12]}")

    def unfinished_run(self, suite_id: str) -> tuple[str, dict[str, Any]] | None:
        """The suite's latest run and its arguments, when it did not complete (Ctrl-C: interrupted;
        kill -9: still 'running')."""
        rows = self.query(
            "SELECT run_id, status, arguments FROM runs WHERE suite_id = ? ORDER BY started_at DESC LIMIT 1",
            [suite_id],
        )
        if not rows or rows[0]["status"] == "completed":
            return None
        return rows[0]["run_id"], json.loads(rows[0]["arguments"])

    def unfinished_run_like(self, command: str, arguments: dict[str, Any]) -> str | None:
        """The latest run of `command` with exactly these arguments, when it did not complete."""
        expected = as_stored(arguments)
        for row in self.query(
            "SELECT run_id, status, arguments FROM runs WHERE command = ? ORDER BY started_at DESC", [command]
        ):
            if json.loads(row["arguments"]) == expected:
                return row["run_id"] if row["status"] != "completed" else None
        return None

    def result_keys(self, run_id: str) -> set[str]:
        return {r["result_key"] for r in self.query("SELECT result_key FROM results WHERE run_id = ?", [run_id])}

    def fresh_keys(self, suite_id: str, since: datetime) -> set[str]:
        """The result keys this suite measured at or after `since` (--older-than re-runs the rest)."""
        rows = self.query(
            "SELECT DISTINCT r.result_key FROM results r JOIN runs USING (run_id) WHERE runs.suite_id = ? "
            "AND r.created_at >= ? AND r.result_key IS NOT NULL",
            [suite_id, since],
        )
        return {r["result_key"] for r in rows}

    def run_info(self, run_id: str) -> dict[str, Any]:
        return self.query("SELECT * FROM runs WHERE run_id = ?", [run_id])[0]

    def hardware_rows(self, run_id: str) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM hardware WHERE run_id = ? ORDER BY platform", [run_id])

    def results(self, run_id: str) -> list[dict[str, Any]]:
        return self.query(
            f"SELECT results.*, {MACHINE_COLUMNS} FROM results JOIN runs USING (run_id) WHERE run_id = ? "
            "ORDER BY family, model, hardware, engine, provider, batch_size, seq_len, created_at",
            [run_id],
        )

    def controls(self, run_id: str) -> list[dict[str, Any]]:
        """The run's drift-control measurements, in the order they were taken."""
        return self.query("SELECT * FROM controls WHERE run_id = ? ORDER BY measured_at", [run_id])

    def rounds(self, result_id: str) -> dict[int, list[float]]:
        """An `ab` row's samples by the round they were taken in (empty for other rows)."""
        rows = self.connection.execute(
            "SELECT round, latency_ms FROM samples WHERE result_id = ? AND round IS NOT NULL ORDER BY iteration",
            [result_id],
        ).fetchall()
        by_round: dict[int, list[float]] = {}
        for number, latency in rows:
            by_round.setdefault(number, []).append(latency)
        return by_round

    def steps(self, result_id: str) -> list[list[float]]:
        """A generate row's decode-step times, one list per timed generation (empty for other rows)."""
        rows = self.connection.execute(
            "SELECT steps_ms FROM samples WHERE result_id = ? AND steps_ms IS NOT NULL ORDER BY iteration",
            [result_id],
        ).fetchall()
        return [list(r[0]) for r in rows]

    def samples(self, result_id: str) -> list[float]:
        rows = self.connection.execute(
            "SELECT latency_ms FROM samples WHERE result_id = ? ORDER BY iteration", [result_id]
        ).fetchall()
        return [r[0] for r in rows]


def _operator_table(result_id: str, result: Result) -> pa.Table:
    """A result's operator rows (dataclasses of harness.core.profiles) as an Arrow table."""
    rows = [asdict(op) for op in result.operators]
    columns = {name: [row[name] for row in rows] for name in rows[0]}
    return pa.table({"result_id": [result_id] * len(rows), **columns})


def as_stored(arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments as start_run stores them (JSON, paths as strings), to compare with a stored run's."""
    return json.loads(json.dumps(arguments, default=str))


def _stored_version(connection: duckdb.DuckDBPyConnection) -> int | None:
    """The file's schema version; None for a file without one (new, or not an accelharness store)."""
    try:
        row = connection.execute("SELECT max(version) FROM schema_version").fetchone()
    except duckdb.CatalogException:
        return None
    return row[0] if row else None


def _refuse_newer(path: Path, version: int | None) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer accelharness (schema version {version}; this one reads versions "
            f"1-{SCHEMA_VERSION}): upgrade accelharness to use it"
        )


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.cache
def _schema_columns() -> tuple[tuple[str, str, str, str | None, bool], ...]:
    """Every (table, column, type, default, nullable) of a file of this version: SCHEMA and every migration,
    applied to an empty database in memory, so the columns are never listed twice."""
    with duckdb.connect() as memory:
        Store(memory, Path(":memory:")).ensure_schema()
        return tuple(memory.execute(
            "SELECT table_name, column_name, data_type, column_default, is_nullable FROM duckdb_columns() "
            "WHERE database_name = current_database() ORDER BY table_name, column_index"
        ).fetchall())  # fmt: skip


def current_columns() -> dict[str, list[tuple[str, str, str | None]]]:
    """Each table's (column, type, default) in a file of this version."""
    columns: dict[str, list[tuple[str, str, str | None]]] = {}
    for table, name, kind, default, _nullable in _schema_columns():
        columns.setdefault(table, []).append((name, kind, default))
    return columns


def required_columns() -> dict[str, set[str]]:
    """Each table's NOT NULL columns in a file of this version."""
    required: dict[str, set[str]] = {}
    for table, name, _kind, _default, nullable in _schema_columns():
        if not nullable:
            required.setdefault(table, set()).add(name)
    return required


def refuse_directory(path: Path) -> None:
    """A directory given as --db is named as one (DuckDB would say only that it cannot read it)."""
    if path.is_dir():
        raise StoreError(f"--db {path} is a directory; --db takes a DuckDB file (e.g. {path / DEFAULT_DB.name})")


def _open(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    refuse_directory(path)
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        message = str(exc)
        if "lock" in message.lower():
            holder = re.search(r"PID (\d+)", message)
            who = _holder(int(holder.group(1))) if holder else "another process"
            raise StoreLockedError(
                f"database {path} is locked by {who} (one writer per file: wait for it to finish, or use "
                f"another --db); DuckDB said: {message}"
            ) from exc
        raise StoreError(f"cannot open {path}: {message}") from exc
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {path} as a DuckDB database: {exc}") from exc


def _holder(pid: int) -> str:
    """PID N and its command line, when this user may read it: the process to wait for, or to stop."""
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return f"PID {pid}"
    return f"PID {pid} ({command[:200]})" if command else f"PID {pid}"


def open_store(path: Path = DEFAULT_DB, read_only: bool = False) -> Store:
    """Open (and on first write use, create or migrate) the store at `path`. Read-only, a file of an
    older schema reads as migrated (the file unchanged); a newer one is refused."""
    path = Path(path)
    if read_only and not path.exists():
        raise StoreError(f"no database at {path}; run a benchmark first or pass --db")
    store = Store(_open(path, read_only), path)
    try:
        if read_only:
            store.read_as_current()
        else:
            store.ensure_schema()
    except BaseException:
        store.close()
        raise
    return store


# Every DuckDB database file holds these bytes at this offset (after the header block's checksum).
DUCKDB_MAGIC, DUCKDB_MAGIC_OFFSET = b"DUCK", 8


def is_duckdb_file(path: Path) -> bool:
    """Whether `path` is a file that starts like a DuckDB database (a corrupt one included)."""
    try:
        with path.open("rb") as file:
            file.seek(DUCKDB_MAGIC_OFFSET)
            return file.read(len(DUCKDB_MAGIC)) == DUCKDB_MAGIC
    except OSError:
        return False


def init_store(path: Path, overwrite: bool) -> None:
    """`accelharness db init`: create the schema; with overwrite, start from an empty file.

    Overwrite deletes a DuckDB file only (a text file given as --db by mistake is refused, untouched),
    and only while this process holds DuckDB's write lock on it: a file another process has open
    (writing, or reading) is refused with that process's PID, never deleted."""
    path = Path(path)
    refuse_directory(path)
    if overwrite and path.exists():
        if not is_duckdb_file(path):
            raise StoreError(
                f"--overwrite replaces a DuckDB store only, and {path} is not one (no DuckDB header); it was "
                "left untouched: move it away, or choose another --db"
            )
        try:
            holding = _open(path, read_only=False)
        except StoreLockedError:
            raise
        except StoreError:  # a corrupt DuckDB file: no DuckDB process can have it open
            holding = None
        try:
            for suffix in ("", ".wal"):
                Path(str(path) + suffix).unlink(missing_ok=True)
        finally:
            if holding is not None:
                holding.close()
    with open_store(path):
        pass


def result_as_dict(result: Result) -> dict[str, Any]:
    """A Result as plain data (for JSON output before it reaches the store)."""
    return asdict(result)


def copy_runs(source: Store, target: duckdb.DuckDBPyConnection, run_ids: list[str]) -> None:
    """Copy every row of the runs `run_ids` from `source` into `target`, a store of the current schema (a
    source of an older one is read as current: its missing columns stay NULL until IDENTITY_BACKFILL, run
    after, gives them the migration's own values)."""
    source.connection.register("chosen", pa.table({"run_id": pa.array(run_ids, pa.string())}))
    try:
        for table in RUN_TABLES:
            rows = source.connection.sql(RUN_ROWS[table]).to_arrow_table()
            target.register("incoming", rows)
            target.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming")
            target.unregister("incoming")
    finally:
        source.connection.unregister("chosen")
    for statement in IDENTITY_BACKFILL:
        target.execute(statement)
