"""`predict` from operators on a real profiled store: three tiny encoders profiled on ORT CPU through
the CLI, then a prediction for an ONNX file that was never measured, and `predict --evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICK, run_cli
from tiny_prepared import prepared

from harness.analysis.predict_model import compare_methods

PROFILED = ("bert-tiny", "distilbert-tiny", "roberta-tiny")
TARGET = "cpu/onnxruntime:CPUExecutionProvider"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 profiled results (3 models x 2 batches x 2 sequence lengths): enough for both methods."""
    directory = tmp_path_factory.mktemp("predict-ops")
    db = directory / "p.duckdb"
    done = run_cli(
        "native", "--model", ",".join(PROFILED), "--engines", "onnxruntime", "--hardware", "cpu",
        "--batch-sizes", "1,2", "--sequence-lengths", "8,16", *QUICK, "--profile",
        "--db", str(db), "--output-dir", str(directory / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return db


def test_unmeasured_onnx_file_is_predicted_from_its_operators(profiled: Path) -> None:
    """An .onnx file no run has seen (gpt2-tiny's export) is counted, not run, and predicted by operators
    on the profiled target, at each asked case, with the method and its held-out error named."""
    onnx_file = prepared("gpt2-tiny").onnx_path
    assert onnx_file is not None
    done = run_cli(
        "predict", "--model-path", str(onnx_file), "--batch-sizes", "1,4", "--sequence-lengths", "16",
        "--db", str(profiled), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout[done.stdout.index("{") :])
    rows = found["rows"]
    assert [(r["batch_size"], r["seq_len"]) for r in rows] == [(1, 16), (4, 16)]
    assert {f"{r['hardware']}/{r['engine']}:{r['provider']}" for r in rows} == {TARGET}
    assert all(r["method"] == "operators" and r["held_out_mape"] is not None for r in rows)
    assert 0 < rows[0]["predicted_latency_p50_ms"] < rows[1]["predicted_latency_p50_ms"]  # 4x the work
    assert "operators" in found["methods"]
    table = run_cli("predict", "--model-path", str(onnx_file), "--db", str(profiled))
    assert table.returncode == 0, table.stderr
    assert "operators" in table.stdout and "predictions, not measurements" in table.stdout


def test_evaluate_prints_both_methods_held_out_error(profiled: Path) -> None:
    """--evaluate scores each method by leave-one-model-out on the same profiled results, per target."""
    (errors,) = compare_methods(profiled)
    assert errors.rows == 12 and errors.models == 3
    assert errors.operators is not None and errors.log_linear is not None
    done = run_cli("predict", "--evaluate", "--db", str(profiled))
    assert done.returncode == 0, done.stderr
    assert f"{errors.operators:.1%}" in done.stdout and f"{errors.log_linear:.1%}" in done.stdout
    refused = run_cli("predict", "--evaluate", "--model", "bert-tiny", "--db", str(profiled))
    assert refused.returncode == 2 and "takes no --model" in refused.stderr
