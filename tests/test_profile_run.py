"""--profile end to end: real runs of bert-tiny, native and in Chromium, through the CLI into the store,
`query --report ops`, `export` and the HTML report; and the profiler kept out of the timed samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import QUICK, on_one_cpu, run_cli, run_cli_process
from tiny_prepared import prepared

from harness.core.records import Target
from harness.native import get_backend
from harness.native.base import LoadRequest
from harness.run.measure import MeasureConfig, measure
from harness.run.memory import PeakRss
from harness.store import open_store

CHROMIUM = Path("/usr/bin/chromium").exists()
CASE = ["--batch-sizes", "2", "--sequence-lengths", "16", *QUICK]


def stored(db: Path) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(results with details parsed, operator rows per result_id) of the latest run."""
    with open_store(db, read_only=True) as store:
        results = [r | {"details": json.loads(r["details"])} for r in store.results(store.resolve_run("latest"))]
        operators: dict[str, list[dict[str, Any]]] = {}
        for row in store.query("SELECT * FROM operators ORDER BY share DESC"):
            operators.setdefault(row["result_id"], []).append(row)
    return results, operators


@pytest.fixture(scope="module")
def native_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One profiled run: native ORT CPU and OpenVINO, and (with Chromium here) the page's wasm and WebGPU
    (SwiftShader here), with its reports in `out` beside the store."""
    directory = tmp_path_factory.mktemp("profile-run")
    db = directory / "p.duckdb"
    web = ["--web-hardware", "wasm,webgpu"] if CHROMIUM else []
    done = run_cli(
        "run", "--model", "bert-tiny", "--engines", "onnxruntime,openvino", "--hardware", "cpu,openvino", *web,
        *CASE, "--profile", "--db", str(db), "--output-dir", str(directory / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return db


def test_every_native_result_has_its_operators(native_run: Path) -> None:
    """Each profiled result stores its operator rows (shares summing to 1, the engine's own op types,
    the provider that ran them), a profile summary and its graph's work per op class."""
    results, operators = stored(native_run)
    results = [r for r in results if r["engine"] != "onnxruntime-web"]  # the page's rows: the browser test's
    assert {r["engine"] for r in results} == {"onnxruntime", "openvino"}
    for result in results:
        assert result["status"] == "ok", result["error"]
        rows = operators[result["result_id"]]
        assert sum(r["share"] for r in rows) == pytest.approx(1.0)
        assert all(r["profile_iterations"] == 5 and r["calls"] >= 1 for r in rows)
        types = {r["op_type"] for r in rows}
        assert ("MatMul" if result["engine"] == "onnxruntime" else "FullyConnected") in types
        assert {r["provider"] for r in rows} == {result["provider"]}
        profile = result["details"]["profile"]
        assert profile["iterations"] == 5 and profile["operators"] == len(rows) and 0 < profile["coverage"] <= 1
        assert profile["graph_unknown_shapes"] == 0
        work = result["details"]["graph_work"]
        assert work["matmul"][0] == 2 * 2 * 16 * 2 * (4 * 128 * 128 + 2 * 128 * 512)  # 2 x tokens x weights


def test_query_ops_export_and_html_show_them(native_run: Path, tmp_path: Path) -> None:
    """`query --report ops` prints every operator row of the run, `export` writes the operators table,
    and the HTML report draws a bar of op types for every profiled result."""
    results, operators = stored(native_run)
    total = sum(len(rows) for rows in operators.values())
    done = run_cli_process("query", "--report", "ops", "--format", "json", "--db", str(native_run))
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert len(printed) == total
    assert {"node", "op_type", "ran_on", "ms_per_iter", "share", "flops", "bytes", "fallback"} <= set(printed[0])
    matmul = next(r for r in printed if r["op_type"] == "MatMul" and r["op_class"] == "matmul")
    assert matmul["flops"] > 0 and matmul["bytes"] > 0 and matmul["ms_per_iter"] > 0
    done = run_cli("export", "--out", str(tmp_path / "x"), "--table", "operators", "--db", str(native_run))
    assert done.returncode == 0, done.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "x" / "operators.parquet").num_rows == total
    done = run_cli("report", "--format", "html", "--out", str(tmp_path / "r.html"), "--db", str(native_run))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "Where the time goes" in page
    native = [r for r in results if r["engine"] != "onnxruntime-web"]
    assert all(r["result_id"] in operators for r in native) and len(native) == 2
    assert page.count('<div class="opbar">') == len(operators)  # a bar per result with operator rows


def test_a_run_without_profiles_says_so(tmp_path: Path) -> None:
    """No --profile: no operator rows, and the ops report says how to get them."""
    db = tmp_path / "n.duckdb"
    done = run_cli("native", "--model", "bert-tiny", "--engines", "onnxruntime", "--hardware", "cpu", *CASE,
                   "--db", str(db), "--no-reports", "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    results, operators = stored(db)
    assert operators == {} and "profile" not in results[0]["details"]
    done = run_cli("query", "--report", "ops", "--db", str(db))
    assert done.returncode == 0 and "run with --profile" in " ".join(done.stdout.split())


@pytest.mark.parametrize("engine, target", [
    ("onnxruntime", Target("cpu", "onnxruntime", "CPUExecutionProvider")),
    ("openvino", Target("openvino", "openvino", "CPU")),
])  # fmt: skip
@pytest.mark.timing  # a ratio measured side by side: `make test` runs it alone, after the parallel pass
def test_profiling_leaves_the_timed_samples_alone(engine: str, target: Target) -> None:
    """The same session measured with and without a profile after its loop, alternating rounds so the
    machine's noise hits both: the profiled measurements' samples are not slower beyond noise (the
    profiler runs on a twin session after the loop; it must not leak into the next loop either)."""
    # On one CPU, the session loaded there (its thread pool sized and placed by that mask): OpenVINO's two-thread pool
    # on two vCPUs, one of them another job's, gave rounds from 0.22 to 3.74 (medians 1.52 and 1.86 failed).
    with on_one_cpu():
        ratios = profiled_over_plain(engine, target)
    ratio = float(np.median(ratios))
    print(f"\nprofiled / plain p25, {engine}: {ratio:.3f} (rounds: {np.round(ratios, 2).tolist()})")
    assert ratio < 1.25, f"profiled p25 / unprofiled p25 = {ratio:.3f} (rounds: {np.round(ratios, 2).tolist()})"


def profiled_over_plain(engine: str, target: Target, rounds: int = 10) -> list[float]:
    """Each round's profiled p25 over its plain p25, measured back to back, the order alternating by round (what
    runs second in a round finds the caches the first warmed). The lower quartile: contention only adds time, and
    the quartile is made of the iterations it spared on both sides (tests/test_compare.py's method)."""
    model = prepared("bert-tiny")
    feeds, _ = model.load_case((2, 16))
    session = get_backend(engine).load(LoadRequest(model.spec, model.onnx_path, "fp32", feeds), target)
    plain = MeasureConfig(warmup=2, iterations=30, min_duration_s=0, max_iterations=30)
    profiled = MeasureConfig(warmup=2, iterations=30, min_duration_s=0, max_iterations=30, profile_iterations=5)
    ratios = []
    for number in range(rounds):
        p25 = {}
        for config in (profiled, plain) if number % 2 == 0 else (plain, profiled):
            measured = measure(session, feeds, config, PeakRss())
            assert (measured.profile is not None) == (config is profiled), measured.profile_error
            p25[config is profiled] = np.quantile(measured.samples_ms, 0.25)
        ratios.append(p25[True] / p25[False])
    return ratios


@pytest.mark.skipif(not CHROMIUM, reason="needs Chromium at /usr/bin/chromium")
def test_browser_profiles_and_the_per_op_type_ratios(native_run: Path) -> None:
    """`run --profile` on native ORT CPU, wasm and WebGPU (SwiftShader here): every result has operator
    rows; WebGPU's nodes on the wasm CPU EP are marked fallback and its GPU nodes carry kernel times
    where the device has timestamp-query (else the row says why not); the HTML report sets wasm
    against ORT CPU and WebGPU against wasm, op type by op type."""
    db = native_run
    results, operators = stored(db)
    by_hardware = {(r["hardware"], r["engine"]): r for r in results}
    for key in (("cpu", "onnxruntime"), ("wasm", "onnxruntime-web"), ("webgpu", "onnxruntime-web")):
        assert by_hardware[key]["status"] == "ok", by_hardware[key]["error"]
    wasm = operators[by_hardware[("wasm", "onnxruntime-web")]["result_id"]]
    assert {r["provider"] for r in wasm} == {"CPUExecutionProvider"} and not any(r["fallback"] for r in wasm)
    webgpu_result = by_hardware[("webgpu", "onnxruntime-web")]
    if "timestamp-query" in (webgpu_result["details"].get("device_features") or []):
        webgpu = operators[webgpu_result["result_id"]]
        fallback = [r for r in webgpu if r["fallback"]]
        assert fallback and {r["provider"] for r in fallback} == {"CPUExecutionProvider"}
        gpu = [r for r in webgpu if r["provider"] == "WebGpuExecutionProvider" and r["op_type"] == "MatMul"]
        assert gpu and all(r["kernel"] for r in gpu)  # the GPU programs that ran the node
        assert "gpu_timing" in webgpu_result["details"]["profile"]
    else:
        assert "timestamp-query" in webgpu_result["details"]["profile"]["error"]
    page = next((db.parent / "out").glob("*.html")).read_text()
    assert "wasm/onnxruntime-web:wasm:threads=1 vs cpu/onnxruntime:CPUExecutionProvider" in page
    if webgpu_result["result_id"] in operators:
        assert "webgpu/onnxruntime-web:webgpu vs wasm/onnxruntime-web:wasm:threads=1" in page
