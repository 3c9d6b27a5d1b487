"""Generation (TTFT/TPOT), training steps, energy sensors and the schema migration they needed."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from conftest import QUICK, run_cli
from test_native_run import rows

from harness.energy import EnergyMeter
from harness.store import SCHEMA, SCHEMA_VERSION, open_store


@pytest.fixture(scope="module")
def modes_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("modes")
    db = directory / "m.duckdb"
    done = run_cli(
        "native",
        "--model",
        "gpt2-tiny,bert-tiny",
        "--hardware",
        "cpu",
        "--batch-sizes",
        "2",
        "--sequence-lengths",
        "8",
        "--mode",
        "inference,generate,training",
        "--new-tokens",
        "6",
        *QUICK,
        "--db",
        str(db),
        "--output-dir",
        str(directory / "out"),
    )
    assert done.returncode == 0, done.stderr
    return db


def test_generation_rows_have_consistent_ttft_tpot_and_tokens_per_second(modes_db: Path) -> None:
    generated = rows(modes_db, "SELECT * FROM results WHERE mode = 'generate'")
    assert [(r["model"], r["engine"]) for r in generated] == [("gpt2-tiny", "torch")]  # bert cannot generate
    r = generated[0]
    assert r["status"] == "ok" and r["new_tokens"] == 6
    assert 0 < r["ttft_ms"] < r["latency_p50_ms"]
    assert r["tokens_per_s"] == pytest.approx(2 * 6 * 1000 / r["latency_mean_ms"])
    samples = rows(modes_db, f"SELECT * FROM samples WHERE result_id = '{r['result_id']}'")
    assert len(samples) == r["iterations"]
    for s in samples:  # first token, then 5 more token intervals, all inside the whole generate() call
        assert s["ttft_ms"] + 5 * s["tpot_ms"] <= s["latency_ms"] * 1.0001


def test_training_rows_report_samples_per_second(modes_db: Path) -> None:
    trained = rows(modes_db, "SELECT * FROM results WHERE mode = 'training' ORDER BY model")
    assert [r["model"] for r in trained] == ["bert-tiny", "gpt2-tiny"]
    for r in trained:
        assert r["status"] == "ok" and r["engine"] == "torch"
        assert r["throughput_per_s"] == pytest.approx(2 * 1000 / r["latency_mean_ms"])
        assert r["max_abs_diff"] is None  # trained weights have no reference to match
        assert r["memory_peak_mb"] > 0


def test_energy_is_measured_or_says_why_not(modes_db: Path) -> None:
    meter = EnergyMeter()
    for r in rows(modes_db):
        source = json.loads(r["details"])["energy_source"]
        if meter.unavailable:
            assert r["energy_j_per_item"] is None and source.startswith("unsupported: ")
        else:
            assert r["energy_j_per_item"] > 0 and source.startswith("rapl:")


def test_bad_mode_and_new_tokens_exit_2(tmp_path: Path) -> None:
    done = run_cli("native", "--mode", "finetune", "--db", str(tmp_path / "x.duckdb"))
    assert done.returncode == 2 and "unknown mode 'finetune'; valid: inference, generate, training" in done.stderr
    done = run_cli("native", "--mode", "generate", "--new-tokens", "0", "--db", str(tmp_path / "x.duckdb"))
    assert done.returncode == 2 and "--new-tokens must be >= 1" in done.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_version_1_file_is_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "v1.duckdb"
    connection = duckdb.connect(str(db))
    connection.execute(SCHEMA)
    connection.execute("INSERT INTO schema_version VALUES (1, now())")
    connection.execute("INSERT INTO runs (run_id, started_at, status) VALUES ('old', now(), 'completed')")
    connection.close()
    with open_store(db) as store:
        assert store.query("SELECT max(version) AS v FROM schema_version")[0]["v"] == SCHEMA_VERSION
        assert store.query("SELECT run_id FROM runs")[0]["run_id"] == "old"
        columns = {r["column_name"] for r in store.query("DESCRIBE results")}
        assert {"mode", "ttft_ms", "tpot_ms", "tokens_per_s", "compile_ms", "energy_j_per_item"} <= columns
    with open_store(db) as store:  # idempotent: a second open applies nothing twice
        assert store.query("SELECT count(*) AS n FROM schema_version")[0]["n"] == SCHEMA_VERSION
