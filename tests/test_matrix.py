"""The compatibility matrix, built from result rows seeded through Store.add_result: every class, ratings, evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, run_cli_process

from harness.analysis.matrix import (
    MATRIX_JSON,
    MATRIX_MD,
    RATING_THRESHOLDS,
    build_matrix,
    classify,
    load_rows,
    rate,
    update_matrix,
)
from harness.core.records import Case, Result, Target
from harness.store import open_store

B1 = Case(1, 32, "fp32")
B2 = Case(2, 32, "fp32")
ORT_NOT_IMPLEMENTED = (
    "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Trilu(14) node with name '/Trilu'"
)
OV_UNSUPPORTED_OP = "OpenVINO does not support the following ONNX operations: Trilu"


def result(model: str, target: Target, status: str, ms: float | None = None, case: Case = B1, **kw: Any) -> Result:
    family = {"bert-tiny": "embedding", "gpt2-tiny": "text_generation", "vit-tiny": "vision"}[model]
    samples = [ms] * 5 if ms is not None else []
    return Result(model, family, "random", target, case, status, samples_ms=samples, **kw)


TORCH = Target("cpu", "torch", "cpu")
ORT = Target("cpu", "onnxruntime", "CPUExecutionProvider")
# target column -> (seeded result, expected class, expected rating); bert-tiny's cpu/torch baseline p50 is 10 ms
BERT = {
    "cpu/torch": (result("bert-tiny", TORCH, "ok", 10.0), "compatible", "baseline"),
    "cpu/onnxruntime": (result("bert-tiny", ORT, "ok", 2.0), "compatible", "high"),  # 5x
    "openvino/openvino:CPU": (
        result("bert-tiny", Target("openvino", "openvino", "CPU"), "ok", 8.0),
        "compatible",
        "medium",
    ),
    "wasm/onnxruntime-web": (
        result("bert-tiny", Target("wasm", "onnxruntime-web", "wasm:threads=1"), "ok", 20.0),
        "compatible",
        "low",
    ),
    "webgpu/onnxruntime-web": (
        result(
            "bert-tiny", Target("webgpu", "onnxruntime-web", "webgpu"), "ok", 4.0, details={"fallback_adapter": True}
        ),
        "ep_fallback",
        "high",  # 2.5x, measured on the software adapter
    ),
    "cuda/onnxruntime": (
        result(
            "bert-tiny",
            Target("cuda", "onnxruntime", "CUDAExecutionProvider"),
            "ok",
            12.5,
            details={"cpu_fallback": True, "cpu_fallback_nodes": 3},
        ),
        "ep_fallback",
        "low",  # 0.8x
    ),
    "webnn/onnxruntime-web": (
        result("bert-tiny", Target("webnn", "onnxruntime-web", "webnn:gpu"), "error", error=ORT_NOT_IMPLEMENTED),
        "unsupported_op",
        None,
    ),
    "openvino/openvino:GPU": (
        result("bert-tiny", Target("openvino", "openvino", "GPU"), "unsupported", error=OV_UNSUPPORTED_OP),
        "unsupported_op",
        None,
    ),
    "rocm/torch": (
        result("bert-tiny", Target("rocm", "torch", "cuda"), "oom", error="CUDA out of memory"),
        "oom",
        None,
    ),
    "mps/torch": (
        result("bert-tiny", Target("mps", "torch", "mps"), "timeout", error="no progress in 300 s"),
        "timeout",
        None,
    ),
    "qnn/onnxruntime": (
        result(
            "bert-tiny",
            Target("qnn", "onnxruntime", "QNNExecutionProvider"),
            "mismatch",
            5.0,
            max_abs_diff=0.5,
            error="max_abs_diff 0.5 exceeds tolerance 0.0011",
        ),
        "mismatch",
        None,  # ratings come from ok cases only
    ),
    "cuda/torch": (
        result("bert-tiny", Target("cuda", "torch", "cuda"), "unsupported", error="torch.cuda.is_available() is False"),
        "unsupported",
        None,
    ),
    "directml/onnxruntime": (
        result(
            "bert-tiny",
            Target("directml", "onnxruntime", "DmlExecutionProvider"),
            "error",
            error="RuntimeError: D3D12 device removed",
        ),
        "error",
        None,
    ),
}


@pytest.fixture
def seeded(db: Path) -> dict[str, Any]:
    """Two runs: the first one's vit-tiny rows are superseded by the second's (the latest result counts)."""
    ids: dict[str, Any] = {}
    with open_store(db) as store:
        old = store.start_run("native", {}, {})
        ids["old_vit_torch"] = store.add_result(old, result("vit-tiny", TORCH, "ok", 10.0), None)
        ids["old_vit_ort"] = store.add_result(old, result("vit-tiny", ORT, "error", error="boom"), None)
        store.finish_run(old, "completed")
        run = store.start_run("native", {}, {})
        ids["bert"] = {target: store.add_result(run, row, None) for target, (row, _, _) in BERT.items()}
        ids["vit_torch"] = store.add_result(run, result("vit-tiny", TORCH, "ok", 4.0), None)
        ids["vit_ort"] = store.add_result(run, result("vit-tiny", ORT, "ok", 1.0), None)
        # gpt2-tiny on ORT: batch 1 ok (3x), batch 2 out of memory -> the cell shows oom, rated from batch 1
        for case, torch_ms in ((B1, 6.0), (B2, 9.0)):
            store.add_result(run, result("gpt2-tiny", TORCH, "ok", torch_ms, case=case), None)
        ids["gpt2_b1"] = store.add_result(run, result("gpt2-tiny", ORT, "ok", 2.0), None)
        ids["gpt2_b2"] = store.add_result(run, result("gpt2-tiny", ORT, "oom", case=B2, error="MemoryError"), None)
        store.finish_run(run, "completed")
        ids["runs"] = (old, run)
    return ids


def test_every_class_rating_and_evidence(db: Path, seeded: dict[str, Any]) -> None:
    matrix = build_matrix(load_rows(db))
    cells = matrix["models"]["bert-tiny"]["cells"]
    assert matrix["targets"][0] == "cpu/torch" and set(BERT) <= set(matrix["targets"])
    for target, (row, status, rating) in BERT.items():
        cell = cells[target]
        assert (cell["status"], cell["rating"]) == (status, rating), target
        (evidence,) = cell["evidence"]
        assert evidence["result_id"] == seeded["bert"][target]
        assert evidence["run_id"] == seeded["runs"][1] and evidence["model"] == "bert-tiny"
        assert evidence["date"][:4].isdigit() and evidence["case"] == "b1 s32 fp32"
        assert evidence["median_latency_ms"] == (row.samples_ms[0] if row.samples_ms else None)
        assert evidence["error"] == (row.error.splitlines()[0] if row.error else None)
    assert cells["cpu/onnxruntime"]["speedup"] == pytest.approx(5.0)
    assert cells["openvino/openvino:CPU"]["speedup"] == pytest.approx(1.25)
    assert cells["wasm/onnxruntime-web"]["speedup"] == pytest.approx(0.5)
    assert cells["webgpu/onnxruntime-web"]["speedup"] == pytest.approx(2.5)
    assert cells["cuda/onnxruntime"]["evidence"][0]["flags"] == ["3 nodes fell back to CPU"]
    assert cells["qnn/onnxruntime"]["speedup"] is None
    # the family row aggregates its models (here one) the same way
    assert matrix["families"]["embedding"]["cells"]["webnn/onnxruntime-web"]["status"] == "unsupported_op"


def test_latest_result_per_case_wins(db: Path, seeded: dict[str, Any]) -> None:
    matrix = build_matrix(load_rows(db))
    vit = matrix["models"]["vit-tiny"]["cells"]
    assert vit["cpu/onnxruntime"]["status"] == "compatible"  # the older run's error is superseded
    assert [e["result_id"] for e in vit["cpu/onnxruntime"]["evidence"]] == [seeded["vit_ort"]]
    assert [e["result_id"] for e in vit["cpu/torch"]["evidence"]] == [seeded["vit_torch"]]
    assert vit["cpu/onnxruntime"]["speedup"] == pytest.approx(4.0)  # against the newer 4 ms baseline
    # --run restricts to one run: the old run alone has vit-tiny's error and no bert-tiny
    old = build_matrix(load_rows(db, seeded["runs"][0]))
    assert old["models"]["vit-tiny"]["cells"]["cpu/onnxruntime"]["status"] == "error"
    assert "bert-tiny" not in old["models"] and old["runs"] == [seeded["runs"][0]]


def test_a_cell_with_several_cases_shows_the_most_serious(db: Path, seeded: dict[str, Any]) -> None:
    cell = build_matrix(load_rows(db))["models"]["gpt2-tiny"]["cells"]["cpu/onnxruntime"]
    assert cell["status"] == "oom" and cell["counts"] == {"compatible": 1, "oom": 1} and cell["cases"] == 2
    assert cell["rating"] == "high" and cell["speedup"] == pytest.approx(3.0)  # from the ok batch-1 case
    assert [e["result_id"] for e in cell["evidence"]] == [seeded["gpt2_b1"], seeded["gpt2_b2"]]


def test_rating_thresholds_and_classification_rules() -> None:
    assert RATING_THRESHOLDS == {"high": 2.0, "medium": 1.0}
    assert [rate(v) for v in (2.0, 1.99, 1.0, 0.99, None)] == ["high", "medium", "medium", "low", None]
    base = {"status": "error", "details": "{}"}
    assert classify(base | {"error": "Unsupported operator: Trilu"}) == "unsupported_op"
    assert classify(base | {"error": "worker died: SIGSEGV"}) == "error"
    assert classify({"status": "unsupported", "error": "no CUDAExecutionProvider", "details": None}) == "unsupported"
    assert classify({"status": "ok", "details": json.dumps({"cpu_fallback": False})}) == "compatible"


def test_update_matrix_only_rebuilds_the_files_from_the_db(db: Path, seeded: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "matrix"
    done = run_cli("matrix", "--db", str(db), "--output-dir", str(out), "--update-matrix-only")
    assert done.returncode == 0, done.stderr
    document = json.loads((out / MATRIX_JSON).read_text())
    assert document["models"]["bert-tiny"]["cells"]["rocm/torch"]["status"] == "oom"
    markdown = (out / MATRIX_MD).read_text()
    assert "| bert-tiny (embedding) |" in markdown and "🚫 unsupported_op" in markdown
    assert seeded["bert"]["directml/onnxruntime"] in markdown  # evidence names result ids
    # a newer run's measurement reaches the files on the next rebuild; nothing is run (no new run appears)
    with open_store(db) as store:
        newer = store.start_run("native", {}, {})
        store.add_result(newer, result("bert-tiny", Target("rocm", "torch", "cuda"), "ok", 1.0), None)
        store.finish_run(newer, "completed")
        runs_before = store.query("SELECT count(*) AS n FROM runs")[0]["n"]
    done = run_cli("matrix", "--db", str(db), "--output-dir", str(out), "--update-matrix-only")
    assert done.returncode == 0, done.stderr
    cell = json.loads((out / MATRIX_JSON).read_text())["models"]["bert-tiny"]["cells"]["rocm/torch"]
    assert (cell["status"], cell["rating"]) == ("compatible", "high")
    with open_store(db, read_only=True) as store:
        assert store.query("SELECT count(*) AS n FROM runs")[0]["n"] == runs_before
    # the Python entry point writes the same two files; the plain command also prints the family table
    assert update_matrix(db, tmp_path / "api") == [tmp_path / "api" / MATRIX_JSON, tmp_path / "api" / MATRIX_MD]
    shown = run_cli("matrix", "--db", str(db), "--output-dir", str(out))
    assert shown.returncode == 0 and "embedding" in shown.stdout and "unsupported_op" in shown.stdout


def test_matrix_of_a_missing_db_exits_2(tmp_path: Path) -> None:
    done = run_cli_process("matrix", "--db", str(tmp_path / "none.duckdb"), "--update-matrix-only")
    assert done.returncode == 2 and "no database" in done.stderr


def test_training_and_generation_get_their_own_columns(db: Path) -> None:
    """ORT cannot take a training step; that must not turn its inference cell `unsupported` (issue 11, item 2)."""
    from test_decide import seed_modes

    seed_modes(db)
    matrix = build_matrix(load_rows(db))
    assert matrix["targets"] == [
        "cpu/torch", "cpu/onnxruntime", "openvino/openvino:CPU",
        "cpu/torch (generate)",
        "cpu/torch (training)", "cpu/onnxruntime (training)", "openvino/openvino:CPU (training)",
    ]  # fmt: skip
    cells = matrix["models"]["m2"]["cells"]
    assert cells["cpu/onnxruntime"]["status"] == "compatible" and cells["cpu/onnxruntime"]["cases"] == 4
    assert cells["cpu/onnxruntime"]["speedup"] == pytest.approx(3.0)  # torch's inference ÷ ORT's, no training step
    assert cells["cpu/onnxruntime (training)"]["status"] == "unsupported"
    assert cells["cpu/torch (training)"]["rating"] == "baseline"
    assert "cpu/torch (generate)" not in cells and matrix["models"]["m1"]["cells"]["cpu/torch (generate)"]["cases"] == 2
    family = matrix["families"]["embedding"]["cells"]
    assert family["openvino/openvino:CPU"]["status"] == "compatible"
    assert family["openvino/openvino:CPU (training)"]["counts"] == {"unsupported": 16}
