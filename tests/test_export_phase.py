"""A model's preparation is its own phase: the generate export made once (the graph with past serves
generation alone), shown as it goes, and an export killed mid-way leaves no staging folder in the export
cache."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
from conftest import run_cli

from harness.core.records import Target
from harness.native.base import Availability
from harness.prepare.cache import STAGING_PREFIX, remove_stale_staging, staging_dir
from harness.prepare.specs import load_specs
from harness.run.plan import BenchmarkRequest, Plan


def test_a_killed_export_leaves_no_staging_folder(tmp_path: Path) -> None:
    """The export's worker is killed (SIGKILL: its own cleanup never runs) with its staging folder written:
    the phases were shown, the row says the worker died, and no .staging-* folder is left in the export cache,
    a gone process's older one included."""
    exports = tmp_path / "cache" / "onnx"
    dead = exports / f"{STAGING_PREFIX}999999999-left"  # above any pid_max: its process is gone
    dead.mkdir(parents=True)
    db = tmp_path / "r.duckdb"
    done = run_cli(
        "native", "--model", "llama-tiny", "--mode", "generate", "--engines", "onnxruntime", "--hardware", "cpu",
        "--new-tokens", "4", "--iterations", "2", "--warmup", "0", "--min-duration", "0",
        "--db", str(db), "--output-dir", str(tmp_path / "out"),
        env={"ACCELHARNESS_CACHE_DIR": str(tmp_path / "cache"), "ACCELHARNESS_INJECT_FAULT": "export-kill"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "preparing llama-tiny: exporting ONNX with past key/values" in done.stdout
    status, error = duckdb.connect(str(db), read_only=True).execute("SELECT status, error FROM results").fetchone()
    assert status == "error" and "model preparation failed: worker killed by SIGKILL" in error, (status, error)
    assert not list(exports.glob(f"{STAGING_PREFIX}*"))


def test_staging_folders_of_a_live_process_stay(tmp_path: Path) -> None:
    """Only a gone process's staging folder is stale: a concurrent export's (this process's) is kept."""
    mine = staging_dir(tmp_path)
    assert mine.name.startswith(f"{STAGING_PREFIX}{os.getpid()}-")
    assert remove_stale_staging(tmp_path) == [] and mine.is_dir()


def test_generation_alone_needs_only_the_export_with_past() -> None:
    """Every ONNX case generating from the graph with past: no plain export; an inference case needs it."""
    model = load_specs()["llama-tiny"]
    ort, torch = (Target("cpu", engine, provider) for engine, provider in (("onnxruntime", "CPUExecutionProvider"),
                                                                            ("torch", "cpu")))  # fmt: skip
    targets = [(ort, Availability(True, "")), (torch, Availability(True, ""))]
    generate = Plan([model], targets, BenchmarkRequest(models=[model.name], modes=["generate"]))
    both = Plan([model], targets, BenchmarkRequest(models=[model.name], modes=["inference", "generate"]))
    assert generate.exports_past(model) and not generate.exports_plain(model)
    assert both.exports_past(model) and both.exports_plain(model)
