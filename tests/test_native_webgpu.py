"""Native WebGPU (ONNX Runtime's WebGPU plugin EP on SwiftShader, through the loader and ICD Debian's Chromium
ships) beside the page's WebGPU EP: one shared run, the browser's cost read from it, and the refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli_process
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.analysis.browser_cost import browser_cost_table, browser_costs
from harness.analysis.compare import compare_runs, render
from harness.browser.both import run_both
from harness.browser.run import WebRequest
from harness.core.labels import case_label, marks
from harness.run.plan import BenchmarkRequest

pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
pytest.importorskip("onnxruntime_ep_webgpu")
QUICK = {"iterations": 2, "min_duration_s": 0.0, "warmup": 0, "max_iterations": 10}
TOKENS = 4
SHARED = {"models": ["bert-tiny", "llama-tiny"], "modes": ["inference", "generate"], "new_tokens": TOKENS,
          "sequence_lengths": [8], **QUICK}  # fmt: skip


def results(db: Path) -> list[dict[str, Any]]:
    from harness.store import open_store

    with open_store(db, read_only=True) as store:
        return store.results(store.resolve_run("latest"))


@pytest.fixture(scope="module")
def side_by_side(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:  # noqa: F811
    """Native WebGPU on bert-tiny and llama-tiny (inference, generation), and the page's llama-tiny
    generation on the same graph: one run (the page's side kept to the one case parity needs)."""
    out = tmp_path_factory.mktemp("native-webgpu")
    shared = {**SHARED, "db_path": out / "w.duckdb"}
    native = BenchmarkRequest(hardware=["webgpu"], engines=["onnxruntime"], output_dir=out / "reports", **shared)
    page = shared | {"models": ["llama-tiny"], "modes": ["generate"]}
    summary = run_both(native, WebRequest(hardware=["webgpu"], output_dir=None, **page))
    assert summary.counts == {"ok": 4}, summary
    return results(out / "w.duckdb"), out / "reports"


def _row(rows: list[dict[str, Any]], model: str, engine: str, mode: str) -> dict[str, Any]:
    found = next(r for r in rows if (r["model"], r["engine"], r["mode"]) == (model, engine, mode))
    return found | {"details": json.loads(found["details"])}


def test_native_webgpu_runs_on_swiftshader_and_says_it_is_software(side_by_side: Any) -> None:
    rows, _ = side_by_side
    for model, mode in (("bert-tiny", "inference"), ("llama-tiny", "generate")):
        row = _row(rows, model, "onnxruntime", mode)
        details = row["details"]
        assert row["status"] == "ok" and row["provider"] == "WebGpuExecutionProvider"
        assert ("fallback_adapter", "WebGPU on a software (fallback) adapter") in marks(row)  # the F mark
        assert details["probed_adapter"]["description"] == "SwiftShader Device (Subzero)"
        assert details["adapter_class"] == "software" and details["ort_webgpu_ep_allow_software_adapter"] is True
        assert details["webgpu_ep_version"] == "0.4.0" and "browser package" in details["vulkan_found"]
        assert details["session_providers"][0] == "WebGpuExecutionProvider" and details["webgpu_shaders"] == "f32"
        assert details["node_placement"]["WebGpuExecutionProvider"] > 0  # C: the rest, counted
        assert details["cpu_fallback_nodes"] == details["node_placement"].get("CPUExecutionProvider", 0)


def test_native_webgpu_generates_the_page_tokens_with_the_kv_cache_on_the_device(side_by_side: Any) -> None:
    rows, _ = side_by_side
    native, page = (_row(rows, "llama-tiny", engine, "generate") for engine in ("onnxruntime", "onnxruntime-web"))
    tokens = json.loads(native["generated_tokens"])
    assert len(tokens[0]) == TOKENS and tokens == json.loads(page["generated_tokens"])  # the same graph, both ways
    assert page["tokens_matched"] == TOKENS
    assert native["details"]["kv_cache"].startswith("on the webgpu device")
    assert native["ttft_ms"] > 0 and native["decode_tokens_per_s"] > 0


def test_the_report_gives_the_browser_cost_on_the_same_adapter(side_by_side: Any) -> None:
    rows, reports = side_by_side
    paired, unpaired = browser_costs(rows)
    assert unpaired == [] and len(paired) == 1  # the page ran llama-tiny's generation only
    (cost,) = paired
    assert cost.same == "adapter google swiftshader 0xc0de" and "WebGPU EP kernels" in cost.kernels
    assert cost.case == case_label(_row(rows, "llama-tiny", "onnxruntime", "generate"))  # the generation's case
    assert cost.pair.startswith("webgpu/onnxruntime-web:webgpu ↔ webgpu/onnxruntime:WebGpuExecutionProvider")
    for ratio in (cost.latency_ratio, cost.ttft_ratio, cost.decode_ratio):  # measured on both sides
        assert ratio is not None and ratio > 0
    markdown = (reports / f"{rows[0]['run_id']}.md").read_text()
    assert "## Browser cost" in markdown and "webgpu/onnxruntime-web:webgpu ↔ webgpu/onnxruntime" in markdown
    matrix = json.loads((reports / "compatibility_matrix.json").read_text())
    assert len(matrix["browser_cost"]["pairs"]) == 1
    assert "## Browser cost" in (reports / "compatibility_matrix.md").read_text()
    run_id = rows[0]["run_id"]
    comparison = compare_runs(reports.parent / "w.duckdb", run_id, run_id)
    assert len(comparison.browser_cost[run_id]["pairs"]) == 1
    assert f"## Browser cost in run A ({run_id})" in render(comparison, "md")


def _pair_rows(page: dict[str, Any], native: dict[str, Any]) -> list[dict[str, Any]]:
    case = {"run_id": "r", "model": "m", "batch_size": 1, "seq_len": 8, "precision": "fp32", "mode": "inference",
            "new_tokens": None, "status": "ok", "device": None, "latency_p50_ms": 2.0}  # fmt: skip
    return [case | {"engine": "onnxruntime-web", "result_id": "p", **page},
            case | {"engine": "onnxruntime", "result_id": "n", "latency_p50_ms": 1.0, **native}]  # fmt: skip


def test_a_pair_on_another_adapter_or_thread_count_is_refused() -> None:
    swiftshader = {"vendor": "google", "architecture": "swiftshader", "device": "0xc0de"}
    gpu = {"vendor": "nvidia", "architecture": "ampere", "device": "0x2204"}
    webgpu = {"hardware": "webgpu", "provider": "webgpu"}
    native = {"hardware": "webgpu", "provider": "WebGpuExecutionProvider"}
    same = _pair_rows(
        webgpu | {"details": {"probed_adapter": swiftshader}}, native | {"details": {"probed_adapter": swiftshader}}
    )
    assert [c.latency_ratio for c in browser_costs(same)[0]] == [2.0]
    other = _pair_rows(
        webgpu | {"details": {"probed_adapter": gpu}}, native | {"details": {"probed_adapter": swiftshader}}
    )
    assert browser_costs(other)[0] == [] and "different adapters" in browser_costs(other)[1][0].why
    wasm, cpu = (
        {"hardware": "wasm", "provider": "wasm:threads=1"},
        {"hardware": "cpu", "provider": "CPUExecutionProvider"},
    )
    threads = _pair_rows(wasm | {"details": {"threads_effective": 1}}, cpu | {"native_threads": 2, "details": {}})
    assert browser_costs(threads)[0] == [] and "different thread counts" in browser_costs(threads)[1][0].why
    unknown = _pair_rows(wasm | {"details": {"threads_effective": 1}}, cpu | {"details": {}})
    assert "not recorded" in browser_costs(unknown)[1][0].why
    threaded = {"provider": "CPUExecutionProvider:threads=1", "native_threads": 1, "details": {}}  # --native-threads 1
    paired = _pair_rows(wasm | {"details": {"threads_effective": 1}}, cpu | threaded)
    table = browser_cost_table(paired)
    assert table is not None and table.rows[0]["same"] == "1 thread" and table.rows[0]["latency page÷native"] == "2.00x"


def test_no_vulkan_icd_gives_an_unsupported_row_with_the_reason(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    db = tmp_path / "none.duckdb"
    env = {"VK_ICD_FILENAMES": str(tmp_path / "no-such-icd.json")}
    quick = ["--iterations", "2", "--warmup", "0", "--min-duration", "0"]
    done = run_cli_process("native", "--model", "bert-tiny", "--hardware", "webgpu", "--db", str(db), "--no-reports",
                   "--output-dir", str(tmp_path / "r"), *quick, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = results(db)
    assert row["status"] == "unsupported" and row["error"].startswith("Dawn has no WebGPU adapter"), row["error"]
    assert "VK_ICD_FILENAMES from the environment" in row["error"]


PROBE = """
import json, time
from harness.core.records import UnsupportedError
from harness.native import webgpu_ep
from harness.native.ort_devices import ep_devices
devices = ep_devices()
try:
    webgpu_ep.proved("fp16")
except UnsupportedError as exc:
    fp16 = str(exc)
webgpu_ep.FIRST_DISPATCH_S = 0.5
webgpu_ep._tiny_run = lambda: time.sleep(60)  # a device that never answers
times, errors = [], []
for _ in range(2):
    start = time.monotonic()
    try:
        webgpu_ep.proved("fp32")
    except UnsupportedError as exc:
        errors.append(str(exc))
    times.append(time.monotonic() - start)
print(json.dumps({"devices": devices, "fp16": fp16, "times": times, "errors": errors}))
"""


def test_a_stalled_device_fails_once_and_fp16_needs_shader_f16_and_ort_lists_its_devices() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "adapter lacks shader-f16" in found["fp16"] and "SwiftShader" in found["fp16"]
    assert len(found["errors"]) == 2 and "made no progress on a trivial dispatch in 0.5 s" in found["errors"][0]
    assert found["errors"][0] == found["errors"][1] and found["times"][1] < 0.1  # the verdict holds: no second wait
    webgpu = next(d for d in found["devices"] if d["ep"] == "WebGpuExecutionProvider")
    assert webgpu["ep_metadata"]["version"] == "0.4.0" and webgpu["type"] == "CPU"
    assert any(d["ep"] == "CPUExecutionProvider" for d in found["devices"])
