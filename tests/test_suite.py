"""`accelharness suite`: config checking, --check, resume/--older-than planning, device groups, report-only modes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import duckdb
import numpy as np
import psutil
import pytest
from conftest import run_cli, run_cli_process
from test_native_run import rows

from harness.core.records import Case, Result, Target
from harness.prepare.prepared import _save_case
from harness.run.isolation import run_isolated
from harness.run.recording import Emit
from harness.store import StoreError, open_store
from harness.suite.config import DEFAULT_CONFIG, load_config
from harness.suite.local import _parallel
from harness.suite.plan import device_group, plan_suite
from harness.suite.run import run_suite

SMALL = """
name = "{name}"
batch_sizes = [1]
sequence_lengths = [16]
warmup_iterations = 0
benchmark_iterations = 5
min_duration_s = 0
timeout = 120
{extra}
[model_families]
{families}
[hardware]
hardware_types = {hardware}
engines = {engines}
include_web_platforms = {web}
web_platforms = ["wasm"]
[run]
db = "{db}"
output_dir = "{out}"
"""
BERT_AND_VIT = {"embedding": ["bert-tiny"], "vision": ["vit-tiny"]}


def small_config(
    tmp_path: Path,
    name: str = "t",
    web: bool = False,
    hardware: tuple[str, ...] = ("cpu",),
    engines: tuple[str, ...] = ("torch", "onnxruntime"),
    families: dict[str, list[str]] = BERT_AND_VIT,
    extra: str = "",
) -> Path:
    """A quick suite config (tiny models, 5 iterations) writing to tmp_path/<name>.duckdb."""
    path = tmp_path / f"{name}.toml"
    text = SMALL.format(
        name=name,
        extra=extra,
        families="\n".join(f"{family} = {json.dumps(models)}" for family, models in families.items()),
        hardware=json.dumps(list(hardware)),
        engines=json.dumps(list(engines)),
        web=str(web).lower(),
        db=tmp_path / f"{name}.duckdb",
        out=tmp_path / "out",
    )
    path.write_text(text)
    return path


def test_create_config_then_check_runs_nothing(tmp_path: Path) -> None:
    config = tmp_path / "created.toml"
    created = run_cli_process("suite", "--create-config", "--config", str(config))
    assert created.returncode == 0, created.stderr
    assert config.read_text() == DEFAULT_CONFIG
    # the further commands of a test run the app in this process (a Python start is ~0.8 s of CPU)
    assert run_cli("suite", "--create-config", "--config", str(config)).returncode == 2  # never overwritten
    checked = run_cli("suite", "--config", str(small_config(tmp_path)), "--check")
    assert checked.returncode == 0, checked.stderr
    assert "engine cpu/torch" in checked.stdout and "disk (output dir)" in checked.stdout
    assert "host-cpu" in checked.stdout and "4 results to run, 1 group(s)" in checked.stdout
    assert not (tmp_path / "t.duckdb").exists()


def test_default_config_loads_every_family(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text(DEFAULT_CONFIG)
    config = load_config(path)
    assert sorted(config.model_families) == ["audio", "embedding", "multimodal", "text_generation", "vision"]
    assert config.include_web_platforms and config.parallel


def test_json_config_is_read_the_same(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "j", "model_families": {"vision": ["vit-tiny"]}, "batch_sizes": [2]}))
    config = load_config(path)
    assert (config.name, config.models, config.batch_sizes) == ("j", ["vit-tiny"], [2])


def test_the_max_time_key_reaches_both_halves_and_zero_means_no_budget(tmp_path: Path) -> None:
    from harness.suite.plan import suite_requests

    path = tmp_path / "budget.json"
    for value, budget in ((2.5, 2.5), (0, None)):
        families = {"embedding": ["bert-tiny"]}
        path.write_text(json.dumps({"model_families": families, "max_time_s": value, "min_iterations": 4}))
        native, web = suite_requests(load_config(path))
        assert native and web
        assert (native.max_time_s, native.min_iterations, web.max_time_s, web.min_iterations) == (budget, 4, budget, 4)


def test_filters_narrow_the_plan(tmp_path: Path) -> None:
    config = load_config(small_config(tmp_path, web=True))
    plan = plan_suite(config, models=["vision"], hardware=["cpu"])
    assert [s.name for s in plan.native.specs] == ["vit-tiny"] and plan.web is None
    with pytest.raises(ValueError, match="neither a family"):
        plan_suite(config, models=["nope"])
    with pytest.raises(ValueError, match="not in the config's hardware_types"):
        plan_suite(config, hardware=["cuda"])


def test_device_groups_keep_host_work_serial() -> None:
    host = [
        Target("cpu", "torch", "cpu"),
        Target("cpu", "onnxruntime", "CPUExecutionProvider"),
        Target("openvino", "openvino", "CPU"),
        Target("wasm", "onnxruntime-web", "wasm:threads=1"),
        Target("webgpu", "onnxruntime-web", "webgpu"),
    ]
    assert {device_group(t) for t in host} == {"host-cpu"}
    assert device_group(Target("cuda", "torch", "cuda")) == device_group(
        Target("cuda", "onnxruntime", "CUDAExecutionProvider")
    )
    assert device_group(Target("cuda", "torch", "cuda")) != "host-cpu"
    assert device_group(Target("openvino", "openvino", "GPU")) == "openvino:GPU"


def test_a_result_is_never_stored_twice(tmp_path: Path) -> None:
    case = Case(1, None, "fp32")
    result = Result("m", "vision", "random", Target("cpu", "torch", "cpu"), case, "ok", samples_ms=[1.0])
    with open_store(tmp_path / "d.duckdb") as store:
        run_id = store.start_run("test", {}, {})
        store.add_result(run_id, result, None)
        with pytest.raises(StoreError, match="never stored twice"):
            store.add_result(run_id, result, None)


def test_suite_run_then_older_than_and_report_modes(tmp_path: Path) -> None:
    # ORT only: two models, two families, and no torch worker in either of the test's two runs
    config = load_config(small_config(tmp_path, engines=("onnxruntime",)))
    summary = run_suite(plan_suite(config))
    assert summary.counts == {"ok": 2} and summary.report_error is None
    assert any(p.suffix == ".html" for p in summary.reports)
    stored = rows(config.db)
    assert len({r["result_key"] for r in stored}) == 2 and {r["model"] for r in stored} == {"bert-tiny", "vit-tiny"}
    assert rows(config.db, "SELECT suite_id, status FROM runs") == [{"suite_id": "t", "status": "completed"}]
    # nothing is older than an hour; everything is older than zero
    assert plan_suite(config, older_than=timedelta(hours=1)).total_results == 0
    assert plan_suite(config, older_than=timedelta(0)).total_results == 2
    # --resume of a completed suite starts a new run rather than reopening the finished one
    assert plan_suite(config, resume=True).resume_run_id is None
    skipped = run_cli_process("suite", "--config", str(config.source), "--older-than", "1h")
    assert skipped.returncode == 0 and "nothing run" in skipped.stdout, skipped.stderr
    assert len(rows(config.db, "SELECT * FROM runs")) == 1
    # the other commands run the app in this process (a Python start is ~0.8 s of CPU)
    assert run_cli("suite", "--config", str(config.source), "--older-than", "soon").returncode == 2
    plotted = run_cli("suite", "--config", str(config.source), "--plot-only", summary.run_id)
    assert plotted.returncode == 0 and f"{summary.run_id}.html" in plotted.stdout, plotted.stderr
    matrix = run_cli("suite", "--config", str(config.source), "--update-matrix-only")
    assert matrix.returncode == 0 and "compatibility_matrix" in matrix.stdout, matrix.stderr
    both = f"{summary.run_id},{summary.run_id}"
    aggregated = run_cli("suite", "--config", str(config.source), "--aggregate", both)
    assert aggregated.returncode == 0, aggregated.stderr
    assert len(json.loads((config.output_dir / f"{summary.run_id}-{summary.run_id}.json").read_text())["runs"]) == 2
    compared = run_cli("suite", "--config", str(config.source), "--plot-comparison", summary.run_id, summary.run_id)
    assert compared.returncode == 0 and "comparison.png" in compared.stdout, compared.stderr
    # CI: a baseline that does not resolve, or --fail-on-regression without one, is refused before running
    unknown = run_cli("suite", "--config", str(config.source), "--baseline", "nope")
    assert unknown.returncode == 2 and "--baseline nope: no run 'nope'" in unknown.stderr, unknown.stderr
    alone = run_cli("suite", "--config", str(config.source), "--fail-on-regression")
    assert alone.returncode == 2 and "needs --baseline" in alone.stderr
    assert len(rows(config.db, "SELECT * FROM runs")) == 1
    gated = run_cli(
        "suite", "--config", str(config.source), "--models", "vision", "--baseline", "latest", "--fail-on-regression"
    )
    assert gated.returncode in (0, 1) and "verdict" in gated.stdout, gated.stderr  # timings decide, not the test


def test_two_device_groups_run_side_by_side_into_one_run(tmp_path: Path) -> None:
    """cpu and cuda are separate groups, so two threads emit into one store; cuda is absent here and
    its rows say so, the cpu rows are measured, each key once. ORT only: a torch worker (seconds of imports)
    would add nothing the two groups do not already show."""
    config = small_config(tmp_path, hardware=("cpu", "cuda"), engines=("onnxruntime",))
    plan = plan_suite(load_config(config), models=["bert-tiny"])
    assert sorted(plan.groups()) == ["cuda", "host-cpu"]
    summary = run_suite(plan)
    stored = rows(plan.config.db)
    assert {(r["hardware"], r["status"]) for r in stored} == {("cpu", "ok"), ("cuda", "unsupported")}
    assert len({r["result_key"] for r in stored}) == len(stored) == summary.counts["ok"] + summary.counts["unsupported"]


def test_resume_after_the_config_changed_starts_a_new_run_and_says_why(tmp_path: Path) -> None:
    """--resume continues the suite's unfinished run only if it was started with this config."""
    path = small_config(tmp_path, engines=("onnxruntime",), families={"embedding": ["bert-tiny"]})
    config = load_config(path)
    with open_store(config.db) as store:  # what kill -9 leaves: a run still 'running', no results
        arguments = {"suite": config.name, "config": dataclasses.asdict(config)}
        unfinished = store.start_run("suite", arguments, {}, config.name)
    checked = run_cli("suite", "--config", str(path), "--resume", "--check")
    assert checked.returncode == 0 and f"continuing run {unfinished}" in checked.stdout, checked.stderr
    path.write_text(path.read_text().replace("benchmark_iterations = 5", "benchmark_iterations = 3"))
    done = run_cli("suite", "--config", str(path), "--resume")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert f"run {unfinished} was started with another config (benchmark_iterations: 5 → 3)" in said, said
    assert "starting a new run" in said
    runs = rows(config.db, "SELECT run_id, status FROM runs ORDER BY started_at")
    assert [r["status"] for r in runs] == ["running", "completed"]  # the old run is left as it was
    assert {r["run_id"] for r in rows(config.db)} == {runs[1]["run_id"]}


GENERATE = 'modes = ["inference", "generate"]\nnew_tokens = 4\nbenchmark_iterations = 2\nmin_iterations = 1'


def test_a_suite_generates_natively_and_in_the_browser_and_resume_runs_only_the_missing(tmp_path: Path) -> None:
    """modes/new_tokens reach both halves: --check shows the generate cases, the run stores generate rows
    of 4 tokens natively (ORT) and in the page (wasm); a run stopped before its generate cases resumes with
    exactly those, the inference rows kept."""
    text = small_config(tmp_path, engines=("onnxruntime",), families={"text_generation": ["gpt2-tiny"]}, web=True,
                        extra=GENERATE).read_text().replace("benchmark_iterations = 5\n", "")  # fmt: skip
    path = tmp_path / "t.toml"
    path.write_text(text)
    checked = run_cli("suite", "--config", str(path), "--check")
    said = " ".join(checked.stdout.split())
    assert checked.returncode == 0 and "results by mode: 2 inference, 2 generate (4 new tokens each)" in said, said
    config = load_config(path)
    summary = run_suite(plan_suite(config))
    stored = rows(config.db, "SELECT * FROM results ORDER BY created_at")
    assert summary.counts == {"ok": 4}, [(r["hardware"], r["mode"], r["status"], r["error"]) for r in stored]
    generated = {r["hardware"]: r for r in stored if r["mode"] == "generate"}
    assert sorted(generated) == ["cpu", "wasm"] and all(r["new_tokens"] == 4 for r in generated.values())
    assert all(r["decode_tokens_per_s"] and r["decode_tokens_per_s"] > 0 for r in generated.values())
    # what a kill -9 before the generate cases leaves: the run 'running', only the inference rows
    with duckdb.connect(str(config.db)) as db:
        db.execute("DELETE FROM samples WHERE result_id IN (SELECT result_id FROM results WHERE mode = 'generate')")
        db.execute("DELETE FROM results WHERE mode = 'generate'")
        db.execute("UPDATE runs SET status = 'running'")
    plan = plan_suite(config, resume=True)
    assert plan.resume_run_id == summary.run_id and plan.results_by_mode() == {"generate": 2}
    resumed = run_cli("suite", "--config", str(path), "--resume")
    assert resumed.returncode == 0 and "2 results still to run" in resumed.stdout, resumed.stderr
    after = rows(config.db, "SELECT * FROM results ORDER BY created_at")
    assert [r["result_id"] for r in after[:2]] == [r["result_id"] for r in stored if r["mode"] == "inference"]
    assert sorted((r["hardware"], r["mode"], r["status"]) for r in after[2:]) == [
        ("cpu", "generate", "ok"),
        ("wasm", "generate", "ok"),
    ]


def test_resume_continues_a_run_whose_config_predates_the_modes_keys(tmp_path: Path) -> None:
    """A run started before `modes`/`new_tokens` existed ran inference only: a config that leaves them at
    their defaults continues it; one that adds generate starts a new run, naming the key."""
    path = small_config(tmp_path, engines=("onnxruntime",), families={"text_generation": ["gpt2-tiny"]})
    config = load_config(path)
    old = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("modes", "new_tokens")}
    with open_store(config.db) as store:
        unfinished = store.start_run("suite", {"suite": config.name, "config": old}, {}, config.name)
    assert plan_suite(config, resume=True).resume_run_id == unfinished
    path.write_text(path.read_text().replace("timeout = 120", 'timeout = 120\nmodes = ["inference", "generate"]'))
    changed = plan_suite(load_config(path), resume=True)
    assert changed.resume_run_id is None and "modes: ['inference'] → ['inference', 'generate']" in changed.resume_note


def report_pid_then_hang(_: object) -> Iterator[int]:
    yield os.getpid()
    time.sleep(600)


@pytest.mark.parametrize("stop", ["failure", "ctrl-c"])
def test_a_stop_in_one_device_group_stops_them_all(stop: str) -> None:
    """Real threads and a real worker: when one device group fails, or Ctrl-C reaches the main thread,
    the other group's worker is killed, its thread is joined before the exception goes on, and nothing
    more is emitted (an interrupt is never recorded as an outcome)."""
    workers: list[int] = []
    running = threading.Event()
    emitted: list[Result] = []
    result = Result(
        "m", "vision", "random", Target("cuda", "torch", "cuda"), Case(1, None, "fp32"), "ok", samples_ms=[1.0]
    )

    def hanging_group(emit: Emit) -> None:
        run_isolated(report_pid_then_hang, None, 600, lambda pid: (workers.append(pid), running.set()))
        emit(result)  # only if the hang ended: a stopped group never gets here

    def stopping_group(emit: Emit) -> None:
        assert running.wait(120)
        if stop == "failure":
            raise RuntimeError("this device group failed")
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: Python raises KeyboardInterrupt in the main thread

    with pytest.raises(RuntimeError if stop == "failure" else KeyboardInterrupt):
        _parallel([hanging_group, stopping_group])(emitted.append)
    still = [t.name for t in threading.enumerate() if t.name.startswith("device-group")]
    worker = psutil.Process(workers[0]) if psutil.pid_exists(workers[0]) else None
    try:
        assert not still, f"device-group threads still running: {still}"
        assert worker is None or not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
        assert emitted == []
    finally:
        if worker is not None and worker.is_running():
            worker.kill()


def test_two_preparers_of_one_case_never_share_a_temp_file(tmp_path: Path) -> None:
    """Two device groups preparing one model write the same case file at once: each through its own
    temp file, renamed into place, so neither fails or leaves half a file, and no temp file remains."""
    path = tmp_path / "b1_s16.npz"
    feeds = {"input_ids": np.arange(256 * 1024, dtype=np.int64).reshape(1, -1)}
    failures: list[BaseException] = []

    def prepare_repeatedly() -> None:
        try:
            for _ in range(100):
                _save_case(path, feeds, [np.ones((1, 64), np.float32)])
        except BaseException as exc:
            failures.append(exc)

    groups = [threading.Thread(target=prepare_repeatedly) for _ in range(2)]
    for group in groups:
        group.start()
    for group in groups:
        group.join()
    assert not failures, failures[0]
    assert list(tmp_path.iterdir()) == [path]
    with np.load(path) as data:
        assert (data["in:input_ids"] == feeds["input_ids"]).all()
