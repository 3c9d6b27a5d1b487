"""The encoder–decoder folders people ship (issue 35), and a precision per graph: a transformers.js-layout Whisper
folder built here from the harness's own whisper-tiny export (test_seq2seq.py's, when it ran first in the session)
with an fp32 encoder and a q4 decoder (harness.prepare.variants), run natively (ORT CPU) and in the page (wasm) with
`--precision encoder=fp32,decoder=q4`, its tokens checked on the same two files; the same page served a scaled
decoder weight (the faults hook) is a mismatch; an optimum-layout folder recognised; a folder with an escaping
symlink or no decoder refused with exit 2."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, run_cli_process
from test_web import web_cache  # noqa: F401 (the session's export cache)
from test_web_generate import results

from harness.browser.both import run_both
from harness.browser.execute import run_web
from harness.browser.generate import SCALED_WEIGHT_FAULT
from harness.browser.run import WebRequest
from harness.core.faults import FAULT_ENV
from harness.run.plan import BenchmarkRequest

pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
PER_GRAPH = "encoder=fp32,decoder=q4"
QUICK = {"iterations": 2, "min_duration_s": 0.0, "warmup": 0, "max_iterations": 10, "modes": ["generate"],
         "new_tokens": 4, "sequence_lengths": [8], "precision": PER_GRAPH}  # fmt: skip
FILES = {"encoder": "onnx/encoder_model.onnx", "decoder": "onnx/decoder_model_merged_q4.onnx"}


@pytest.fixture(scope="module")
def export(web_cache: Path) -> Path:  # noqa: F811
    """The harness's own whisper-tiny layout folder (config.json, encoder_model.onnx, both decoders and the merged
    one), prepared in a worker as a run prepares it: from the session's cache when test_seq2seq.py made it."""
    from harness.prepare.prepared import PrepareJob
    from harness.prepare.specs import select_specs
    from harness.run.worker import prepare_isolated

    spec = select_specs(["whisper-tiny"], None, False)[0]
    prepared, outcome = prepare_isolated(PrepareJob(spec, spec.case_shapes([1], [8]), with_past=True, plain=False), 600)
    assert prepared is not None and prepared.onnx_past_path is not None, outcome
    return prepared.onnx_past_path.parent


@pytest.fixture(scope="module")
def folder(export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """transformers.js's layout: config.json, onnx/encoder_model.onnx (fp32), onnx/decoder_model_merged.onnx and its
    q4 conversion onnx/decoder_model_merged_q4.onnx (the harness's MatMulNBits, If branches included)."""
    from harness.prepare.variants import precision_variant

    built = tmp_path_factory.mktemp("tjs") / "whisper-tjs"
    (built / "onnx").mkdir(parents=True)
    shutil.copyfile(export / "config.json", built / "config.json")
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        shutil.copyfile(export / name, built / "onnx" / name)
    shutil.copyfile(precision_variant(export / "decoder_model_merged.onnx", "q4").path, built / FILES["decoder"])
    write_word_tokenizer(built / "tokenizer.json")
    return built


def write_word_tokenizer(path: Path) -> None:
    """A word-level tokenizer.json over the tiny model's 1,000 ids (token i is the word `t<i>`): what a user's folder
    carries beside its graphs, so each row's tokens are stored as its text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(1000)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


@pytest.fixture(scope="module")
def rows(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The folder natively (ORT CPU) and in the page (wasm) at encoder=fp32,decoder=q4, as one run."""
    db = tmp_path_factory.mktemp("tjs-run") / "f.duckdb"
    shared = {"model_path": folder, "db_path": db, **QUICK}
    native = BenchmarkRequest(hardware=["cpu"], engines=["onnxruntime"], output_dir=None, **shared)
    summary = run_both(native, WebRequest(hardware=["wasm"], output_dir=None, **shared))
    assert summary.counts == {"ok": 2}, summary
    return {row["engine"]: row for row in results(db)}


def test_a_transformers_js_whisper_folder_runs_an_fp32_encoder_and_a_q4_decoder(rows: dict[str, Any]) -> None:
    native, page = rows["onnxruntime"], rows["onnxruntime-web"]
    for row in (native, page):
        assert row["precision"] == row["requested_precision"] == PER_GRAPH
        assert row["details"]["graph_files"] == FILES  # each graph's file, by its path in the folder
        assert row["details"]["graph_precision"] == {"encoder": "fp32", "decoder": "q4"}
        assert row["token_reference"] == f"onnxruntime CPUExecutionProvider on {FILES['encoder']} + {FILES['decoder']}"
        assert row["agreement_top1"] is not None  # beside the fp32 graphs: both fp32 files of the folder
        assert row["details"]["quality_reference"].endswith("onnx/decoder_model_merged.onnx (fp32)")
        # the folder's encoder hears speech as a spec model's does (harness.prepare.audio), and says which
        assert row["details"]["audio_input"].startswith(("espeak-ng (", "synthetic white noise, not speech"))
        assert row["details"]["audio_seconds"] == 30.0 and row["real_time_factor"] > 0
    assert json.loads(page["generated_tokens"]) == json.loads(native["generated_tokens"])
    assert page["tokens_matched"] == 4 and page["details"]["encoder_ms"] > 0
    # Issue 42: speech has no input_ids, and a row's text was decoded only beside them (output_text NULL although
    # the folder has its tokenizer); every row's tokens are now its text, prompt_ids NULL (no prompt tokens), and the
    # folder's family is its model_type's (audio, where every layout folder was `embedding`).
    for row in (native, page):
        tokens = json.loads(row["generated_tokens"])
        assert row["output_text"] == " ".join(f"t{i}" for i in tokens[0]) and row["prompt_ids"] is None
        assert json.loads(row["output_texts"]) == [row["output_text"]] and "output_text" not in row["details"]
        assert row["family"] == "audio"
    # Issue 45: every speech row's word error rate, from its own text against the words the audio speaks (the
    # harness's espeak-ng passage); the folder has no normalizer.json, and says so. Random weights write `t<i>`
    # words, none of the passage's: every word of the prefix they cover is a substitution, WER 1. Equal tokens,
    # equal WER: the page's row is native ORT's, and the report says so beside its real-time factor.
    from harness.report.generation import wer_text

    for row in (native, page):
        details = row["details"]
        if not details["audio_input"].startswith("espeak-ng ("):
            assert details["wer"] is None and details["wer_not_measured"].startswith("the input is synthetic white")
            continue
        assert details["wer"] == 1.0 and details["wer_reference"] == "the harness's espeak-ng passage v1"
        normalizer = details["wer_normalizer"]
        assert normalizer.startswith("Whisper's EnglishTextNormalizer") and "no normalizer.json" in normalizer
        words = len(details["wer_hypothesis"].split())  # `t12` normalized is two words, `t 12`
        assert details["wer_edits"] == {"substitutions": words, "deletions": 0, "insertions": 0}
        assert details["wer_words"].startswith(f"the reference's first {words} of ")
    assert wer_text(page, [native, page]).endswith("(= native ORT)")
    computed = native["details"]["graph_compute_precision"]  # read from the graphs ORT optimized, If branches too
    assert (
        set(computed) == {"encoder", "decoder"} and computed["encoder"]["fp32"] > 0 and computed["decoder"]["fp32"] > 0
    )


def test_a_page_served_a_scaled_decoder_weight_is_a_mismatch(
    rows: dict[str, Any], folder: Path, tmp_path: Path
) -> None:
    """The page is served the q4 decoder with its largest weight matrix scaled by 1.05 (the faults hook); the row
    is checked on the folder's files it names, so the step logits leave native ORT's."""
    os.environ[FAULT_ENV] = SCALED_WEIGHT_FAULT
    try:
        request = WebRequest(model_path=folder, db_path=tmp_path / "p.duckdb", output_dir=None, hardware=["wasm"],
                             **QUICK)  # fmt: skip
        assert run_web(request).counts == {"mismatch": 1}
    finally:
        os.environ.pop(FAULT_ENV)
        (folder / "onnx" / "decoder_model_merged_q4-scaled.onnx").unlink(missing_ok=True)
    (row,) = results(tmp_path / "p.duckdb")
    assert row["token_reference"] == rows["onnxruntime-web"]["token_reference"]  # the same files, the folder's
    assert "differs from native ORT's" in row["error"] or "prefill logits" in row["error"], row["error"]


def test_an_optimum_seq2seq_export_is_recognised(export: Path, tmp_path: Path) -> None:
    """optimum's top-level layout: encoder_model.onnx with a merged decoder (the harness's export folder is one),
    or with decoder_model.onnx + decoder_with_past_model.onnx; the folder's graph is its encoder, generation runs
    the decoder beside it, and its one precision per graph is what runs by default."""
    from harness.prepare.folder_layouts import seq2seq_decoder
    from harness.prepare.folders import file_precision, own_precision
    from harness.prepare.seq2seq import precision_files
    from harness.prepare.specs import spec_from_path

    split = tmp_path / "optimum-split"
    split.mkdir()
    for name in ("config.json", "encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"):
        os.link(export / name, split / name)
    for path, decoder in ((export, "decoder_model_merged.onnx"), (split, "decoder_model.onnx")):
        spec = spec_from_path(path, None)
        assert spec.local_path == (path / "encoder_model.onnx").resolve() and spec.is_encoder_decoder
        assert seq2seq_decoder(spec.local_path) == spec.local_path.parent / decoder
        assert own_precision(path) == "fp32"
    files, ran, facts = precision_files(split / "decoder_model.onnx", "fp32")
    assert not files.merged and ran == "fp32" and set(facts["graph_files"]) == {"encoder", "decoder", "decoder_past"}
    # the harness's export converted: each graph its own q4 file (one export folder once gave all three one entry)
    files, ran, _ = precision_files(export / "decoder_model.onnx", "q4")
    converted = (files.encoder, files.decoder, files.decoder_past)
    assert ran == "q4" and len(set(converted)) == 3 and {file_precision(f) for f in converted} == {"q4"}


def test_a_folder_with_an_escaping_symlink_or_no_decoder_is_refused(folder: Path, tmp_path: Path) -> None:
    """Both refused before anything runs: exit 2, the file and what is valid named, no traceback, no store."""
    escaping = tmp_path / "escaping"
    shutil.copytree(folder, escaping)
    outside = tmp_path / "elsewhere.onnx"
    (escaping / FILES["decoder"]).rename(outside)
    (escaping / FILES["decoder"]).symlink_to(outside)
    lonely = tmp_path / "lonely"
    (lonely / "onnx").mkdir(parents=True)
    shutil.copyfile(folder / "config.json", lonely / "config.json")
    os.link(folder / FILES["encoder"], lonely / FILES["encoder"])
    expected = {escaping: "outside the model folder", lonely: "has no decoder beside it: an encoder–decoder folder"}
    for path, message in expected.items():  # the first as a real process, the second through the app in this one
        db = tmp_path / f"{path.name}.duckdb"
        cli = run_cli_process if path == escaping else run_cli
        done = cli("native", "--model-path", str(path), "--mode", "generate", "--db", str(db), "--output-dir",
                       str(tmp_path / "out"))  # fmt: skip
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not db.exists()


def test_a_precision_per_graph_is_parsed_and_checked_in_one_place() -> None:
    """--precision's one parse (harness.core.precision.parse_precisions, the option's check): per-graph items
    grouped into one label, canonical; a graph left out, an unknown graph or precision refused; a per-graph
    precision for a model of one graph refused; the looser graph's tolerance for its rows, and shader-f16 asked
    for where any graph computes in fp16."""
    from harness.core.adapters import computes_fp16
    from harness.core.options import RequestError
    from harness.core.parity import logit_tolerance
    from harness.core.precision import parse_precisions
    from harness.run.plan import validate

    assert parse_precisions(["fp32,decoder=q4,encoder=fp32", "encoder=q4,decoder=q4"]) == ["fp32", PER_GRAPH, "q4"]
    refused = (("encoder=fp32", "names no precision for the decoder"),
               ("encoder=fp32,encoder=q4,decoder=q4", "names no precision for the decoder"),
               ("text=fp32,decoder=q4", "unknown graph 'text'"), ("encoder=fp8,decoder=q4", "'fp8'"))  # fmt: skip
    for given, message in refused:
        with pytest.raises(RequestError, match=f"--precision: .*{message}"):
            validate(BenchmarkRequest(models=["whisper-tiny"], precision=given, output_dir=None))
    with pytest.raises(RequestError, match="bert-tiny is no encoder–decoder"):
        validate(BenchmarkRequest(models=["bert-tiny"], precision=PER_GRAPH, output_dir=None))
    assert computes_fp16("encoder=fp32,decoder=q4f16") and not computes_fp16(PER_GRAPH)  # WebGPU's shader-f16
    loosest = logit_tolerance(PER_GRAPH, "browser")
    assert loosest == logit_tolerance("q4", "browser") != logit_tolerance("fp32", "browser")
