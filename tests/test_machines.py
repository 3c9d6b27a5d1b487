"""Which machine made a run (issue 26, item 1): a global run uuid, a machine id from hardware facts
and the store's salt, a label, a hardware class, each result's content hash, and the migration that
gives an existing store all of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli, run_cli_process, store_at_version

from harness.core.records import Case, Result, Target
from harness.run.machine import LABEL_ENV, check_machine_label, machine_facts
from harness.store import open_store


def result(model: str = "m", samples: tuple[float, ...] = (1.0, 2.0, 3.0)) -> Result:
    return Result(
        model=model, family="embedding", weights="random", target=Target("cpu", "onnxruntime", "CPUExecutionProvider"),
        case=Case(1, 8, "fp32"), status="ok", samples_ms=list(samples), load_ms=2.0,
    )  # fmt: skip


def test_machine_id_is_stable_per_store_salt_and_not_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    first, again = machine_facts(None, "salt-a"), machine_facts(None, "salt-a")
    other_store = machine_facts(None, "salt-b")
    assert first["machine_id"] == again["machine_id"] != other_store["machine_id"]
    assert socket.gethostname() not in first["machine_id"] and len(first["machine_id"]) == 16
    monkeypatch.setenv(LABEL_ENV, "ci-gpu-1")
    assert machine_facts(None, "salt-a")["machine_label"] == "ci-gpu-1"
    assert machine_facts("laptop", "salt-a")["machine_label"] == "laptop"  # the option wins over the variable


@pytest.mark.parametrize("label", ["", "has space", "x" * 65, "-leading", "a/b", "new\nline"])
def test_a_bad_label_is_refused_naming_the_rule(label: str) -> None:
    with pytest.raises(ValueError, match="1 to 64 characters"):
        check_machine_label(label)


def test_bad_machine_label_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    """The first refusal by the real CLI; after it, each test's further commands run the app in this process
    (a Python start is ~0.8 s of CPU), as in the other tests of this module."""
    db = tmp_path / "x.duckdb"
    done = run_cli_process("native", "--model", "bert-tiny", "--machine-label", "two words", "--db", str(db))
    assert done.returncode == 2 and "is not a machine label" in done.stderr and not db.exists()
    done = run_cli("native", "--model", "bert-tiny", "--db", str(db), env={LABEL_ENV: "a;b"})
    assert done.returncode == 2 and LABEL_ENV in done.stderr and not db.exists()


def test_runs_and_results_carry_their_identity(db: Path) -> None:
    with open_store(db) as store:
        machine = machine_facts("box-1", store.machine_salt())
        run_id = store.start_run("t", {}, {"cpu_model": "Some CPU", "memory_gb": 15.6}, None, machine)
        store.add_hardware(run_id, [{"platform": "cuda", "available": True, "reason": "", "device_name": "GPU X"}])
        store.add_result(run_id, result("a"), None)
        store.add_result(run_id, result("b", (1.0, 2.0, 4.0)), None)
        run = store.run_info(run_id)
        hashes = [r["content_hash"] for r in store.results(run_id)]
        salt = store.machine_salt()
    assert run["machine_label"] == "box-1" and run["machine_id"] == machine_facts(None, salt)["machine_id"]
    assert len(run["run_uuid"]) == 32 and run["hardware_class"] == "Some CPU · GPU X · 16 GiB"
    assert len(set(hashes)) == 2 and all(len(h) == 64 for h in hashes)


def v6_store(path: Path) -> None:
    """A store as accelharness wrote it before issue 26 (schema 6), with one run and one result."""
    connection = store_at_version(path, 6)
    connection.execute(
        "INSERT INTO runs (run_id, started_at, status, command, hostname, cpu_model, memory_gb) "
        "VALUES ('old', TIMESTAMP '2026-01-02 03:04:05', 'completed', 'native', 'h', 'Old CPU', 7.8)"
    )
    connection.execute(
        "INSERT INTO results (result_id, run_id, created_at, model, family, weights, hardware, engine, batch_size, "
        "requested_precision, precision, status, result_key) VALUES ('r', 'old', TIMESTAMP '2026-01-02 03:05:00', "
        "'m', 'embedding', 'random', 'cpu', 'torch', 1, 'fp32', 'fp32', 'ok', 'k')"
    )
    connection.execute("INSERT INTO samples (result_id, iteration, latency_ms) VALUES ('r', 0, 1.5), ('r', 1, 2.5)")
    connection.close()


def test_an_existing_store_is_migrated_with_a_derived_identity(tmp_path: Path) -> None:
    """The same old run migrated in two stores gets the same uuid and result hash in both."""
    paths = [tmp_path / "one.duckdb", tmp_path / "two.duckdb"]
    identities = []
    for path in paths:
        v6_store(path)
        with open_store(path) as store:
            run = store.run_info("old")
            identities.append((run["run_uuid"], store.results("old")[0]["content_hash"]))
            assert run["hardware_class"] == "Old CPU · no GPU · 8 GiB" and run["machine_id"] is None
    assert identities[0] == identities[1] and None not in identities[0]


@pytest.fixture(scope="module")
def two_labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Issue 26's "done when": two real runs on this machine under two machine labels, each in its own
    store, exported as bundles and imported into a new store."""
    from test_compare import MEASURE, chain_onnx

    directory = tmp_path_factory.mktemp("two-labels")
    model = chain_onnx(directory / "model", 2)
    combined = directory / "combined.duckdb"
    bundles = []
    for label in ("lab", "laptop"):
        db = directory / f"{label}.duckdb"
        done = run_cli("native", "--model-path", str(model), *MEASURE, "--iterations", "5", "--warmup", "1",
                       "--min-duration", "0", "--machine-label", label, "--db", str(db), "--no-reports",
                       "--output-dir", str(directory / "out"))  # fmt: skip
        assert done.returncode == 0, done.stderr
        bundles.append(directory / f"{label}.bundle")
        assert run_cli("export", "--bundle", str(bundles[-1]), "--db", str(db)).returncode == 0
    done = run_cli("import", *map(str, bundles), "--db", str(combined))
    assert done.returncode == 0, done.stderr
    again = run_cli("import", *map(str, bundles), "--db", str(combined))
    assert again.returncode == 0 and again.stdout.count("nothing new") == 2
    return combined


def test_one_html_report_shows_both_machines_side_by_side(two_labels: Path, tmp_path: Path) -> None:
    page = tmp_path / "all.html"
    done = run_cli_process("report", "--run", "all", "--format", "html", "--out", str(page), "--db", str(two_labels))
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    section = html[html.index('<section id="machines">') :]
    section = section[: section.index("</section>")]
    assert "Across 2 machines" in section and "<th>lab</th><th>laptop</th>" in section
    assert section.count('<td class="num">') >= 2  # a measured latency under each machine
    assert "Across 1 hardware classes" in section  # one machine really: one class for both labels
    listed = run_cli("query", "--report", "machines", "--format", "json", "--db", str(two_labels))
    assert sorted(m["machine"] for m in json.loads(listed.stdout)) == ["lab", "laptop"]


def test_compare_refuses_two_hardware_classes_unless_asked(two_labels: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    db.write_bytes(two_labels.read_bytes())
    with open_store(db) as store:
        a, b = (r["run_id"] for r in store.query("SELECT run_id FROM runs ORDER BY machine_label"))
    same = run_cli_process("compare", a, b, "--db", str(db))
    assert same.returncode == 0 and "A ran on lab, B on laptop: one hardware class" in same.stdout
    with open_store(db) as store:
        store.connection.execute("UPDATE runs SET hardware_class = 'Other CPU · no GPU · 64 GiB' WHERE run_id = ?", [b])
    refused = run_cli("compare", a, b, "--db", str(db))
    assert refused.returncode == 2 and "another hardware class" in refused.stderr
    assert "--across-machines" in refused.stderr and "Other CPU" in refused.stderr
    asked = run_cli("compare", a, b, "--across-machines", "--db", str(db))
    assert asked.returncode == 0 and "across machines (--across-machines)" in asked.stdout


def test_recommend_learns_from_one_machine_when_asked(two_labels: Path) -> None:
    lab_rows = "SELECT result_id FROM results JOIN runs USING (run_id) WHERE machine_label = 'lab'"
    with open_store(two_labels, read_only=True) as store:
        lab = {r["result_id"][:8] for r in store.query(lab_rows)}
    done = run_cli_process("recommend", "--model-family", "embedding", "--machine", "lab", "--db", str(two_labels))
    assert done.returncode == 0, done.stderr
    cited = set(re.findall(r"\b[0-9a-f]{8}\b", done.stdout.split("measured:", 1)[1]))
    assert cited and cited <= lab  # the laptop's rows are not evidence
    unknown = run_cli("recommend", "--model-family", "embedding", "--machine", "nope", "--db", str(two_labels))
    assert unknown.returncode == 2 and "machine 'nope'; machines: lab, laptop" in unknown.stderr


def test_a_suite_machine_label_is_checked(tmp_path: Path) -> None:
    from harness.suite.config import ConfigError, load_config

    config = tmp_path / "suite.toml"
    config.write_text('name = "s"\nmachine_label = "ci-gpu-1"\n[model_families]\nembedding = ["bert-tiny"]\n')
    assert load_config(config).machine_label == "ci-gpu-1"
    config.write_text('name = "s"\nmachine_label = "two words"\n[model_families]\nembedding = ["bert-tiny"]\n')
    with pytest.raises(ConfigError, match="key 'machine_label' 'two words' is not a machine label"):
        load_config(config)
