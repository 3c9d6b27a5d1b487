"""End to end through the real CLI: spec → export → isolated workers → DuckDB → reports."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import QUICK, run_cli


def rows(db: Path, sql: str = "SELECT * FROM results ORDER BY engine, batch_size") -> list[dict]:
    connection = duckdb.connect(str(db), read_only=True)
    cursor = connection.execute(sql)
    names = [d[0] for d in cursor.description]
    result = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    connection.close()
    return result


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    directory = tmp_path_factory.mktemp("bert")
    db, out = directory / "b.duckdb", directory / "out"
    done = run_cli(
        "native",
        "--model",
        "bert-tiny",
        "--hardware",
        "cpu,openvino",
        "--batch-sizes",
        "1,2",
        "--sequence-lengths",
        "16",
        *QUICK,
        "--db",
        str(db),
        "--output-dir",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return db, out, done.stdout


def test_every_engine_stores_ok_rows_with_samples_and_parity(bert_run) -> None:
    db, _, _ = bert_run
    results = rows(db)
    assert {(r["engine"], r["provider"]) for r in results} == {
        ("torch", "cpu"),
        ("onnxruntime", "CPUExecutionProvider"),
        ("openvino", "CPU"),
    }
    assert len(results) == 6  # 3 targets x 2 batch sizes
    for r in results:
        assert r["status"] == "ok", r["error"]
        assert r["iterations"] >= 5 and r["latency_p50_ms"] > 0
        assert r["latency_min_ms"] <= r["latency_p50_ms"] <= r["latency_p99_ms"] <= r["latency_max_ms"]
        assert r["throughput_per_s"] == pytest.approx(r["batch_size"] * 1000 / r["latency_mean_ms"])
        assert r["max_abs_diff"] < 1e-3 and r["weights"] == "random"
        assert r["load_ms"] > 0 and r["first_run_ms"] > 0 and r["memory_peak_mb"] > 0
        assert r["load_avg_1m"] is not None and r["cpu_percent"] is not None
        count = rows(db, f"SELECT count(*) AS n FROM samples WHERE result_id = '{r['result_id']}'")[0]["n"]
        assert count == r["iterations"]


def test_every_job_measures_the_drift_control_at_its_start_middle_and_end(bert_run) -> None:
    db, _, _ = bert_run
    controls = rows(db, "SELECT * FROM controls ORDER BY engine, measured_at")
    by_engine: dict[str, list[str]] = {}
    for c in controls:
        by_engine.setdefault(c["engine"], []).append(c["position"])
        assert c["workload"] == "matmul-chain-4x256x64" and c["beside"] == "bert-tiny" and c["error"] is None
        assert c["iterations"] >= 3 and len(c["samples_ms"]) == c["iterations"] and c["median_ms"] > 0
        assert c["load_avg_1m"] is not None
    # two cases per job: before the first, after the first (the middle), after the last
    assert by_engine == {e: ["start", "middle", "end"] for e in ("onnxruntime", "openvino", "torch")}


def test_one_load_per_job_is_stated_on_every_row(bert_run) -> None:
    """Each job loads its model once for both batch sizes: both rows carry that load's figures, and
    say it was measured with the first case and shared by two (issue 11, item 3)."""
    db, _, _ = bert_run
    for engine in ("torch", "onnxruntime", "openvino"):
        b1, b2 = (r for r in rows(db) if r["engine"] == engine)
        assert (b1["load_ms"], b1["memory_load_mb"]) == (b2["load_ms"], b2["memory_load_mb"])
        for r in (b1, b2):
            details = json.loads(r["details"])
            assert (details["load_measured_with"], details["load_shared_by"]) == ("b1_s16_fp32", 2), engine


def test_openvino_fp32_is_forced_and_recorded(bert_run) -> None:
    db, _, _ = bert_run
    ov = [r for r in rows(db) if r["engine"] == "openvino"]
    for r in ov:
        details = json.loads(r["details"])
        assert r["precision"] == "fp32" and details["inference_precision_hint"] == "f32"


def test_provenance_and_reports(bert_run) -> None:
    db, out, stdout = bert_run
    run = rows(db, "SELECT * FROM runs")[0]
    assert run["status"] == "completed" and run["cpu_cores"] >= 1
    hardware = {r["platform"]: r for r in rows(db, "SELECT * FROM hardware")}
    assert hardware["cpu"]["available"] and not hardware["cuda"]["available"]
    assert not {"wasm", "webgpu", "webnn"} & hardware.keys()  # a native run launches no browser to probe them
    assert "sees no GPU" in hardware["cuda"]["reason"] or "no CUDAExecutionProvider" in hardware["cuda"]["reason"]
    ort_row = next(r for r in rows(db) if r["engine"] == "onnxruntime")
    details = json.loads(ort_row["details"])
    assert details["session_providers"][0] == "CPUExecutionProvider"
    assert details["export"]["exporter"] == "dynamo" and details["onnxruntime_version"]
    # torch workers fork from the server that imported torch; the others spawn without it.
    starts = {r["engine"]: json.loads(r["details"])["worker_start"] for r in rows(db)}
    assert starts == {"torch": "forkserver", "onnxruntime": "spawn", "openvino": "spawn"}
    md = (out / f"{run['run_id']}.md").read_text()
    for heading in (
        "## System Information",
        "## Available Hardware",
        "### Embedding Models",
        "#### Latency Comparison",
        "#### Throughput Comparison",
        "#### Relative Performance",
    ):
        assert heading in md
    document = json.loads((out / f"{run['run_id']}.json").read_text())
    assert len(document["results"]) == 6
    assert (out / f"{run['run_id']}.csv").read_text().count("\n") == 7
    assert "bert-tiny" in stdout and run["run_id"] in stdout


def test_second_run_hits_the_export_cache_and_max_time_stops_its_loop(bert_run, tmp_path: Path) -> None:
    """A warm cache, and a loop of 1000 iterations cut by a 1 ms budget: min_iterations samples, marked."""
    db = tmp_path / "again.duckdb"
    done = run_cli(
        "native",
        "--model",
        "bert-tiny",
        "--engines",
        "onnxruntime",
        "--batch-sizes",
        "1",
        "--sequence-lengths",
        "16",
        *("--warmup", "50", "--iterations", "1000", "--max-iterations", "1000", "--min-duration", "0"),
        *("--max-time", "0.001", "--min-iterations", "2"),
        "--db",
        str(db),
        "--output-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    row = rows(db)[0]
    details = json.loads(row["details"])
    assert details["export"]["cache_hit"] is True
    assert row["status"] == "ok" and row["iterations"] == 2
    assert (details["max_time_s"], details["budget_stopped"]) == (0.001, True)
    # the budget starts before the first (timed) run: 1 ms leaves room for a few of the 50 warmup
    # runs at most (a quiet machine fits two or three ~0.3 ms runs, a loaded one none)
    assert 0 <= details["warmup_run"] < 50
    md = next(p for p in tmp_path.glob("*.md") if p.name != "compatibility_matrix.md").read_text()
    assert "--max-time 0.001s stopped the loop" in md


def test_openvino_auto_precision_records_what_ran(tmp_path: Path) -> None:
    db = tmp_path / "auto.duckdb"
    done = run_cli(
        "native",
        "--model",
        "bert-tiny",
        "--engines",
        "openvino",
        "--precision",
        "auto",
        "--sequence-lengths",
        "16",
        *QUICK,
        "--db",
        str(db),
        "--no-reports",  # no report is read here (each costs seconds)
        "--output-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    r = rows(db)[0]
    details = json.loads(r["details"])
    hint = details["inference_precision_hint"]
    assert r["requested_precision"] == "auto"
    assert r["precision"] == {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}[hint]
    assert r["status"] == "ok"  # within the tolerance of the precision that actually ran


def test_sequence_longer_than_the_model_allows_is_unsupported(tmp_path: Path) -> None:
    """bert-tiny (512 positions; exported by the other tests of this session already)."""
    db = tmp_path / "long.duckdb"
    done = run_cli(
        "native",
        "--model",
        "bert-tiny",
        "--engines",
        "onnxruntime",
        "--sequence-lengths",
        "16,600",
        *QUICK,
        "--db",
        str(db),
        "--no-reports",  # no report is read here (each costs seconds)
        "--output-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    by_seq = {r["seq_len"]: r for r in rows(db)}
    assert by_seq[16]["status"] == "ok"
    assert by_seq[600]["status"] == "unsupported"
    assert "exceeds the model's maximum of 512 positions" in by_seq[600]["error"]


def test_unavailable_hardware_asked_for_is_recorded_unsupported(tmp_path: Path) -> None:
    db = tmp_path / "cuda.duckdb"
    done = run_cli(
        "native",
        "--model",
        "bert-tiny",
        "--hardware",
        "cuda",
        "--sequence-lengths",
        "16",
        *QUICK,
        "--db",
        str(db),
        "--no-reports",  # no report is read here (each costs seconds)
        "--output-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    results = rows(db)
    assert results and all(r["status"] == "unsupported" for r in results)
    torch_row = next(r for r in results if r["engine"] == "torch")
    assert "sees no GPU" in torch_row["error"]


@pytest.mark.parametrize("hardware", ["cuda", "rocm", "mps"])
def test_gpu_platforms_run_where_present(tmp_path: Path, hardware: str) -> None:
    from harness.run.hardware import native_targets

    probes = [a for t, a in native_targets([hardware], ["torch"])]
    if not probes[0].ok:
        pytest.skip(f"{hardware} absent here: {probes[0].reason}")
    db = tmp_path / "gpu.duckdb"
    done = run_cli(
        "native",
        "--model",
        "bert-tiny",
        "--hardware",
        hardware,
        "--engines",
        "torch",
        "--sequence-lengths",
        "16",
        *QUICK,
        "--db",
        str(db),
        "--output-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    r = rows(db)[0]
    assert r["status"] == "ok", r["error"]
    assert r["device_memory_peak_mb"] > 0


def test_export_cache_key_follows_the_export_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness whose export code changed never reuses a file an older harness exported."""
    from harness.prepare import export
    from harness.prepare.specs import load_specs
    from harness.prepare.workload import Weights

    spec, weights = load_specs()["bert-tiny"], Weights("random", "seed=0", "seed=0")
    before = export.export_key(spec, weights)
    assert export.export_key(spec, weights) == before  # stable for the same code
    monkeypatch.setattr(export, "_export_code_digest", lambda: "edited-exporter")
    assert export.export_key(spec, weights) != before


def test_warm_cache_prepare_builds_no_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second prepare of the same cases comes from the cache alone; a new case still builds."""
    import harness.prepare.workload
    from harness.prepare.prepared import PrepareJob, prepare_model
    from harness.prepare.specs import load_specs

    job = PrepareJob(load_specs()["bert-tiny"], [(1, 16), (2, 16), (1, 4096)])  # 4096 > bert's 512 positions
    cold = next(prepare_model(job))

    def no_build(spec: object) -> None:
        raise AssertionError("built the module on a warm cache")

    monkeypatch.setattr(harness.prepare.workload, "build_module", no_build)
    warm = next(prepare_model(job))
    assert warm.export["cache_hit"] and warm.onnx_path == cold.onnx_path
    assert (warm.case_files, warm.skipped, warm.parameters) == (cold.case_files, cold.skipped, cold.parameters)
    assert (warm.weights, warm.weights_source, warm.reference) == (cold.weights, cold.weights_source, cold.reference)
    assert list(warm.skipped) == [(1, 4096)] and warm.parameters > 0
    with pytest.raises(AssertionError, match="built the module"):  # no run here used (3, 13): no inputs yet
        next(prepare_model(PrepareJob(job.spec, [(3, 13)])))


def _fixed_batch_onnx(path: Path) -> None:
    """A graph whose input dims are symbolic but which reshapes to [1, 7]: batch 1 runs, batch 2 cannot."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 7])
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "fixed", [x], [y], [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def test_a_case_that_cannot_be_prepared_fails_alone(tmp_path: Path) -> None:
    """The b2 case's reference cannot be computed (ONNX Runtime refuses the reshape): that case is its own
    `error` row with the real reason, and the b1 case of the same model runs and is ok."""
    model, db = tmp_path / "fixed.onnx", tmp_path / "fixed.duckdb"
    _fixed_batch_onnx(model)
    done = run_cli(
        "native", "--model-path", str(model), "--engines", "onnxruntime", "--batch-sizes", "1,2",
        "--sequence-lengths", "7", *QUICK, "--db", str(db), "--no-reports",  # no report read here (seconds each)
        "--output-dir", str(tmp_path / "o"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    by_batch = {r["batch_size"]: r for r in rows(db)}
    assert by_batch[1]["status"] == "ok", by_batch[1]["error"]
    assert by_batch[2]["status"] == "error"
    assert "preparing the inputs and reference outputs failed" in by_batch[2]["error"]
    assert "reshape" in by_batch[2]["error"].lower()


def test_a_spec_models_case_whose_inputs_cannot_be_allocated_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """An allocation past any memory while building one case's inputs (numpy's "Unable to allocate … TiB",
    the issue's 477 GiB batch): that case is `oom`, the model's other case is prepared."""
    import numpy as np

    import harness.prepare.workload
    from harness.core.records import Case, Target
    from harness.prepare.prepared import PrepareJob, prepare_model
    from harness.prepare.specs import load_specs

    make_inputs = harness.prepare.workload.make_inputs

    def huge_for_batch_3(spec: object, config: object, batch: int, seq: int | None) -> dict:
        if batch == 3:
            np.zeros((batch, 2**50), dtype=np.int64)  # raises at once: nothing is allocated
        return make_inputs(spec, config, batch, seq)

    monkeypatch.setattr(harness.prepare.workload, "make_inputs", huge_for_batch_3)
    prepared = next(prepare_model(PrepareJob(load_specs()["bert-tiny"], [(1, 11), (3, 11)])))
    assert prepared.case_files[(1, 11)].exists() and (3, 11) not in prepared.case_files
    status, why = prepared.unprepared(Case(3, 11, "fp32"))  # type: ignore[misc]
    assert status == "oom" and "Unable to allocate" in why
    assert prepared.unprepared(Case(1, 11, "fp32")) is None
    row = prepared.result(Target("cpu", "torch", "cpu"), Case(3, 11, "fp32"), status, why)
    assert row.status == "oom" and row.weights == "random"  # the model's facts, not an unprepared model's


def test_every_native_row_records_its_engines_default_threads_read_back(bert_run) -> None:
    """No --native-threads: each engine's own count, read back (or ORT's documented default), with its source."""
    from harness.native.base import physical_cores
    from harness.native.onnxruntime_backend import spins

    db, _, _ = bert_run
    for r in rows(db):
        details = json.loads(r["details"])
        assert r["native_threads"] is not None and r["native_threads"] >= 1, r["engine"]
        assert details["native_threads_source"] and details["spinning_source"], r["engine"]
        if r["engine"] == "onnxruntime":  # ORT says no count: its default is one thread per physical core
            assert (
                r["native_threads"] == physical_cores() and "ONNX Runtime's default" in details["native_threads_source"]
            )
            # ORT's default (spinning) unless the pool and the machine's other work measured at the load overfill it
            assert r["spinning"] is spins(r["native_threads"], details["others_busy_cpus"])[0]
        else:
            assert "read back" in details["native_threads_source"]


def test_native_threads_make_a_target_per_count_stored_and_labelled(bert_run, tmp_path: Path) -> None:
    """--native-threads 1,2: a target per count, as the page's --threads; the count and the spinning on
    every row, in its label, the report's results and the matrix's columns."""
    from harness.native.onnxruntime_backend import spins

    db = tmp_path / "threads.duckdb"
    done = run_cli(
        "native", "--model", "bert-tiny", "--engines", "onnxruntime", "--native-threads", "1,2",
        "--batch-sizes", "1", "--sequence-lengths", "16", "--iterations", "2", "--warmup", "0", "--min-duration", "0",
        "--db", str(db), "--output-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = {r["provider"]: r for r in rows(db)}
    assert set(found) == {f"CPUExecutionProvider:threads={n}" for n in (1, 2)}
    for provider, r in found.items():
        count = int(provider.rsplit("=", 1)[1])
        assert r["status"] == "ok" and r["native_threads"] == count, (provider, r["error"])
        assert r["spinning"] is spins(count, json.loads(r["details"])["others_busy_cpus"])[0]
        assert json.loads(r["details"])["native_threads_source"].startswith(
            f"--native-threads: SessionOptions.intra_op_num_threads {count}"
        )
    html = next(tmp_path.glob("*.html")).read_text()
    assert "cpu/onnxruntime:CPUExecutionProvider:threads=2" in html and "2 threads" in html
    matrix = (tmp_path / "compatibility_matrix.md").read_text()
    assert "cpu/onnxruntime:threads=1" in matrix and "cpu/onnxruntime:threads=2" in matrix


def test_spinning_is_off_when_the_pool_and_the_machines_other_work_overfill_its_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ORT's default (spinning) on an idle machine, even with a thread per core; off once the pool's threads and
    the CPUs other processes were measured busy exceed the physical cores (by more than half a CPU)."""
    from harness.native import onnxruntime_backend

    monkeypatch.setattr(onnxruntime_backend, "physical_cores", lambda: 4)
    assert onnxruntime_backend.spins(4, 0.2)[0] is True and onnxruntime_backend.spins(3, 1.0)[0] is True
    assert onnxruntime_backend.spins(4, 1.0)[0] is False and onnxruntime_backend.spins(3, 2.0)[0] is False
    for busy, entry in ((0.0, "1"), (1.0, "0")):  # ORT's default count: 4 threads
        monkeypatch.setattr(onnxruntime_backend, "others_busy_cpus", lambda busy=busy: busy)
        options, facts = onnxruntime_backend.session_options(None)
        assert options.intra_op_num_threads == 0 and facts["native_threads"] == 4
        assert options.get_session_config_entry(onnxruntime_backend.SPINNING_ENTRY) == entry
        assert facts["spinning"] is (entry == "1") and facts["others_busy_cpus"] == busy
        assert f"other processes {busy:.1f} CPUs busy" in facts["spinning_source"]
    # the worker's reading, taken before the load's timer started, is used as given: nothing sleeps inside the load
    monkeypatch.setattr(onnxruntime_backend, "others_busy_cpus", lambda: pytest.fail("read again inside the load"))
    assert onnxruntime_backend.session_options(None, 1.0)[1]["spinning"] is False
    from harness.native import capabilities

    assert capabilities("onnxruntime").reads_machine_load  # so the worker reads the load before timing it


def test_the_machines_other_work_is_measured_not_assumed() -> None:
    """A process kept busy beside this one shows as about one busy CPU; none of this process's own time counts."""
    import subprocess

    from harness.native.onnxruntime_backend import others_busy_cpus

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert others_busy_cpus(0.5) >= 0.6
    finally:
        busy.kill()
        busy.wait()


def test_a_device_engines_label_keeps_its_thread_count() -> None:
    """torch's label leaves its device out (the hardware names it), not the count: 1 and 2 threads stay apart."""
    from harness.core.labels import short_target, target_label

    row = {"hardware": "cpu", "engine": "torch", "provider": "cpu:threads=2"}
    assert target_label(row) == "cpu/torch:threads=2" and short_target(row) == "cpu/torch:threads=2"
    assert target_label(row | {"provider": "cpu"}) == "cpu/torch"
