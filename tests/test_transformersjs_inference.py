"""transformers.js for inference as users call it (issue 43): pipeline('feature-extraction') with pooling 'none' on
the same ONNX graph our own onnxruntime-web loop and native ORT run, laid out as its folder, in real Chromium. Its
row is timed by the same stop rule, states its versions and the threads it read back, and its output is held to the
parity rule every inference row follows: a graph served with a weight scaled by 1.05 (the faults hook) is a
`mismatch`. A pipeline tokenizer that gives other ids is said on the row and the model runs on the case's tensors.
What it cannot run is refused, saying why, before any page opens."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import run_cli, stored_rows
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.browser.generate import SCALED_WEIGHT_FAULT
from harness.browser.runtime_tokenizer import synthetic
from harness.browser.runtimes import _inference_refusal
from harness.core.records import Case
from harness.prepare.specs import load_specs
from harness.web import runtime_dist

pytestmark = [
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium"),
    pytest.mark.skipif(runtime_dist.problem("transformers.js") is not None, reason="run `make setup`"),
]
QUICK = ("--iterations", "2", "--min-duration", "0", "--sequence-lengths", "8", "--no-ceilings")
RUNTIMES = "onnxruntime-web,transformers.js"


def rows_of(db: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["engine"], r["batch_size"]): r for r in stored_rows(db)}


@pytest.fixture(scope="module")
def beside(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """bert-tiny at batch 1 and 2: our own page loop and transformers.js's pipeline, one run (`run` adds native ORT's
    rows beside them: its browser half is this)."""
    out = tmp_path_factory.mktemp("tjs-inference")
    done = run_cli("web", "--mode", "inference", "--model", "bert-tiny", "--hardware", "wasm", "--threads", "1",
                   "--runtimes", RUNTIMES, "--batch-sizes", "1,2", "--warmup", "0", *QUICK, "--db",
                   str(out / "a.duckdb"), "--no-reports")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return rows_of(out / "a.duckdb")


def test_the_pipeline_row_is_ok_beside_our_own_loop(beside: dict) -> None:
    for batch in (1, 2):
        rows = [beside[engine, batch] for engine in ("onnxruntime-web", "transformers.js")]
        assert [r["status"] for r in rows] == ["ok"] * 2, [r["error"] for r in rows]
        tjs = rows[1]
        assert tjs["provider"] == "wasm:threads=1" and tjs["latency_p50_ms"] > 0 and tjs["load_ms"] > 0
        assert tjs["max_abs_diff"] <= tjs["details"]["parity_tolerance"]  # the rule our own rows follow
        assert tjs["details"]["input_shapes"] == rows[0]["details"]["input_shapes"]  # the same tensors
        runtime = tjs["details"]["runtime"]
        assert runtime["pipeline"] == "feature-extraction" and runtime["pooling"] == "none"
        assert runtime["prompt"]["pipeline_ids_equal"] is True and runtime["prompt"]["job_dims"] == [batch, 8]
        assert runtime["timed"].startswith("extractor(texts") and runtime["tokenize_ms"] >= 0
        assert "top_values" not in runtime and "min_warmup_ms" not in tjs["details"]  # --warmup 0: no floor
    details = beside["transformers.js", 1]["details"]
    assert details["page_runtime_version"] == runtime_dist.versions("transformers.js")["@huggingface/transformers"]
    assert details["runtime"]["ort_web_version"] == runtime_dist.versions("transformers.js")["onnxruntime-web"]
    assert details["threads_effective"] == 1 and details["served_as"] == "onnx/model.onnx"
    assert details["pipeline_task"] == "feature-extraction" and details["tokenizer_served"].startswith("synthetic")


def bos_tokenizer(size: int) -> dict[str, bytes]:
    """The synthetic tokenizer with a post-processor that prepends <s>: the pipeline's ids are not the case's."""
    files = synthetic(size, 1, 2)
    vocab = json.loads(files["tokenizer.json"])
    bos, text = {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}
    vocab["post_processor"] = {"type": "TemplateProcessing", "single": [bos, text], "pair": [bos, text, text],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}  # fmt: skip
    return files | {"tokenizer.json": json.dumps(vocab).encode()}


def test_a_planted_weight_is_a_mismatch_and_other_pipeline_ids_run_the_case_tensors(
    web_cache: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted twice: the graph served with its largest weight scaled by 1.05 (the faults hook), and a tokenizer that
    prepends <s>. The transformers.js row is a mismatch by our own rows' rule, says its tokenizer's ids differ (9
    against 8), and ran the model on the case's tensors: the same outputs as our own loop on the same scaled graph.
    Its warm-up lasted at least the generation's floor (40% of --max-time here), our own loop's its count alone."""
    import harness.browser.runtimes as runtimes

    size = int(load_specs()["bert-tiny"].config["vocab_size"])
    monkeypatch.setattr(runtimes, "tokenizer_files", lambda *_: (bos_tokenizer(size), "planted: prepends <s>"))
    db = tmp_path / "p.duckdb"
    done = run_cli("web", "--mode", "inference", "--model", "bert-tiny", "--hardware", "wasm", "--threads", "1",
                   "--runtimes", RUNTIMES, "--warmup", "1", "--max-time", "1", *QUICK, "--db", str(db), "--no-reports",
                   env={"ACCELHARNESS_INJECT_FAULT": SCALED_WEIGHT_FAULT})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = rows_of(db)
    ours, tjs = rows["onnxruntime-web", 1], rows["transformers.js", 1]
    assert tjs["status"] == "mismatch" and tjs["max_abs_diff"] > tjs["details"]["parity_tolerance"], tjs["error"]
    assert abs(tjs["max_abs_diff"] - ours["max_abs_diff"]) < 1e-5  # the case's ids, not the pipeline's 9
    prompt = tjs["details"]["runtime"]["prompt"]
    assert prompt["pipeline_ids_equal"] is False and prompt["route"].startswith("ids")
    assert (prompt["differing_input"], prompt["pipeline_dims"], prompt["job_dims"]) == ("input_ids", [1, 9], [1, 8])
    assert tjs["details"]["runtime"]["timed"].startswith("extractor.model")
    assert tjs["details"]["min_warmup_ms"] == 400 and tjs["details"]["warmup_ms"] >= 400
    assert "min_warmup_ms" not in ours["details"] and ours["details"]["warmup_run"] == 1


@pytest.mark.parametrize(
    "model, says",
    [
        ("vit-tiny", "vit-tiny is a vit ViTModel of vision input"),
        ("llama-tiny", "its text-generation pipeline runs with --mode generate"),
        ("resnet-tiny", "resnet-tiny is a resnet ResNetModel of vision input"),
        ("clip-tiny", "of text+vision input"),
    ],
)
def test_what_the_feature_extraction_pipeline_cannot_run_is_refused_saying_why(model: str, says: str) -> None:
    """Decided from the spec before any page opens (harness.browser.runtimes.runtime_refusal); a text encoder of last
    hidden states runs at any batch, at a precision transformers.js names a file for."""
    spec = load_specs()[model]
    why = _inference_refusal(SimpleNamespace(spec=spec), Case(1, 8, "fp32"))  # type: ignore[arg-type]
    assert why is not None and "pipeline('feature-extraction')" in why and says in why
    for encoder in ("bert-tiny", "distilbert-tiny", "roberta-tiny", "all-minilm-l6-v2"):
        prepared = SimpleNamespace(spec=load_specs()[encoder])
        assert _inference_refusal(prepared, Case(4, 8, "int8")) is None  # type: ignore[arg-type]
    bert = SimpleNamespace(spec=load_specs()["bert-tiny"])
    assert "no file name for precision bf16" in str(_inference_refusal(bert, Case(1, 8, "bf16")))  # type: ignore[arg-type]
