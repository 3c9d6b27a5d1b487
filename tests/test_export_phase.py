"""A model's preparation is its own phase: the generate export made once (the graph with past serves
generation alone), shown as it goes, and an export killed mid-way leaves no staging folder in the export
cache."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import run_cli

from harness.core.records import Target
from harness.native.base import Availability
from harness.prepare.cache import STAGING_PREFIX, remove_stale_staging, staging_dir
from harness.prepare.prepared import PrepareJob, inference_on_past, prepare_model
from harness.prepare.specs import ModelSpec, load_specs
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
        "--no-reports", "--db", str(db), "--output-dir", str(tmp_path / "out"),
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
    """Every ONNX case generating from the graph with past: no plain export. Inference beside generation runs on
    the export with past too (one export serves both modes, issue 32); inference alone, or an encoder, needs the
    plain export."""
    specs = load_specs()
    model = specs["llama-tiny"]
    engines = (("cpu", "onnxruntime", "CPUExecutionProvider"), ("cpu", "torch", "cpu"), ("openvino", "openvino", "CPU"))
    targets = [(Target(*engine), Availability(True, "")) for engine in engines]

    def plan(modes: list[str], spec: ModelSpec = model) -> Plan:
        return Plan([spec], targets, BenchmarkRequest(models=[spec.name], modes=modes))

    assert plan(["generate"]).exports_past(model) and not plan(["generate"]).exports_plain(model)
    both = plan(["inference", "generate"])
    assert both.exports_past(model) and not both.exports_plain(model)
    assert inference_on_past(model, ["inference", "generate"]) and not inference_on_past(model, ["inference"])
    assert plan(["inference"]).exports_plain(model) and not plan(["inference"]).exports_past(model)
    for name in ("bert-tiny", "t5-tiny"):  # no past export, or an encoder–decoder's: inference keeps the plain one
        other = specs[name]
        assert plan(["inference", "generate"], other).exports_plain(other), name
        assert not inference_on_past(other, ["inference", "generate"]), name


@pytest.fixture(scope="module")
def both_modes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[dict[str, Any]]]:
    """`run --mode inference,generate` of llama-tiny natively and on wasm, on a cache holding only its export with
    past key/values (copied from the session's, where exporting is paid once): any other export the run made
    would be a second folder beside it."""
    out = tmp_path_factory.mktemp("both-modes")
    made = next(prepare_model(PrepareJob(load_specs()["llama-tiny"], [(1, 8)], with_past=True, plain=False)))
    assert made.onnx_past_path is not None, made.onnx_past_error
    shutil.copytree(made.onnx_past_path.parent, out / "cache" / "onnx" / made.onnx_past_path.parent.name)
    db = out / "r.duckdb"
    done = run_cli(
        "run", "--mode", "inference,generate", "--model", "llama-tiny", "--engines", "onnxruntime", "--hardware", "cpu",
        "--web-hardware", "wasm", "--sequence-lengths", "8", "--new-tokens", "4", "--iterations", "2", "--warmup", "0",
        "--min-duration", "0", "--no-reports", "--db", str(db), "--output-dir", str(out / "reports"),
        env={"ACCELHARNESS_CACHE_DIR": str(out / "cache")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as connection:
        cursor = connection.execute("SELECT * FROM results ORDER BY engine, mode")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) | {"details": json.loads(row[names.index("details")])}
                for row in cursor.fetchall()]  # fmt: skip
    return out / "cache", done.stdout, rows


def test_inference_and_generation_make_one_export_between_them(both_modes: Any) -> None:
    """Issue 32: one export, the one with past key/values, serves both modes (one export phase, no folder beside
    it in the export cache), and every row is ok: native ORT and the page, inference and generate."""
    cache, stdout, rows = both_modes
    [export] = (cache / "onnx").iterdir()
    assert export.name.endswith("-past"), export.name
    assert stdout.count("exporting ONNX") == 1 and "preparing llama-tiny: exporting ONNX with past key/values" in stdout
    assert [(r["engine"], r["mode"], r["status"]) for r in rows] == [
        (engine, mode, "ok") for engine in ("onnxruntime", "onnxruntime-web") for mode in ("generate", "inference")
    ], [r["error"] for r in rows]


def test_inference_on_the_export_with_past_is_its_first_step_checked_against_torch(both_modes: Any) -> None:
    """An inference row ran the export with past fed a past of length 0, and its outputs (the last position's
    logits, then each layer's present key and value) held against torch's; the row says which graph ran."""
    _, _, rows = both_modes
    for row in (r for r in rows if r["mode"] == "inference"):
        shapes = row["details"]["input_shapes"]
        assert shapes["past_key_0"][2] == 0 and shapes["input_ids"] == [1, 8], shapes
        assert row["details"]["export"]["inference_graph"].startswith("the export with past key/values")
        assert row["max_abs_diff"] <= row["details"]["parity_tolerance"]


def test_two_prepares_of_one_model_side_by_side_export_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs on one machine (or a parallel suite's device groups) preparing the same model at once: one builds
    the cache entry, the other waits on its lock and reads what it left. Each prepare is a real worker."""
    import threading

    from harness.run.worker import prepare_isolated

    monkeypatch.setenv("ACCELHARNESS_CACHE_DIR", str(tmp_path / "cache"))  # a cold cache both workers share
    job = PrepareJob(load_specs()["bert-tiny"], [(1, 8)])
    found: list[Any] = [None, None]

    def prepare(index: int) -> None:
        found[index] = prepare_isolated(job, 300)

    threads = [threading.Thread(target=prepare, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    prepared = [each for each, _ in found]
    assert all(p is not None and p.onnx_path is not None for p in prepared), [o for _, o in found]
    assert sorted(p.export["cache_hit"] for p in prepared) == [False, True]  # exported once, then read
    assert prepared[0].onnx_path == prepared[1].onnx_path
    assert list((tmp_path / "cache" / "cases" / ".locks").glob("*.lock"))  # the lock beside the entries
