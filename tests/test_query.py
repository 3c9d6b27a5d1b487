"""query (canned reports, read-only SQL) and export, on two real small runs of an .onnx file."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import duckdb
import pytest
from conftest import QUICK, run_cli, run_cli_process
from test_cli import _tiny_onnx
from test_native_run import rows

from harness.analysis.compare import compare_runs
from harness.analysis.query import check_read_only
from harness.analysis.tables import AnalysisError

# The commands that read the store run the app in this process (a Python start is ~0.8 s of CPU), except one real
# CLI call per test, which proves the process itself answers (and, for a refusal, exits 2 without a traceback).
RUN = ["--hardware", "cpu,openvino", "--batch-sizes", "1,2", "--sequence-lengths", "8", *QUICK]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two runs of tanh.onnx: ORT CPU and OpenVINO ok, torch unsupported, batch 1 and 2."""
    directory = tmp_path_factory.mktemp("query")
    model, db = directory / "tanh.onnx", directory / "q.duckdb"
    _tiny_onnx(model)
    for _ in range(2):
        done = run_cli(
            "native", "--model-path", str(model), *RUN, "--db", str(db), "--no-reports", "--output-dir", str(directory)
        )
        assert done.returncode == 0, done.stderr
    run_ids = [r["run_id"] for r in rows(db, "SELECT run_id FROM runs ORDER BY started_at")]
    return db, run_ids


def query_json(db: Path, *args: str, cli=run_cli) -> list[dict]:
    done = cli("query", *args, "--db", str(db), "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_latest_report_is_the_latest_runs_results(store) -> None:
    db, run_ids = store
    report = query_json(db, "--report", "latest", cli=run_cli)
    expected = rows(db, f"SELECT * FROM results WHERE run_id = '{run_ids[1]}'")
    assert len(report) == len(expected) == 6
    assert sorted((r["engine"], r["batch_size"], r["status"]) for r in report) == sorted(
        (r["engine"], r["batch_size"], r["status"]) for r in expected
    )
    p50 = {(r["engine"], r["batch_size"]): r["latency_p50_ms"] for r in expected}
    assert all(r["latency_p50_ms"] == p50[(r["engine"], r["batch_size"])] for r in report)
    assert {r["error"] for r in report if r["engine"] == "torch"} == {"not applicable: the model is an .onnx file"}


def test_best_hardware_is_the_fastest_ok_target(store) -> None:
    db, run_ids = store
    report = query_json(db, "--report", "best-hardware", "--run", run_ids[0])
    assert [r["batch_size"] for r in report] == [1, 2]
    for row in report:
        candidates = rows(
            db,
            f"SELECT * FROM results WHERE run_id = '{run_ids[0]}' AND status = 'ok' "
            f"AND batch_size = {row['batch_size']} ORDER BY latency_p50_ms",
        )
        fastest = candidates[0]
        assert row["latency_p50_ms"] == fastest["latency_p50_ms"]
        assert row["target"].startswith(f"{fastest['hardware']}/{fastest['engine']}")
        assert row["ok_targets"] == len(candidates) == 2
        assert row["slowest_p50_ms"] == candidates[-1]["latency_p50_ms"]


def test_compatibility_counts_statuses_per_family_and_target(store) -> None:
    db, _ = store
    done = run_cli("query", "--report", "compatibility", "--db", str(db), "--format", "csv")
    assert done.returncode == 0, done.stderr
    table = {r["target"]: r for r in csv.DictReader(io.StringIO(done.stdout))}
    assert set(table) == {"cpu/onnxruntime:CPUExecutionProvider", "cpu/torch", "openvino/openvino:CPU"}
    assert {r["family"] for r in table.values()} == {"embedding"}
    assert table["cpu/torch"]["unsupported"] == "2" and table["cpu/torch"]["ok"] == "0"
    assert table["cpu/onnxruntime:CPUExecutionProvider"]["ok"] == "2"
    assert table["openvino/openvino:CPU"]["ok"] == "2"


def test_regressions_report_lists_what_compare_calls_regressed(store) -> None:
    db, run_ids = store
    done = run_cli("query", "--report", "regressions", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert f"## Regressions: {run_ids[1]} vs {run_ids[0]}" in done.stdout
    expected = compare_runs(db, run_ids[0], run_ids[1]).regressed
    report = query_json(db, "--report", "regressions")
    assert [(r["target"], r["case"], r["verdict"]) for r in report] == [(r.target, r.case, r.verdict) for r in expected]


def test_sql_select_in_every_format(store, tmp_path: Path) -> None:
    db, _ = store
    sql = "SELECT engine, count(*) AS n FROM results GROUP BY engine ORDER BY engine"
    assert query_json(db, "--sql", sql) == [
        {"engine": "onnxruntime", "n": 4},
        {"engine": "openvino", "n": 4},
        {"engine": "torch", "n": 4},
    ]
    markdown = run_cli("query", "--sql", sql, "--db", str(db))
    assert "| engine | n |" in markdown.stdout and "| torch | 4 |" in markdown.stdout
    page = tmp_path / "q.html"
    done = run_cli_process("query", "--sql", sql, "--db", str(db), "--format", "html", "--out", str(page))
    assert done.returncode == 0 and "<td>openvino</td><td>4</td>" in page.read_text()
    explain = run_cli("query", "--sql", "EXPLAIN " + sql, "--db", str(db), "--format", "csv")
    assert explain.returncode == 0, explain.stderr


def _fingerprint(db: Path) -> tuple[str, list[dict]]:
    counts = rows(db, "SELECT (SELECT count(*) FROM runs) r, (SELECT count(*) FROM results) s, "
                      "(SELECT count(*) FROM samples) x")  # fmt: skip
    return hashlib.sha256(db.read_bytes()).hexdigest(), counts


REFUSED = [
    ("DELETE FROM results", "DELETE statements are refused"),
    ("DROP TABLE samples", "DROP statements are refused"),
    ("ATTACH '/tmp/other.duckdb' AS other", "ATTACH statements are refused"),
    ("INSERT INTO runs SELECT * FROM runs", "INSERT statements are refused"),
    ("SELECT 1; DELETE FROM results", "exactly one SELECT statement (got 2 statements)"),
    ("EXPLAIN ANALYZE DELETE FROM results", "EXPLAIN is allowed only around a SELECT"),
    ("SELECT * FROM read_csv('/etc/passwd')", "query failed: Permission Error"),  # external access is off
]


@pytest.mark.parametrize(("sql", "message"), REFUSED)
def test_sql_refuses_anything_but_one_read(store, sql: str, message: str) -> None:
    db, _ = store
    before = _fingerprint(db)
    cli = run_cli_process if sql is REFUSED[0][0] else run_cli
    done = cli("query", "--sql", sql, "--db", str(db))
    assert done.returncode == 2, done.stdout
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert _fingerprint(db) == before


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE results SET status = 'ok'", "UPDATE statements are refused"),
        ("CREATE TABLE x AS SELECT 1", "CREATE statements are refused"),
        ("COPY results TO '/tmp/leak.csv'", "COPY statements are refused"),
        ("PRAGMA database_size", "PRAGMA statements are refused"),
        ("SET threads = 1", "SET statements are refused"),
        ("INSTALL httpfs", "--sql is read-only: INSTALL statements are refused"),  # DuckDB files it under LOAD
        ("force install httpfs", "--sql is read-only: FORCE INSTALL statements are refused"),
        ("LOAD httpfs", "LOAD statements are refused"),
        ("CALL pragma_version()", "CALL statements are refused"),
        ("DETACH other", "DETACH statements are refused"),
        ("EXPORT DATABASE '/tmp/x'", "EXPORT statements are refused"),
        ("SELEC 1", "cannot parse --sql"),
        ("", "got 0 statements"),
    ],
)
def test_read_only_check_refuses_every_other_statement(sql: str, message: str) -> None:
    with pytest.raises(AnalysisError) as caught:
        check_read_only(sql)
    assert message in str(caught.value)


def test_read_only_check_accepts_reads() -> None:
    for sql in (
        "SELECT 1",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "FROM results",
        "EXPLAIN SELECT 1",
        "DESCRIBE runs",
    ):
        check_read_only(sql)


def test_query_bad_input_exits_2(store) -> None:
    db, _ = store
    for cli, args, message in (
        (run_cli_process, ["--report", "fastest"], "unknown report 'fastest'; valid: latest, best-hardware"),
        (run_cli, ["--report", "latest", "--sql", "SELECT 1"], "either --report NAME or --sql"),
        (
            run_cli,
            ["--report", "latest", "--format", "xml"],
            "unknown format 'xml'; valid: md, csv, json, html",
        ),
    ):
        done = cli("query", *args, "--db", str(db))
        assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_writes_readable_tables(store, tmp_path: Path, fmt: str) -> None:
    db, _ = store
    before = _fingerprint(db)
    out = tmp_path / fmt
    cli = run_cli_process if fmt == "parquet" else run_cli
    done = cli("export", "--format", fmt, "--out", str(out), "--db", str(db))
    assert done.returncode == 0, done.stderr
    reader = "read_parquet" if fmt == "parquet" else "read_csv"
    connection = duckdb.connect()
    for table in ("runs", "hardware", "results", "samples"):
        path = out / f"{table}.{fmt}"
        exported = connection.execute(f"SELECT count(*) FROM {reader}('{path}')").fetchone()[0]
        assert exported == rows(db, f"SELECT count(*) AS n FROM {table}")[0]["n"] > 0
    latencies = connection.execute(f"SELECT sum(latency_ms) FROM {reader}('{out / f'samples.{fmt}'}')").fetchone()[0]
    assert latencies == pytest.approx(rows(db, "SELECT sum(latency_ms) AS s FROM samples")[0]["s"])
    connection.close()
    assert _fingerprint(db) == before


def test_export_one_table_and_bad_input(store, tmp_path: Path) -> None:
    db, _ = store
    parquet = ["--format", "parquet", "--table", "results", "--out", str(tmp_path)]
    done = run_cli_process("export", *parquet, "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["results.parquet"]
    bad = run_cli("export", "--format", "xlsx", "--out", str(tmp_path), "--db", str(db))
    assert bad.returncode == 2 and "unknown export format 'xlsx'; valid: parquet, csv" in bad.stderr


def test_best_hardware_and_compatibility_keep_modes_apart(tmp_path: Path) -> None:
    """A training step (10x, torch only) is never the 'best' inference target, nor counted with it."""
    from test_decide import seed_modes

    from harness.analysis.query import run_report

    db = tmp_path / "modes.duckdb"
    _, run_b = seed_modes(db)["runs"]
    best = run_report(db, "best-hardware", run_b).rows
    at_b2 = [r for r in best if r["model"] == "m2" and r["batch_size"] == 2]
    assert len(at_b2) == 2  # the fastest inference target, and the fastest training one
    m2_b2 = {(r["mode"], r["new_tokens"]): r for r in at_b2}
    assert set(m2_b2) == {("inference", None), ("training", None)}
    assert m2_b2[("inference", None)]["target"] == "cpu/onnxruntime:CPUExecutionProvider"
    assert m2_b2[("training", None)]["target"] == "cpu/torch" and m2_b2[("training", None)]["ok_targets"] == 1
    assert {r["new_tokens"] for r in best if r["mode"] == "generate"} == {8, 16}
    counts = {(r["mode"], r["target"]): r for r in run_report(db, "compatibility", run_b).rows}
    assert counts[("inference", "cpu/onnxruntime:CPUExecutionProvider")]["ok"] == 16
    assert counts[("training", "cpu/onnxruntime:CPUExecutionProvider")]["unsupported"] == 16
