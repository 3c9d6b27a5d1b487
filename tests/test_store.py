"""The DuckDB store: schema, per-result commits with samples, and its refusals."""

import json
import re
from pathlib import Path

import duckdb
import pytest
from conftest import run_cli, run_cli_process, store_at_version

from harness.core.records import Case, Result, ResultError, Target
from harness.store import SCHEMA_VERSION, TABLES, StoreError, init_store, open_store


def _result(samples: list[float]) -> Result:
    return Result(
        model="m",
        family="embedding",
        weights="random",
        target=Target("cpu", "torch", "cpu"),
        case=Case(2, 16, "fp32"),
        status="ok",
        samples_ms=samples,
        load_ms=5.0,
        details={"k": 1},
    )


def test_schema_is_created_and_versioned(db: Path) -> None:
    init_store(db, overwrite=False)
    connection = duckdb.connect(str(db), read_only=True)
    tables = {r[0] for r in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert set(TABLES) <= tables
    assert connection.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    columns = {r[0] for r in connection.execute("DESCRIBE results").fetchall()}
    for needed in ("latency_p99_ms", "throughput_per_s", "max_abs_diff", "weights", "provider", "load_avg_1m"):
        assert needed in columns


def test_result_and_samples_are_stored_with_statistics(db: Path) -> None:
    with open_store(db) as store:
        run_id = store.start_run("test", {"a": 1}, {"git_sha": "abc"})
        result_id = store.add_result(run_id, _result([4.0, 1.0, 3.0, 2.0, 10.0]), "abc")
        store.finish_run(run_id, "completed")
        row = store.results(run_id)[0]
        assert row["result_id"] == result_id
        assert row["iterations"] == 5 and row["latency_p50_ms"] == 3.0 and row["latency_max_ms"] == 10.0
        assert row["throughput_per_s"] == pytest.approx(500.0)
        assert row["git_sha"] == "abc"
        assert store.samples(result_id) == [4.0, 1.0, 3.0, 2.0, 10.0]
        assert store.resolve_run("latest") == run_id


def test_operator_rows_are_stored_with_their_result(db: Path) -> None:
    """A profiled result's operator rows go in with it (same transaction) and come back per result."""
    from harness.core.profiles import OperatorRow

    rows = [
        OperatorRow("mm", "MatMul", "matmul", "CPUExecutionProvider", None, 3, 3, 6.0, 0.75, 2e6, 4e4, False),
        OperatorRow("shape", "Shape", "data", "CPUExecutionProvider", None, 3, 3, 2.0, 0.25, 0.0, 8.0, True),
    ]
    result = _result([1.0, 2.0])
    result.operators = rows
    with open_store(db) as store:
        run_id = store.start_run("test", {}, {})
        result_id = store.add_result(run_id, result, None)
        stored = store.query(
            "SELECT * EXCLUDE (result_id) FROM operators WHERE result_id = ? ORDER BY node", [result_id]
        )
    assert [OperatorRow(**row) for row in stored] == rows


def test_overwrite_starts_empty_and_unknown_run_is_named(db: Path) -> None:
    with open_store(db) as store:
        store.start_run("test", {}, {})
    init_store(db, overwrite=True)
    with open_store(db) as store:
        assert store.query("SELECT count(*) AS n FROM runs")[0]["n"] == 0
        with pytest.raises(StoreError, match="no runs yet"):
            store.resolve_run("latest")
        with pytest.raises(StoreError, match="no run 'nope'"):
            store.resolve_run("nope")


def test_corrupt_file_is_refused_clearly(db: Path) -> None:
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        open_store(db)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"samples_ms": [1.0, float("nan")]}, "samples_ms must hold finite numbers > 0 (1 do not, e.g. nan)"),
        ({"samples_ms": [1.0, 0.0]}, "samples_ms must hold finite numbers > 0"),
        ({"samples_ms": []}, "status 'ok' needs latency samples"),
        ({"status": "fine"}, "status 'fine' is not one of ok"),
        ({"status": "error"}, "status 'error' needs the reason in error"),
        ({"load_ms": float("inf")}, "load_ms must be a finite number or None (got inf)"),
        ({"max_abs_diff": float("nan")}, "max_abs_diff must be a finite number or None"),
        ({"cpu_percent": True}, "cpu_percent must be a finite number or None (got True)"),
        ({"model": ""}, "model must be a non-empty string"),
    ],
)
def test_a_result_that_breaks_an_invariant_is_refused(changes: dict, message: str) -> None:
    """Every Result built is checked (issue 11, item 11): no NaN, 0 ms or infinite figure, and no
    `ok` row without samples, ever reaches the store; results from Ray nodes are checked again."""
    fields = {
        "model": "m", "family": "embedding", "weights": "random", "target": Target("cpu", "torch", "cpu"),
        "case": Case(2, 16, "fp32"), "status": "ok", "samples_ms": [1.0, 2.0], "load_ms": 5.0,
    } | changes  # fmt: skip
    with pytest.raises(ResultError, match=re.escape(message)):
        Result(**fields)


def test_older_store_reads_as_migrated_and_is_left_unchanged(tmp_path: Path) -> None:
    """A schema-1 file (an older accelharness) read by a reading command: every current column is there,
    with the default its migration gives existing rows, and the file is not changed (no migration, no WAL)."""
    from conftest import run_cli

    from harness.store import SCHEMA

    db = tmp_path / "v1.duckdb"
    connection = duckdb.connect(str(db))
    connection.execute(SCHEMA)
    connection.execute("INSERT INTO schema_version VALUES (1, now())")
    connection.execute("INSERT INTO runs (run_id, started_at, status, command) VALUES ('old', now(), 'completed', 'x')")
    connection.execute(
        "INSERT INTO results (result_id, run_id, created_at, model, family, weights, hardware, engine, batch_size, "
        "requested_precision, precision, status) VALUES ('r', 'old', now(), 'm', 'embedding', 'random', 'cpu', "
        "'torch', 1, 'fp32', 'fp32', 'ok')"
    )
    connection.close()
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    sql = "SELECT mode, new_tokens, result_key, suite_id FROM results JOIN runs USING (run_id)"
    done = run_cli("query", "--sql", sql, "--format", "json", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"mode": "inference", "new_tokens": None, "result_key": None, "suite_id": None}]
    with open_store(db, read_only=True) as store:
        fresh = tmp_path / "fresh.duckdb"
        with open_store(fresh) as current:
            for table in TABLES:
                shape = f"SELECT column_name, column_type FROM (DESCRIBE {table})"
                assert store.query(shape) == current.query(shape)
        fresh.unlink()
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before


def test_newer_store_is_refused_for_reading_and_writing(db: Path) -> None:
    with open_store(db) as store:
        store.connection.execute("INSERT INTO schema_version VALUES (99, now())")
    for read_only in (True, False):
        with pytest.raises(StoreError, match=r"written by a newer accelharness \(schema version 99; this one reads"):
            open_store(db, read_only=read_only)


def test_one_run_selector_grammar(db: Path) -> None:
    """latest, previous, a run id, its unique start, a suite name, RUN,RUN and all: one grammar, in the store."""
    with open_store(db) as store:
        first = store.start_run("native", {}, {})
        nightly = store.start_run("suite", {}, {}, suite_id="nightly")
        last = store.start_run("web", {}, {})
        store.connection.execute(  # three distinct start times, whatever the clock's resolution
            "UPDATE runs SET started_at = started_at + to_seconds(CASE run_id WHEN ? THEN 0 WHEN ? THEN 1 ELSE 2 END)",
            [first, nightly],
        )
        assert store.resolve_run("latest") == last and store.resolve_run("previous") == nightly
        assert store.resolve_run(first) == first and store.resolve_run(first[:-2]) == first
        assert store.resolve_run("nightly") == nightly
        assert store.resolve_runs(f"{first}, latest") == [first, last]
        assert store.resolve_runs("all") == [first, nightly, last]
        with pytest.raises(StoreError, match=r"'20' starts 3 run ids .*: give more of the id"):
            store.resolve_run("20")
        with pytest.raises(StoreError, match="no run 'nope' .* a suite name\\); recent runs: " + last):
            store.resolve_run("nope")


def test_report_takes_the_same_selectors_as_compare(db: Path, tmp_path: Path) -> None:
    """`report --run previous` works as `compare previous latest` does."""
    with open_store(db) as store:
        older = store.start_run("native", {}, {})
        store.add_result(older, _result([1.0, 2.0]), None)
        store.start_run("native", {}, {})
        store.connection.execute("UPDATE runs SET started_at = started_at - INTERVAL 1 HOUR WHERE run_id = ?", [older])
    out = tmp_path / "previous.json"
    done = run_cli("report", "--run", "previous", "--db", str(db), "--format", "json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["run"]["run_id"] == older


def test_db_init_overwrite_refuses_a_file_that_is_not_a_store(tmp_path: Path) -> None:
    """`--overwrite` replaces a DuckDB store only: a text file given as --db by mistake is refused and
    left byte-identical (an empty file too); a DuckDB store is still replaced."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"my notes\n" * 100)
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (notes, empty):
        before = path.read_bytes()
        refused = run_cli_process("db", "init", "--overwrite", "--db", str(path))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "replaces a DuckDB store only" in " ".join(refused.stderr.split()), refused.stderr
        assert path.read_bytes() == before
    store = tmp_path / "store.duckdb"
    with open_store(store) as opened:
        opened.start_run("test", {}, {})
    replaced = run_cli("db", "init", "--overwrite", "--db", str(store))
    assert replaced.returncode == 0, replaced.stderr
    with open_store(store, read_only=True) as opened:
        assert opened.query("SELECT count(*) AS n FROM runs") == [{"n": 0}]


@pytest.mark.parametrize(
    "command",
    [
        ["db", "init"],
        ["db", "init", "--overwrite"],
        ["report"],
        ["query", "--sql", "SELECT 1"],
        ["models"],
        ["native", "--model", "bert-tiny"],
    ],
)
def test_a_directory_as_db_is_refused_by_name(tmp_path: Path, command: list[str]) -> None:
    directory = tmp_path / "results"
    directory.mkdir()
    done = run_cli(*command, "--db", str(directory))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and f"--db {directory}" in done.stderr, done.stderr
    assert list(directory.iterdir()) == []


def test_every_batch_row_s_output_text_is_stored_and_an_older_store_keeps_what_it_held(tmp_path: Path) -> None:
    """Issue 32: output_texts (v12) holds every batch row's text, output_text the first's as before. A v11 file
    reads (read-only, then migrated) with its output_text as it was and output_texts NULL (a second row's text was
    never stored: not made up); no content hash changes."""
    from harness.store import hash_results_sql

    db = tmp_path / "v11.duckdb"
    connection = store_at_version(db, 11)
    connection.execute("INSERT INTO runs (run_id, started_at, status, command) VALUES ('old', now(), 'completed', 'x')")
    for result_id, batch in (("one", 1), ("two", 2)):
        connection.execute(
            "INSERT INTO results (result_id, run_id, created_at, model, family, weights, hardware, engine, batch_size, "
            "requested_precision, precision, status, result_key, mode, output_text) VALUES (?, 'old', now(), 'm', "
            "'llm', 'random', 'cpu', 'onnxruntime', ?, 'fp32', 'fp32', 'ok', ?, 'generate', 'first text')",
            [result_id, batch, result_id],
        )
    connection.execute(hash_results_sql())
    hashes = connection.execute("SELECT result_id, content_hash FROM results ORDER BY result_id").fetchall()
    connection.close()
    sql = "SELECT result_id, output_text, output_texts, content_hash FROM results ORDER BY result_id"
    expected = [("one", "first text", None, hashes[0][1]), ("two", "first text", None, hashes[1][1])]
    with open_store(db, read_only=True) as store:
        assert [tuple(r.values()) for r in store.query(sql)] == expected
    with open_store(db) as store:
        assert [tuple(r.values()) for r in store.query(sql)] == expected
        store.connection.execute(hash_results_sql("result_id IS NOT NULL"))  # recomputed: the same hashes
        assert store.query("SELECT result_id, content_hash FROM results ORDER BY result_id") == [
            {"result_id": r, "content_hash": h} for r, h in hashes
        ]
        run_id = store.start_run("test", {}, {"git_sha": "abc"})
        result = _result([1.0])
        result.output_texts, result.output_text = ["a", "b"], "a"
        store.add_result(run_id, result, "abc")
        [row] = store.results(run_id)
        assert json.loads(row["output_texts"]) == ["a", "b"] and row["output_text"] == "a"
