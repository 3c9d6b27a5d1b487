"""Results from many machines in one store (issue 26, items 2 and 3): `export --bundle`, `import`,
`merge`, on real DuckDB files through the real CLI."""

from __future__ import annotations

import getpass
import json
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from conftest import CLI, run_cli, run_cli_process
from test_machines import result, v6_store

from harness.bundle.fmt import file_sha256, write_bundle
from harness.core.records import Case, Result, Target
from harness.run.machine import machine_facts
from harness.store import ADDED_TABLES, RUN_TABLES, hash_results_sql, open_store

HOSTNAME = "alice-laptop.corp.example"
ADDRESSES = ("192.168.1.20", "10.0.0.5", "fe80::1")
AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.6778.85 Safari/537.36"


def make_store(path: Path, label: str, models: tuple[str, ...] = ("a", "b")) -> str:
    """A store as a machine labelled `label` writes it: one run, a result per model, with the identifying
    facts a real run records (hostname, paths, a served device's address and user agent)."""
    home = f"/home/{getpass.getuser()}"
    host = {"hostname": HOSTNAME, "cpu_model": "Test CPU", "memory_gb": 15.6, "platform": "Linux"}
    with open_store(path) as store:
        run_id = store.start_run(
            "native", {"db": f"{home}/{label}.duckdb"}, host, None, machine_facts(label, store.machine_salt())
        )
        store.add_hardware(run_id, [{"platform": "cpu", "available": True, "reason": "runs", "device_name": None}])
        for model in models:
            store.add_result(run_id, result(model), "abc")
        failed = Result(
            model="c", family="embedding", weights="random", target=Target("webgpu", "ort-web", "webgpu"),
            case=Case(1, 8, "fp32"), status="error",
            error=f"cannot load {home}/models/c.onnx from http://{ADDRESSES[0]}:8080/m ({HOSTNAME})",
            details={"client_address": ADDRESSES[1], "user_agent": AGENT, "page_origin": f"http://[{ADDRESSES[2]}]:9",
                     "note": f"peer {ADDRESSES[2]} on {HOSTNAME.split('.')[0]}"},
        )  # fmt: skip
        store.add_result(run_id, failed, "abc")
        store.finish_run(run_id, "completed")
    return run_id


def counts(db: Path) -> dict[str, int]:
    with open_store(db, read_only=True) as store:
        return {t: store.query(f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in (*RUN_TABLES, "imports")}


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two stores, written as on two machines (each its own salt, so its own machine id, and a label),
    each exported to a bundle with the CLI: made once for the module, the tests only read them (a test that
    changes a store changes its own copy)."""
    directory = tmp_path_factory.mktemp("two-machines")
    bundles = []
    for label in ("lab-gpu", "laptop"):
        make_store(directory / f"{label}.duckdb", label)
        bundle = directory / f"{label}.bundle"
        done = run_cli("export", "--bundle", str(bundle), "--db", str(directory / f"{label}.duckdb"))
        assert done.returncode == 0, done.stderr
        bundles.append(bundle)
    return bundles[0], bundles[1]


def test_two_machines_imported_into_a_third_add_up_and_again_is_a_no_op(two_machines, tmp_path: Path) -> None:
    both = tmp_path / "both.duckdb"
    done = run_cli("import", *map(str, two_machines), "--db", str(both))
    assert done.returncode == 0, done.stderr
    assert counts(both) == {"runs": 2, "hardware": 2, "results": 6, "samples": 12, "operators": 0, "controls": 0,
                            "ceilings": 0, "imports": 2}  # fmt: skip
    with open_store(both, read_only=True) as store:
        machines = store.query("SELECT machine_label, machine_id FROM runs ORDER BY machine_label")
    assert [m["machine_label"] for m in machines] == ["lab-gpu", "laptop"]
    assert machines[0]["machine_id"] != machines[1]["machine_id"]
    before = counts(both)
    again = run_cli("import", *map(str, two_machines), "--db", str(both))
    assert again.returncode == 0, again.stderr
    assert "3 results already here — nothing new" in again.stdout
    assert counts(both) == before  # not even a second log row


def test_a_bundle_with_one_byte_changed_is_refused_and_nothing_written(two_machines, tmp_path: Path) -> None:
    bundle = two_machines[0]
    with zipfile.ZipFile(bundle) as archive:
        info = archive.getinfo("samples.parquet")
    data = bytearray(bundle.read_bytes())
    offset = info.header_offset + 30 + len(info.filename) + info.file_size // 2  # inside the member's data
    data[offset] ^= 0x01
    damaged = tmp_path / "damaged.bundle"
    damaged.write_bytes(bytes(data))
    fresh = tmp_path / "fresh.duckdb"
    done = run_cli_process("import", str(two_machines[1]), str(damaged), "--db", str(fresh))
    assert done.returncode == 2 and "damaged" in done.stderr and "samples.parquet" in done.stderr
    assert not fresh.exists()  # not even the store's file: the bundles are checked first
    existing = tmp_path / "existing.duckdb"
    assert run_cli_process("import", str(two_machines[1]), "--db", str(existing)).returncode == 0
    before = counts(existing)
    again = run_cli("import", str(damaged), "--db", str(existing))  # the same refusal, in-process
    assert again.returncode == 2 and "damaged" in again.stderr and "samples.parquet" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr
    assert counts(existing) == before


def test_a_conflicting_result_is_refused_naming_the_key(two_machines, tmp_path: Path) -> None:
    """The same result, measured differently (a sample changed), is never silently overwritten."""
    store_path = tmp_path / "lab-gpu.duckdb"
    shutil.copy(two_machines[0].with_suffix(".duckdb"), store_path)  # the fixture's store stays as exported
    assert counts(store_path)["results"] == 3  # the lab machine's store as it was exported
    both = tmp_path / "both.duckdb"
    assert run_cli("import", str(two_machines[0]), "--db", str(both)).returncode == 0
    with open_store(store_path) as store:
        key = store.query("SELECT result_key, result_id FROM results WHERE model = 'a'")[0]
        store.connection.execute("UPDATE samples SET latency_ms = 9.5 WHERE result_id = ?", [key["result_id"]])
        store.connection.execute("UPDATE results SET content_hash = NULL WHERE result_id = ?", [key["result_id"]])
        store.connection.execute(hash_results_sql())
    changed = tmp_path / "changed.bundle"
    assert run_cli("export", "--bundle", str(changed), "--db", str(store_path)).returncode == 0
    before = counts(both)
    done = run_cli("import", str(two_machines[1]), str(changed), "--db", str(both))
    assert done.returncode == 2, done.stderr
    assert "1 conflict(s), nothing imported" in done.stderr and key["result_key"] in done.stderr.replace("\n", "")
    assert counts(both) == before  # the other bundle's rows were not kept either: all or nothing


def old_bundle(tmp_path: Path) -> Path:
    """A bundle as an accelharness of schema 6 would have written it: its tables lack the identity columns."""
    source = tmp_path / "v6.duckdb"
    v6_store(source)
    connection = duckdb.connect(str(source), read_only=True)
    files, entries = {}, {}
    for table in (t for t in RUN_TABLES if ADDED_TABLES.get(t, 1) <= 6):  # the tables a schema-6 store had
        path = tmp_path / f"{table}.parquet"
        connection.execute(f"COPY {table} TO '{path}' (FORMAT parquet)")
        files[table] = path
        rows = connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        entries[f"{table}.parquet"] = {"sha256": file_sha256(path), "rows": rows, "bytes": path.stat().st_size}
    connection.close()
    manifest = {"bundle_format": 1, "schema_version": 6, "runs": [{"run_id": "old"}], "files": entries}
    write_bundle(tmp_path / "old.bundle", manifest, files)
    return tmp_path / "old.bundle"


def test_an_older_schema_bundle_imports_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    bundle = old_bundle(tmp_path)
    db = tmp_path / "new.duckdb"
    done = run_cli_process("import", str(bundle), "--db", str(db))
    assert done.returncode == 0, done.stderr
    migrated = tmp_path / "migrated.duckdb"
    v6_store(migrated)
    with open_store(migrated) as store:  # the same old store, migrated in place
        expected = store.query("SELECT run_uuid, content_hash FROM runs JOIN results USING (run_id)")
    with open_store(db, read_only=True) as store:
        assert store.query("SELECT run_uuid, content_hash FROM runs JOIN results USING (run_id)") == expected
    with zipfile.ZipFile(bundle) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    for field, value, message, cli in (("schema_version", 99, "newer store (schema version 99", run_cli_process),
                                       ("bundle_format", 2, "bundle format 2", run_cli)):  # fmt: skip
        manifest = json.loads(members["manifest.json"]) | {field: value}
        newer = tmp_path / f"newer-{field}.bundle"
        with zipfile.ZipFile(newer, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, json.dumps(manifest) if name == "manifest.json" else data)
        fresh = tmp_path / f"fresh-{field}.duckdb"
        done = cli("import", str(newer), "--db", str(fresh))
        assert done.returncode == 2 and message in done.stderr and "upgrade accelharness" in done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert not fresh.exists()


def bundle_text(bundle: Path) -> str:
    """Every value of every table of the bundle as text, and its manifest."""
    parts = []
    with zipfile.ZipFile(bundle) as archive:
        for name in archive.namelist():
            data = archive.read(name)
            if name.endswith(".parquet"):
                path = bundle.with_name(name)
                path.write_bytes(data)
                parts.append(json.dumps(pq.read_table(path).to_pylist(), default=str))
            else:
                parts.append(data.decode())
    return "\n".join(parts)


def test_redact_public_leaves_no_hostname_user_path_or_address(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    make_store(db, "laptop")
    plain, public = tmp_path / "plain.bundle", tmp_path / "public.bundle"
    assert run_cli("export", "--bundle", str(plain), "--db", str(db)).returncode == 0
    done = run_cli("export", "--bundle", str(public), "--redact", "public", "--db", str(db))
    assert done.returncode == 0, done.stderr
    exposed = bundle_text(plain)
    needles = [HOSTNAME, "alice-laptop", "/home/", getpass.getuser(), *ADDRESSES, "X11; Linux"]
    assert all(needle in exposed for needle in needles[:2] + needles[4:])  # the test's store does hold them
    text = bundle_text(public)
    assert [needle for needle in needles if needle in text] == []
    assert "Chrome 131.0.6778.85" in text and '"level": "public"' in text
    hashes = {}
    for name, bundle in (("plain", plain), ("public", public)):
        (tmp_path / name).mkdir()
        with zipfile.ZipFile(bundle) as archive:
            archive.extract("results.parquet", tmp_path / name)
        hashes[name] = sorted(pq.read_table(tmp_path / name / "results.parquet")["content_hash"].to_pylist())
    assert hashes["plain"] == hashes["public"]  # the same results: importing both adds them once


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT])
def test_a_kill_or_ctrl_c_mid_import_leaves_the_store_as_it_was(two_machines, tmp_path: Path, stop: int) -> None:
    db = tmp_path / "s.duckdb"
    assert run_cli("import", str(two_machines[0]), "--db", str(db)).returncode == 0  # the store before
    before = counts(db)
    assert before["results"] == 3 and before["imports"] == 1
    process = subprocess.Popen(
        [*CLI, "import", str(two_machines[1]), "--db", str(db)],
        stderr=subprocess.PIPE, text=True, env={**__import__("os").environ, "ACCELHARNESS_INJECT_FAULT": "import-hang"},
    )  # fmt: skip
    assert "holding the transaction" in process.stderr.readline()  # every row added, none committed
    process.send_signal(stop)
    process.wait(timeout=60)
    assert process.returncode != 0
    assert counts(db) == before


def test_a_held_store_is_refused_naming_the_holder(two_machines, tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    open_store(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, sys, time; c = duckdb.connect({str(db)!r}); print('held', flush=True); "
         "time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        done = run_cli("import", str(two_machines[0]), "--db", str(db))
        assert done.returncode == 2
        assert (
            f"locked by PID {holder.pid}" in done.stderr and "import duckdb, sys, time" in done.stderr
        )  # and its command line
    finally:
        holder.kill()
        holder.wait()


def test_merge_goes_through_the_same_path(tmp_path: Path) -> None:
    first, second, out = tmp_path / "a.duckdb", tmp_path / "b.duckdb", tmp_path / "out.duckdb"
    make_store(first, "lab-gpu")
    make_store(second, "laptop", ("a", "z"))
    done = run_cli("merge", str(first), str(second), "--db", str(out))
    assert done.returncode == 0, done.stderr
    assert counts(out)["results"] == 6 and counts(out)["imports"] == 2
    before = counts(out)
    assert run_cli("merge", str(first), str(second), "--db", str(out)).returncode == 0
    assert counts(out) == before
    refused = run_cli("merge", str(first), str(out), "--db", str(out))
    assert refused.returncode == 2 and "one of the stores to merge" in refused.stderr


def test_an_older_store_exports_unchanged_with_the_identity_its_migration_gives(tmp_path: Path) -> None:
    """The GPU workflow's old baseline (a schema-6 store) becomes a bundle: read only, given the run uuid
    and content hash the migration would give it, the same as an older bundle of it gets on import."""
    from harness.bundle.export import export_bundle
    from harness.bundle.importer import import_bundles

    source = tmp_path / "old.duckdb"
    v6_store(source)
    before = source.read_bytes()
    export_bundle(source, tmp_path / "from-store.bundle")
    assert source.read_bytes() == before
    identity = "SELECT run_uuid, content_hash FROM runs JOIN results USING (run_id)"
    found = []
    for name, bundle in (("a", tmp_path / "from-store.bundle"), ("b", old_bundle(tmp_path))):
        import_bundles(tmp_path / f"{name}.duckdb", [bundle])
        with open_store(tmp_path / f"{name}.duckdb", read_only=True) as store:
            found.append(store.query(identity))
    assert found[0] == found[1]
