"""`accelharness suite`: config checking, --check, resume/--older-than planning, device groups, report-only modes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import run_cli
from test_native_run import rows

from harness.result import Case, Result, Target
from harness.store import StoreError, open_store
from harness.suite import device_group, plan_suite, run_suite
from harness.suite_config import DEFAULT_CONFIG, load_config

SMALL = """
name = "{name}"
batch_sizes = [1]
sequence_lengths = [16]
warmup_iterations = 1
benchmark_iterations = 5
min_duration_s = 0
timeout = 120
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
) -> Path:
    """A quick suite config (tiny models, 5 iterations) writing to tmp_path/<name>.duckdb."""
    path = tmp_path / f"{name}.toml"
    text = SMALL.format(
        name=name,
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
    created = run_cli("suite", "--create-config", "--config", str(config))
    assert created.returncode == 0, created.stderr
    assert config.read_text() == DEFAULT_CONFIG
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
    config = load_config(small_config(tmp_path))
    summary = run_suite(plan_suite(config))
    assert summary.counts == {"ok": 4} and summary.report_error is None
    assert any(p.suffix == ".html" for p in summary.reports)
    stored = rows(config.db)
    assert len({r["result_key"] for r in stored}) == 4
    assert rows(config.db, "SELECT suite_id, status FROM runs") == [{"suite_id": "t", "status": "completed"}]
    # nothing is older than an hour; everything is older than zero
    assert plan_suite(config, older_than=timedelta(hours=1)).total_results == 0
    assert plan_suite(config, older_than=timedelta(0)).total_results == 4
    # --resume of a completed suite starts a new run rather than reopening the finished one
    assert plan_suite(config, resume=True).resume_run_id is None
    skipped = run_cli("suite", "--config", str(config.source), "--older-than", "1h")
    assert skipped.returncode == 0 and "nothing run" in skipped.stdout, skipped.stderr
    assert len(rows(config.db, "SELECT * FROM runs")) == 1
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
    its rows say so, the cpu rows are measured, each key once."""
    plan = plan_suite(load_config(small_config(tmp_path, hardware=("cpu", "cuda"))), models=["bert-tiny"])
    assert sorted(plan.groups()) == ["cuda", "host-cpu"]
    summary = run_suite(plan)
    stored = rows(plan.config.db)
    assert {(r["hardware"], r["status"]) for r in stored} == {("cpu", "ok"), ("cuda", "unsupported")}
    assert len({r["result_key"] for r in stored}) == len(stored) == summary.counts["ok"] + summary.counts["unsupported"]
