"""Issue 30, items 1-5 and the bundle parts of 13: bundles from elsewhere are data, verified and bounded.

Every hostile bundle here is made from ONE genuine `export --bundle` of a real run: its tables read
with pyarrow, rewritten, and the manifest's sha256, bytes and row counts recomputed, so the bundle is
well-formed and only its content is hostile. Each is imported through the CLI: exit 2, one line
naming what was wrong, no traceback, and the store unchanged (a new one never created); in each test the first
through a real process, the others through the same app in this one (a Python start saved each)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CLI, QUICK, run_cli, run_cli_process

from harness.bundle.fmt import BundleError, file_sha256, read_bundle, write_bundle
from harness.core.bounds import MAX_BUNDLE_BYTES, MAX_BUNDLE_ROWS
from harness.store import open_store

Tables = dict[str, pa.Table]


@dataclass(frozen=True)
class Genuine:
    source: Path  # the store the run was measured into
    bundle: Path  # its export --bundle
    home: Path  # a store the genuine bundle was imported into: the one hostile bundles must leave alone


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory) -> Genuine:
    """One real tiny run, exported, and imported into a store of its own."""
    directory = tmp_path_factory.mktemp("genuine")
    source, bundle, home = directory / "source.duckdb", directory / "genuine.bundle", directory / "home.duckdb"
    case = ["--model", "bert-tiny", "--engines", "onnxruntime", "--batch-sizes", "1", "--sequence-lengths", "8"]
    done = run_cli("native", *case, *QUICK, "--db", str(source), "--no-reports", "--output-dir", str(directory / "out"))
    assert done.returncode == 0, done.stderr
    assert run_cli("export", "--bundle", str(bundle), "--db", str(source)).returncode == 0
    assert run_cli("import", str(bundle), "--db", str(home)).returncode == 0
    return Genuine(source, bundle, home)


def read_members(bundle: Path) -> tuple[dict[str, Any], Tables]:
    with zipfile.ZipFile(bundle) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        tables = {
            name.removesuffix(".parquet"): pq.read_table(pa.BufferReader(archive.read(name)))
            for name in archive.namelist()
            if name.endswith(".parquet")
        }
    return manifest, tables


def craft(
    genuine: Path,
    out: Path,
    change: Callable[[Tables], None] | None = None,
    manifest_change: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """The genuine bundle with its tables changed by `change`, written again as export writes one
    (Parquet, zstd, stored in the zip), its manifest's sha256, bytes and rows recomputed."""
    manifest, tables = read_members(genuine)
    if change is not None:
        change(tables)
    directory = out.with_name(out.name + ".tables")
    directory.mkdir()
    files = {}
    for table, rows in tables.items():
        path = directory / f"{table}.parquet"
        pq.write_table(rows, path, compression="zstd")
        files[table] = path
        manifest["files"][f"{table}.parquet"] = {
            "sha256": file_sha256(path), "rows": rows.num_rows, "bytes": path.stat().st_size,
        }  # fmt: skip
    if manifest_change is not None:
        manifest_change(manifest)
    write_bundle(out, manifest, files)
    return out


def set_column(tables: Tables, table: str, column: str, edit: Callable[[list[Any]], list[Any]], kind=None) -> None:
    rows = tables[table]
    field = rows.schema.get_field_index(column)
    kind = kind or rows.schema.field(column).type
    tables[table] = rows.set_column(field, pa.field(column, kind), pa.array(edit(rows[column].to_pylist()), kind))


def set_cell(tables: Tables, table: str, column: str, row: int, value: Any, kind=None) -> None:
    def edit(values: list[Any]) -> list[Any]:
        values[row] = value
        return values

    set_column(tables, table, column, edit, kind)


def scale_latencies(tables: Tables, factor: float) -> None:
    set_column(tables, "samples", "latency_ms", lambda values: [v * factor for v in values])
    for column in tables["results"].column_names:
        if column.startswith("latency_") and column not in ("latency_cv",):
            set_column(tables, "results", column, lambda values: [None if v is None else v * factor for v in values])


def snapshot(db: Path) -> dict[str, Any]:
    """What a store holds: every row of every run table, as text."""
    with open_store(db, read_only=True) as store:
        return {
            table: sorted(map(str, store.connection.execute(f"SELECT * FROM {table}").fetchall()))
            for table in ("runs", "hardware", "results", "samples", "operators", "controls", "imports")
        }


@pytest.fixture
def store(genuine: Genuine, tmp_path: Path) -> Path:
    """A copy of the store holding the genuine run: what a refused import must leave as it was."""
    copy = tmp_path / "store.duckdb"
    shutil.copy(genuine.home, copy)
    return copy


def refused(bundle: Path, db: Path, *needles: str, real: bool = True) -> str:
    """Import `bundle` into `db` through the CLI: exit 2, one line holding every needle, no traceback,
    the store as it was (or, for a new file, none made). `real`: in a process of its own (each test keeps
    one such), else through the app in this process."""
    before = snapshot(db) if db.exists() else None
    done = (run_cli_process if real else run_cli)("import", str(bundle), "--db", str(db))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "\x1b" not in done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr
    if before is None:
        assert sorted(p.name for p in db.parent.iterdir() if p.name.startswith((db.name, f".{db.name}"))) == []
    else:
        assert snapshot(db) == before
    return done.stderr


def test_a_rewritten_genuine_bundle_still_imports(genuine: Genuine, tmp_path: Path) -> None:
    """The crafting itself changes nothing that matters: unchanged rows written again import (their
    hash recomputed from the rows agrees), as a `--redact public` export of the run does."""
    same = craft(genuine.bundle, tmp_path / "same.bundle")
    done = run_cli("import", str(same), "--db", str(tmp_path / "a.duckdb"))
    assert done.returncode == 0 and "1 results (5 samples) added" in done.stdout, done.stderr
    public = tmp_path / "public.bundle"
    assert run_cli("export", "--bundle", str(public), "--redact", "public", "--db", str(genuine.source)).returncode == 0
    done = run_cli("import", str(public), "--db", str(tmp_path / "b.duckdb"))
    assert done.returncode == 0 and "1 results (5 samples) added" in done.stdout, done.stderr


# --- item 1: a hash is recomputed, never taken as given ----------------------------------------------------------


def test_a_forged_result_keeping_the_genuine_hash_is_refused_and_the_genuine_one_imports(
    genuine: Genuine, tmp_path: Path
) -> None:
    forged = craft(genuine.bundle, tmp_path / "forged.bundle", lambda tables: scale_latencies(tables, 10))
    result_id = read_members(genuine.bundle)[1]["results"]["result_id"][0].as_py()
    db = tmp_path / "new.duckdb"
    refused(forged, db, "results.parquet row 1, column content_hash", result_id, "its rows hash to")
    done = run_cli("import", str(genuine.bundle), "--db", str(db))
    assert done.returncode == 0 and "1 results (5 samples) added" in done.stdout, done.stderr


# --- item 2: bounded reading -------------------------------------------------------------------------------------


def bzip2_bundle(genuine: Path, out: Path, size: int) -> Path:
    """The genuine bundle with samples.parquet replaced by `size` bytes of zeros, bzip2-compressed
    (written in chunks: never `size` bytes in memory), the manifest declaring its true sha256 and size."""
    manifest, _ = read_members(genuine)
    digest = hashlib.sha256()
    with zipfile.ZipFile(genuine) as source, zipfile.ZipFile(out, "w") as archive:
        info = zipfile.ZipInfo("samples.parquet")
        info.compress_type = zipfile.ZIP_BZIP2
        with archive.open(info, "w", force_zip64=True) as member:
            chunk = bytes(2**20)
            for _ in range(size // len(chunk)):
                member.write(chunk)
                digest.update(chunk)
        manifest["files"]["samples.parquet"] |= {"sha256": digest.hexdigest(), "bytes": size}
        archive.writestr("manifest.json", json.dumps(manifest))
        for name in source.namelist():
            if name not in ("manifest.json", "samples.parquet"):
                archive.writestr(name, source.read(name))
    return out


# The CLI in a child of a fresh Python, which prints the child's peak memory (KiB) once it has ended.
PEAK = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.stderr.write(done.stderr); "
    "sys.exit(done.returncode)"
)


def test_a_1_gib_bzip2_member_is_refused_before_it_is_inflated(genuine: Genuine, store: Path, tmp_path: Path) -> None:
    """Issue 30's 26 KB bundle that took 2.2 GB: refused by the member's compression, read from the zip's
    directory, so the CLI's peak memory stays that of a bare import (under 300 MB)."""
    bomb = bzip2_bundle(genuine.bundle, tmp_path / "bomb.bundle", 2**30)
    assert bomb.stat().st_size < 2**20
    before = snapshot(store)
    done = subprocess.run(
        [sys.executable, "-c", PEAK, *CLI, "import", str(bomb), "--db", str(store)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "samples.parquet is compressed (zip method 12" in done.stderr and "stored" in done.stderr
    assert int(done.stdout) < 300 * 1024, f"peak {int(done.stdout) // 1024} MiB"
    assert snapshot(store) == before


def test_sizes_and_row_counts_are_bounded_before_reading(genuine: Genuine, store: Path, tmp_path: Path) -> None:
    """A file over the bound (sparse: nothing is written), a manifest declaring more rows than a table
    may hold (as a well-formed bundle of 20,000,000 samples would), a member whose size is not the one
    declared: each refused from sizes and counts alone."""
    huge = tmp_path / "huge.bundle"
    with open(huge, "wb") as sparse:
        sparse.truncate(MAX_BUNDLE_BYTES + 1)
    refused(huge, store, f"a bundle is at most {MAX_BUNDLE_BYTES:,}")

    def many_rows(manifest: dict[str, Any]) -> None:
        manifest["files"]["samples.parquet"]["rows"] = 20_000_000

    many = craft(genuine.bundle, tmp_path / "many.bundle", manifest_change=many_rows)
    refused(many, store, "samples.parquet", f"at most {MAX_BUNDLE_ROWS:,} in a table", real=False)

    def other_size(manifest: dict[str, Any]) -> None:
        manifest["files"]["results.parquet"]["bytes"] += 1

    resized = craft(genuine.bundle, tmp_path / "resized.bundle", manifest_change=other_size)
    refused(resized, store, "results.parquet is", "its manifest says", real=False)
    crowded = tmp_path / "crowded.bundle"
    shutil.copy(genuine.bundle, crowded)
    with zipfile.ZipFile(crowded, "a") as archive:
        for number in range(10_000):
            archive.writestr(f"{number}", b"")
    refused(crowded, store, "holds 10,008 members; a bundle holds at most 8", real=False)


def test_tables_larger_once_decompressed_than_a_bundle_may_hold_are_refused(
    genuine: Genuine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables' data size once decompressed, as their Parquet metadata declares it, is held to the same
    bound as the file: a result whose details are 1 MB of one letter (a few hundred bytes compressed),
    the bound lowered to just above the bundle's file size."""
    padded = json.dumps({"pad": "x" * 2**20})
    bundle = craft(genuine.bundle, tmp_path / "padded.bundle", lambda t: set_cell(t, "results", "details", 0, padded))
    monkeypatch.setattr("harness.bundle.fmt.MAX_BUNDLE_BYTES", bundle.stat().st_size + 1)
    (tmp_path / "x").mkdir()
    with pytest.raises(BundleError, match="bytes of data once decompressed"):
        read_bundle(bundle, tmp_path / "x")


# --- item 3: samples within their result's iterations --------------------------------------------------------------


def test_more_samples_than_the_results_iterations_are_refused(genuine: Genuine, store: Path, tmp_path: Path) -> None:
    def more_samples(tables: Tables) -> None:
        samples = tables["samples"]
        extra = pa.concat_tables([samples] * 10)
        count = extra.num_rows
        tables["samples"] = extra.set_column(
            extra.schema.get_field_index("iteration"), "iteration", pa.array(range(count), pa.int32())
        )

    bundle = craft(genuine.bundle, tmp_path / "more.bundle", more_samples)
    refused(bundle, store, "results.parquet row 1, column iterations", "iterations 5) has 50 samples")


# --- item 4: every row passes the checks a fresh one does ----------------------------------------------------------


def rename_run(tables: Tables, run_id: str) -> None:
    for table in ("runs", "results", "hardware", "controls", "ceilings"):
        set_column(tables, table, "run_id", lambda values: [run_id] * len(values))


INVALID = {
    "status": (lambda t: set_cell(t, "results", "status", 0, "bogus"), "results.parquet row 1, column status: 'bogus'"),
    "batch": (lambda t: set_cell(t, "results", "batch_size", 0, -5), "column batch_size: '-5' is not valid"),
    "audio": (  # --audio-seconds past Whisper's window (harness.core.bounds.MAX_AUDIO_SECONDS)
        lambda t: set_cell(t, "results", "audio_seconds", 0, 31, pa.int32()),
        "column audio_seconds: '31' is not valid (valid: NULL or 1 to 30)",
    ),
    "nan": (lambda t: set_cell(t, "samples", "latency_ms", 2, math.nan), "samples.parquet row 3, column latency_ms"),
    "negative": (lambda t: set_cell(t, "samples", "latency_ms", 0, -1.0), "samples.parquet row 1, column latency_ms"),
    "inf": (lambda t: set_cell(t, "samples", "latency_ms", 4, math.inf), "samples.parquet row 5, column latency_ms"),
    "run id path": (lambda t: rename_run(t, "../../x/victim"), "runs.parquet row 1, column run_id: '../../x/victim'"),
    "result id path": (
        lambda t: [
            set_cell(t, "results", "result_id", 0, "a/b"),
            set_column(t, "samples", "result_id", lambda v: ["a/b"] * len(v)),
        ],
        "results.parquet row 1, column result_id: 'a/b'",
    ),
    "label escape": (
        lambda t: set_cell(t, "runs", "machine_label", 0, "\x1b]0;owned\x07lab", pa.string()),
        "runs.parquet row 1, column machine_label: 'lab' is not valid",
    ),
    "error missing": (
        lambda t: [set_cell(t, "results", "status", 0, "error"), set_cell(t, "results", "error", 0, None, pa.string())],
        "column error: NULL is not valid (valid: the reason of a status not ok)",
    ),
}


@pytest.mark.parametrize("fault", INVALID, ids=list(INVALID))
def test_invalid_rows_are_refused_naming_member_row_and_column(
    genuine: Genuine, store: Path, tmp_path: Path, fault: str
) -> None:
    change, needle = INVALID[fault]
    bundle = craft(genuine.bundle, tmp_path / "invalid.bundle", change)
    refused(bundle, store, needle, "nothing was imported", real=fault == next(iter(INVALID)))


# --- item 5: a duplicate key, a wrong type, a NULL: exit 2, no traceback ------------------------------------------


def duplicate_result(tables: Tables) -> None:
    tables["results"] = pa.concat_tables([tables["results"]] * 2)


def wrong_type(tables: Tables) -> None:
    set_column(tables, "results", "batch_size", lambda values: ["many"] * len(values), pa.string())


MALFORMED = {
    "duplicate id": (duplicate_result, "results.parquet row 2, column result_id", "a second row of the same result_id"),
    "wrong type": (wrong_type, "results.parquet row 1, column batch_size: 'many' is VARCHAR, not INTEGER", ""),
    "null status": (
        lambda t: set_cell(t, "results", "status", 0, None),
        "results.parquet row 1, column status: NULL",
        "",
    ),
}


@pytest.mark.parametrize("fault", MALFORMED, ids=list(MALFORMED))
def test_a_duplicate_a_wrong_type_or_a_null_exits_2_naming_it(
    genuine: Genuine, store: Path, tmp_path: Path, fault: str
) -> None:
    change, *needles = MALFORMED[fault]
    bundle = craft(genuine.bundle, tmp_path / "malformed.bundle", change)
    refused(bundle, store, *needles, real=fault == next(iter(MALFORMED)))


# --- item 13, the bundle parts ------------------------------------------------------------------------------------


def run_status(db: Path) -> str:
    with open_store(db, read_only=True) as store:
        return store.query("SELECT status FROM runs")[0]["status"]


def test_a_later_bundle_moves_a_run_forward_to_completed_never_back(genuine: Genuine, tmp_path: Path) -> None:
    """A bundle exported while the run was interrupted, then one of the completed run: the store ends
    with it completed; the interrupted bundle again leaves it completed."""
    interrupted = craft(genuine.bundle, tmp_path / "interrupted.bundle",
                        lambda t: set_cell(t, "runs", "status", 0, "interrupted"))  # fmt: skip
    db = tmp_path / "s.duckdb"
    assert run_cli("import", str(interrupted), "--db", str(db)).returncode == 0
    assert run_status(db) == "interrupted"
    assert run_cli("import", str(genuine.bundle), "--db", str(db)).returncode == 0
    assert run_status(db) == "completed"
    assert run_cli("import", str(interrupted), "--db", str(db)).returncode == 0
    assert run_status(db) == "completed"


def test_merge_into_a_hard_link_of_a_source_is_refused(genuine: Genuine, tmp_path: Path) -> None:
    first, second = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    shutil.copy(genuine.source, first)
    shutil.copy(genuine.home, second)
    linked = tmp_path / "h.duckdb"
    os.link(first, linked)
    before = first.read_bytes()
    done = run_cli_process("merge", str(first), str(second), "--db", str(linked))
    assert done.returncode == 2 and "is one of the stores to merge" in done.stderr and "Traceback" not in done.stderr
    assert first.read_bytes() == before


def test_a_kill_importing_into_a_new_file_leaves_no_store(genuine: Genuine, tmp_path: Path) -> None:
    db = tmp_path / "new.duckdb"
    process = subprocess.Popen(
        [*CLI, "import", str(genuine.bundle), "--db", str(db)], stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ACCELHARNESS_INJECT_FAULT": "import-hang"},
    )  # fmt: skip
    assert "holding the transaction" in process.stderr.readline()  # every row added, none committed
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not db.exists() and not Path(f"{db}.wal").exists()
    assert (tmp_path / f".new.duckdb.importing-{process.pid}").exists()  # what the killed import left
    done = run_cli("import", str(genuine.bundle), "--db", str(db))  # and the next import makes it whole
    assert done.returncode == 0 and db.exists() and not Path(f"{db}.wal").exists()
    assert list(tmp_path.glob(".new.duckdb.importing-*")) == []  # the killed import's partial file removed
    assert run_status(db) == "completed"


def test_a_bool_schema_version_and_a_duplicated_member_are_refused(
    genuine: Genuine, store: Path, tmp_path: Path
) -> None:
    def bool_version(manifest: dict[str, Any]) -> None:
        manifest["schema_version"] = True

    refused(craft(genuine.bundle, tmp_path / "bool.bundle", manifest_change=bool_version), store,
            "needs whole numbers bundle_format and schema_version")  # fmt: skip
    twice = tmp_path / "twice.bundle"  # seven members as a bundle has, samples.parquet in place of controls.parquet
    with zipfile.ZipFile(genuine.bundle) as source, zipfile.ZipFile(twice, "w") as archive, pytest.warns(UserWarning):
        for name in source.namelist():
            archive.writestr(name if name != "controls.parquet" else "samples.parquet", source.read(name))
    refused(twice, store, "holds 'samples.parquet' twice", real=False)
