"""Bad input: a one-line error naming what is valid, exit code 2, and nothing written."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from conftest import QUICK, run_cli
from onnx import TensorProto, helper
from test_native_run import rows


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "bert-giant"], "unknown model 'bert-giant'; valid: all-minilm-l6-v2, bert-base-uncased"),
        (["--hardware", "tpu"], "unknown native hardware 'tpu'; valid: cpu, cuda"),
        (["--model-families", "robots"], "unknown model family 'robots'; valid: embedding"),
        (["--batch-sizes", "0"], "--batch-sizes must be integers >= 1"),
        (["--batch-sizes", "-1"], "--batch-sizes must be integers >= 1"),
        (["--batch-sizes", "two"], "--batch-sizes takes comma-separated integers"),
        (["--engines", "tensorflow"], "unknown engine 'tensorflow'; valid: torch, onnxruntime, openvino"),
        (["--precision", "fp8"], "unknown precision 'fp8'; valid: fp32"),
        (["--model-path", "/nonexistent/model.onnx"], "no such file or directory"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    db = tmp_path / "never.duckdb"
    done = run_cli("native", *args, "--db", str(db), "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not db.exists() and not (tmp_path / "out").exists()


def test_report_for_missing_db_exits_2(tmp_path: Path) -> None:
    done = run_cli("report", "--db", str(tmp_path / "none.duckdb"), "--output-dir", str(tmp_path))
    assert done.returncode == 2 and "no database at" in done.stderr


def test_hardware_lists_every_seed_platform() -> None:
    done = run_cli("hardware")
    assert done.returncode == 0, done.stderr
    for platform in ("cpu", "cuda", "rocm", "mps", "openvino", "qnn", "webnn", "webgpu", "wasm"):
        assert f"│ {platform} " in done.stdout
    assert "CPU:" in done.stdout and "memory" in done.stdout


def _tiny_onnx(path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"])], "tanh", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def test_any_onnx_file_runs_with_inputs_from_its_signature(tmp_path: Path) -> None:
    model = tmp_path / "tanh.onnx"
    _tiny_onnx(model)
    db = tmp_path / "file.duckdb"
    done = run_cli(
        "native",
        "--model-path",
        str(model),
        "--hardware",
        "cpu,openvino",
        "--batch-sizes",
        "3",
        "--sequence-lengths",
        "7",
        *QUICK,
        "--db",
        str(db),
        "--output-dir",
        str(tmp_path / "o"),
    )
    assert done.returncode == 0, done.stderr
    by_engine = {r["engine"]: r for r in rows(db)}
    assert by_engine["torch"]["status"] == "unsupported"
    assert "not applicable" in by_engine["torch"]["error"]
    for engine in ("onnxruntime", "openvino"):
        assert by_engine[engine]["status"] == "ok", by_engine[engine]["error"]
        assert '"input_shapes": {"x": [3, 7]}' in by_engine[engine]["details"]
        assert '"reference": "onnxruntime-cpu-fp32"' in by_engine[engine]["details"]


def test_local_model_directory_is_pretrained(tmp_path: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=500)
    ).save_pretrained(tmp_path / "my-bert")
    db = tmp_path / "dir.duckdb"
    done = run_cli(
        "native",
        "--model-path",
        str(tmp_path / "my-bert"),
        "--engines",
        "torch,onnxruntime",
        "--sequence-lengths",
        "8",
        *QUICK,
        "--db",
        str(db),
        "--output-dir",
        str(tmp_path / "o"),
    )
    assert done.returncode == 0, done.stderr
    results = rows(db)
    assert {r["weights"] for r in results} == {"pretrained"}
    assert {r["status"] for r in results} == {"ok"}
    assert {r["model"] for r in results} == {"my-bert"}


def test_summary_table_carries_the_reports_warnings() -> None:
    """The table printed after a run flags what the reports flag: a software WebGPU adapter, a changed precision."""
    from rich.console import Console

    from harness.cli import summary_table
    from harness.result import Case, Result, Target

    webgpu = Target("webgpu", "onnxruntime-web", "webgpu")
    openvino = Target("openvino", "openvino", "CPU")
    steady = [2.0, 2.01, 1.99, 2.0]
    results = [
        Result("bert-tiny", "embedding", "random", webgpu, Case(1, 32, "fp32"), "ok", samples_ms=steady,
               details={"fallback_adapter": True}),
        Result("bert-tiny", "embedding", "random", openvino, Case(1, 32, "fp16"), "ok", samples_ms=steady,
               precision="fp32"),
    ]  # fmt: skip
    console = Console(width=400, record=True)
    console.print(summary_table(results))
    webgpu_line, openvino_line = [line for line in console.export_text().splitlines() if "bert-tiny" in line]
    assert "WebGPU on a software (fallback) adapter" in webgpu_line
    assert "ran fp32 (asked fp16)" in openvino_line and "noisy" not in openvino_line
