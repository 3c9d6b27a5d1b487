"""Issue 25 item 3: `--model-path` takes the folders people deploy, each built here by its own tool from a tiny
random checkpoint (no hub): onnxruntime-genai's builder (int4, external data, symbolic past head size), a
transformers.js layout (the harness's own export under onnx/ with q4 and q4f16 siblings) and optimum's ONNX
exporter (model.onnx with past). Each generates natively on ONNX Runtime and in Chromium's wasm, its tokens
checked against native ORT's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli, run_cli_process
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.prepare.prepared import PrepareJob, prepare_model
from harness.prepare.specs import load_specs, spec_from_path
from harness.prepare.variants import precision_variant
from harness.store import open_store

pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
TOKENS = 4
# the done-when command of the issue, with the smallest case; no reports (no test reads one: the rows are the store's)
RUN = ("run", "--hardware", "cpu", "--web-hardware", "wasm", "--mode", "generate", "--new-tokens", str(TOKENS),
       "--batch-sizes", "1", "--sequence-lengths", "8", "--iterations", "2", "--warmup", "0",
       "--min-duration", "0", "--no-reports")  # fmt: skip


def rows_of(db: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest run's rows by (engine, precision)."""
    with open_store(db, read_only=True) as store:
        rows = store.results(store.resolve_run("latest"))
    return {(r["engine"], r["requested_precision"]): r | {"details": json.loads(r["details"])} for r in rows}


def generated_natively_and_in_the_page(
    db: Path, model: str, precisions: tuple[str, ...]
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each precision's native ORT and page rows, checked: generated ok under that precision, the page's
    tokens those native ORT generated from the same file."""
    rows, checked = rows_of(db), []
    for precision in precisions:
        native, page = rows["onnxruntime", precision], rows["onnxruntime-web", precision]
        for row in (native, page):
            assert (row["status"], row["model"], row["mode"]) == ("ok", model, "generate"), row["error"]
            assert row["precision"] == precision
        assert page["generated_tokens"] == native["generated_tokens"]
        checked.append((precision, native, page))
    return checked


def tiny_llama_checkpoint(folder: Path) -> Path:
    """A random 2-layer llama with a word-level tokenizer.json (the builder copies the tokenizer); head size
    16, the smallest ORT's GroupQueryAttention takes."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", eos_token="t2").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def genai_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxruntime_genai", reason="the [genai] extra builds the folder")
    root = tmp_path_factory.mktemp("genai")
    checkpoint = tiny_llama_checkpoint(root / "checkpoint")
    built = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint),
                            "-o", str(root / "tiny-genai"), "-p", "int4", "-e", "cpu"],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    return root / "tiny-genai"


# optimum-onnx 0.1.0 needs transformers < 4.58 (and the hub client and tokenizers that go with it), this project
# pins transformers 5: the exporter runs from a folder of just those packages put ahead of this venv's, which
# lends it torch and onnx. Fetched from the package index; the test skips, saying so, where it cannot be.
OPTIMUM_OVERLAY = ("optimum-onnx==0.1.0", "optimum==2.1.0", "transformers==4.57.6", "huggingface_hub==0.36.2",
                   "tokenizers==0.22.2")  # fmt: skip


@pytest.fixture(scope="module")
def optimum_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("optimum")
    overlay = root / "overlay"
    fetched = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                              str(overlay), *OPTIMUM_OVERLAY], capture_output=True, text=True, timeout=600)  # fmt: skip
    if fetched.returncode != 0:
        pytest.skip(f"optimum-onnx could not be installed from the package index: {fetched.stderr[-300:]}")
    checkpoint = tiny_llama_checkpoint(root / "checkpoint")
    exporter = [sys.executable, "-m", "optimum.exporters.onnx", "--model", str(checkpoint),
                "--task", "text-generation-with-past", str(root / "tiny-optimum")]  # fmt: skip
    overlaid = os.environ | {"PYTHONPATH": str(overlay)}
    exported = subprocess.run(exporter, capture_output=True, text=True, timeout=600, env=overlaid)
    assert exported.returncode == 0, exported.stderr[-2000:]
    return root / "tiny-optimum"


@pytest.fixture(scope="module")
def transformers_js_folder(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """llama-tiny's export with past key/values as onnx/model.onnx, its q4 and q4f16 conversions beside it."""
    spec = load_specs()["llama-tiny"]
    prepared = next(prepare_model(PrepareJob(spec, [(1, 8)], with_past=True)))
    assert prepared.onnx_past_path is not None
    folder = tmp_path_factory.mktemp("tjs") / "tiny-llama-js"
    (folder / "onnx").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"} | spec.config))
    shutil.copyfile(prepared.onnx_past_path, folder / "onnx" / "model.onnx")
    for precision in ("q4", "q4f16"):
        shutil.copyfile(precision_variant(prepared.onnx_past_path, precision).path,
                        folder / "onnx" / f"model_{precision}.onnx")  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def genai_rows(genai_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """The builder's folder as one `run`: native ORT and onnxruntime-genai, then the page, at q4 (the folder's) and at
    fp32 and fp16 (which it has no file for). Read by the two tests below, each checking its engines' rows."""
    folder = tmp_path_factory.mktemp("genai-run")
    db = folder / "g.duckdb"
    done = run_cli(*RUN, "--engines", "onnxruntime,onnxruntime-genai", "--model-path", str(genai_folder),
                   "--precision", "q4,fp32,fp16", "--db", str(db), cwd=folder)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = rows_of(db)
    # q4 runs on every engine; a precision the folder has no file for is refused on each, never run from the q4 file
    engines = ("onnxruntime", "onnxruntime-genai", "onnxruntime-web")
    statuses = {(e, p): "ok" if p == "q4" else "unsupported" for e in engines for p in ("q4", "fp32", "fp16")}
    assert {key: row["status"] for key, row in rows.items()} == statuses, {k: r["error"] for k, r in rows.items()}
    return rows


def test_a_genai_folder_generates_natively_and_on_wasm(genai_rows: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The builder's int4 model (MatMulNBits, GroupQueryAttention, weights in model.onnx.data, a past whose
    head size is symbolic: genai_config.json says it) is q4: it generates on ORT and in the page, the page's
    tokens those of native ORT. fp32 is refused with the reason, not run from the int4 file under its name."""
    rows = genai_rows
    native, page = rows["onnxruntime", "q4"], rows["onnxruntime-web", "q4"]
    for row in (native, page):
        assert (row["status"], row["model"], row["mode"]) == ("ok", "tiny-genai", "generate"), row["error"]
        assert row["details"]["model_file"] == "model.onnx" and row["precision"] == "q4"
    assert page["tokens_matched"] == TOKENS
    assert native["details"]["input_shapes"]["past_key_values.0.key"] == [1, 2, 0, 16]  # heads, size: the config's
    assert "past_present_share_buffer" in native["details"]["kv_cache"]  # as onnxruntime-genai runs the graph
    assert native["output_texts"] == page["output_texts"]
    refused = rows["onnxruntime", "fp32"]
    assert refused["status"] == "unsupported"
    assert "model.onnx is a q4 graph and the folder has no fp32 file; --precision q4 runs it" in refused["error"]


def test_one_shared_kv_buffer_generates_the_tokens_of_a_growing_cache(genai_folder: Path, optimum_folder: Path) -> None:
    """GroupQueryAttention reading its past from, and writing its present into, one buffer of the generation's
    length (how the native ORT loop runs such a graph) makes the tokens the per-step presents make, from an empty
    cache and from a filled one; a graph without GroupQueryAttention never takes that path."""
    from harness.prepare.folders import past_shape
    from harness.prepare.greedy import cpu_session, greedy, shares_kv_buffer

    graph = genai_folder / "model.onnx"
    session, shape = cpu_session(graph), past_shape(graph)
    prompt = {"input_ids": np.array([[5, 9, 17, 3, 11]], dtype=np.int64)}
    prompt["attention_mask"] = np.ones_like(prompt["input_ids"])
    assert shares_kv_buffer(graph) and not shares_kv_buffer(optimum_folder / "model.onnx")
    for depth in (0, 6):
        grown = greedy(session, prompt, 8, shape=shape, depth=depth).tokens
        shared = greedy(session, prompt, 8, shape=shape, depth=depth, share=True).tokens
        assert grown.tolist() == shared.tolist(), depth


def test_a_transformers_js_folder_runs_the_file_of_each_precision(transformers_js_folder: Path, tmp_path: Path) -> None:
    """--precision picks onnx/model_<suffix>.onnx and the row names it; natively and in the page alike."""
    db = tmp_path / "t.duckdb"
    done = run_cli(
        *RUN, "--model-path", str(transformers_js_folder), "--precision", "q4,q4f16", "--db", str(db), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for precision, native, page in generated_natively_and_in_the_page(db, "tiny-llama-js", ("q4", "q4f16")):
        for row in (native, page):
            assert row["details"]["model_file"] == f"onnx/model_{precision}.onnx"
        assert page["tokens_matched"] == TOKENS  # the reference: native ORT on the file given


def test_an_optimum_export_generates_natively_and_on_wasm(optimum_folder: Path, tmp_path: Path) -> None:
    """The folder optimum's exporter writes (config.json, model.onnx taking past key/values): fp32 as exported
    and ORT's q4 conversion of it, each generating natively and in the page, the page's tokens native ORT's."""
    assert sorted(p.name for p in optimum_folder.glob("*.onnx")) == ["model.onnx"]
    db = tmp_path / "o.duckdb"
    done = run_cli(*RUN, "--model-path", str(optimum_folder), "--precision", "fp32,q4", "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    generated = generated_natively_and_in_the_page(db, "tiny-optimum", ("fp32", "q4"))
    for _, native, page in generated:
        assert native["ttft_ms"] > 0 and page["ttft_ms"] > 0
    # the reference is native ORT on the graph each ran: the folder's fp32 file, and for q4 ORT's q4 conversion
    (_, _, fp32_page), (_, _, q4_page) = generated
    assert fp32_page["tokens_matched"] == TOKENS and q4_page["tokens_matched"] == TOKENS
    assert q4_page["token_reference"] != fp32_page["token_reference"], q4_page["token_reference"]
    assert 0 <= q4_page["agreement_top1"] <= 1  # beside the folder's fp32 graph


def test_a_folder_without_the_file_its_config_names_is_refused_before_a_run(genai_folder: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copyfile(genai_folder / "genai_config.json", broken / "genai_config.json")
    done = run_cli_process(*RUN, "--model-path", str(broken), "--db", str(tmp_path / "b.duckdb"), cwd=tmp_path)
    assert done.returncode == 2
    assert "genai_config.json names decoder file 'model.onnx', which is not in" in done.stderr
    assert not (tmp_path / "b.duckdb").exists()


def test_a_past_the_config_cannot_size_is_refused_by_name(genai_folder: Path, tmp_path: Path) -> None:
    """Without genai_config.json the graph alone leaves the past's head size symbolic: a clear refusal."""
    from harness.core.records import UnsupportedError
    from harness.prepare.greedy import reference_generation

    bare = tmp_path / "model.onnx"
    shutil.copyfile(genai_folder / "model.onnx", bare)
    shutil.copyfile(genai_folder / "model.onnx.data", tmp_path / "model.onnx.data")
    assert spec_from_path(bare, None).is_onnx_file
    prompt = {"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 1]]}
    import numpy as np

    arrays = {name: np.asarray(value, dtype=np.int64) for name, value in prompt.items()}
    with pytest.raises(UnsupportedError, match=r"past input 'past_key_values\.0\.key' has symbolic heads or head size"):
        reference_generation(bare, arrays, 2)


def test_onnxruntime_genai_generates_the_folder_with_its_own_kv_handling(
    genai_rows: dict[tuple[str, str], dict[str, Any]], genai_folder: Path
) -> None:
    """--engines onnxruntime-genai: the same greedy tokens as native ORT's loop on the same int4 graph, the
    generate figures measured; a precision other than the folder's own is refused by name."""
    rows = genai_rows
    genai, ort = rows["onnxruntime-genai", "q4"], rows["onnxruntime", "q4"]
    assert genai["status"] == "ok" and genai["mode"] == "generate", genai["error"]
    assert (
        genai["generated_tokens"] == ort["generated_tokens"] and len(json.loads(genai["generated_tokens"])[0]) == TOKENS
    )
    assert genai["ttft_ms"] > 0 and genai["details"]["model_file"] == "model.onnx"
    # checked on the same graph: native ORT CPU teacher-forced on its tokens; no fp32 graph, so no quality
    assert genai["tokens_matched"] == TOKENS and genai["token_reference"].endswith(f"{genai_folder.name}/model.onnx")
    assert genai["agreement_top1"] is None and genai["details"]["quality"] == "not measured: no fp32 reference at hand"
    refused = rows["onnxruntime-genai", "fp16"]
    assert refused["status"] == "unsupported" and "a q4 graph; --precision q4 runs it" in refused["error"]


@pytest.mark.slow  # ~25 s: the checkpoint's fp32 export; the cheap checks are tests/test_perplexity.py's
def test_reference_model_gives_a_genai_folder_its_fp32_reference(genai_folder: Path, tmp_path: Path) -> None:
    """Issue 45: the int4 folder holds no fp32 graph; --reference-model names the Hugging Face weights it was built
    from, whose fp32 export every generate row is then held against (agreement, KL, first divergence, perplexity
    ratio)."""
    checkpoint, db = genai_folder.parent / "checkpoint", tmp_path / "r.duckdb"
    done = run_cli("native", "--engines", "onnxruntime", "--hardware", "cpu", "--mode", "generate", "--new-tokens",
                   "4", "--sequence-lengths", "8", "--iterations", "2", "--warmup", "0", "--min-duration", "0",
                   "--no-reports", "--no-ceilings", "--model-path", str(genai_folder), "--precision", "q4", "--db",
                   str(db), "--reference-model", str(checkpoint), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    details = rows_of(db)["onnxruntime", "q4"]["details"]
    assert 0 <= details["agreement_top1"] <= 1 and "first_divergence" in details and details["kl_passage"] >= 0
    assert details["quality_reference"].endswith("(fp32, exported from --reference-model)")
    assert details["perplexity_ratio"] > 0 and "exported from --reference-model" in details["perplexity_reference"]


def corrupted_genai(genai_folder: Path, tmp_path: Path, change: Any) -> Path:
    """A copy of the builder's folder whose genai_config.json `change(config, copy)` rewrote."""
    copy = tmp_path / "theirs"
    shutil.copytree(genai_folder, copy)
    config = json.loads((copy / "genai_config.json").read_text())
    change(config, copy)
    (copy / "genai_config.json").write_text(json.dumps(config))
    return copy


def _decoder(**values: Any) -> Any:
    return lambda config, _: config["model"]["decoder"].update(values)


def _graph_elsewhere(config: dict[str, Any], copy: Path) -> None:
    """model.onnx a symlink to a graph outside the folder (the config left as the builder wrote it)."""
    elsewhere = copy.parent / "elsewhere"
    elsewhere.mkdir()
    (copy / "model.onnx").rename(elsewhere / "model.onnx")
    (copy / "model.onnx").symlink_to(elsewhere / "model.onnx")


HOSTILE_GENAI = {
    "filename ../../": (_decoder(filename="../../elsewhere/model.onnx"), "key 'model.decoder.filename' names "
                        "'../../elsewhere/model.onnx', which resolves to"),
    "filename absolute": (_decoder(filename="/etc/hostname"), "names '/etc/hostname', which resolves to"),
    "symlink leading out": (_graph_elsewhere, "names 'model.onnx', which resolves to"),
    "filename 5": (_decoder(filename=5), "key 'model.decoder.filename' must be a file name (a non-empty string), "
                   "got number 5"),
    "model 'x'": (lambda config, _: config.update(model="x"), "key 'model' must be a JSON object, got string \"x\""),
    "10^9 layers": (_decoder(num_hidden_layers=10**9), "genai_config.json key 'model.decoder.num_hidden_layers' "
                    "takes a whole number from 0 to 1,024 (got 1000000000)"),
    "heads 'two'": (_decoder(num_key_value_heads="two"), "key 'model.decoder.num_key_value_heads' must be an "
                    "integer, got string \"two\""),
    "escape in a name": (_decoder(filename="\x1b[2J/../../elsewhere/model.onnx"),
                         "names '/../../elsewhere/model.onnx', which resolves to"),
}  # fmt: skip


SUBPROCESS_CASE = "escape in a name"  # the one case run as a real process: its stderr shows no escape, no traceback


@pytest.mark.parametrize("hostile", list(HOSTILE_GENAI))
def test_a_genai_folder_reaching_outside_itself_is_refused_by_key(
    hostile: str, genai_folder: Path, tmp_path: Path
) -> None:
    """Issue 30 item 11: the builder's folder, its genai_config.json rewritten, is refused before a run exists:
    exit 2 naming the key and the path (escape sequences stripped), no traceback, no store written. One case runs the
    CLI as a process (SUBPROCESS_CASE), the others the same app in this one (conftest.run_cli)."""
    change, expected = HOSTILE_GENAI[hostile]
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    shutil.copyfile(genai_folder / "model.onnx", tmp_path / "elsewhere" / "model.onnx")  # there to be run
    (tmp_path / "c").mkdir()
    folder = corrupted_genai(genai_folder, tmp_path / "c", change)  # ../../elsewhere is tmp_path's
    db = tmp_path / "h.duckdb"
    cli = run_cli_process if hostile == SUBPROCESS_CASE else run_cli
    done = cli("native", "--hardware", "cpu", "--engines", "onnxruntime", "--model-path", str(folder),
                   "--iterations", "1", "--warmup", "0", "--db", str(db), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    message = " ".join(done.stderr.split())
    assert expected in message and "Traceback" not in message and "\x1b" not in done.stderr
    assert not db.exists()


def test_a_genai_folder_runs_its_own_precision_when_none_is_asked(genai_folder: Path, tmp_path: Path) -> None:
    """Issue 30: a request that names no precision (the API's default) runs the folder's own, q4 as read from its
    MatMulNBits graph, and the row says q4; an asked fp32 stays `unsupported` with the reason
    (test_a_genai_folder_generates_natively_and_on_wasm). At batch 2, every row's output text is stored, each
    its own tokens through the folder's tokenizer (issue 32)."""
    from harness.run.native import run_native
    from harness.run.plan import BenchmarkRequest

    db = tmp_path / "own.duckdb"
    request = BenchmarkRequest(model_path=genai_folder, hardware=["cpu"], engines=["onnxruntime"], modes=["generate"],
                               new_tokens=2, sequence_lengths=[8], batch_sizes=[2], iterations=2, min_iterations=1,
                               warmup=0, min_duration_s=0, db_path=db, output_dir=None)  # fmt: skip
    run_native(request)
    rows = rows_of(db)
    assert list(rows) == [("onnxruntime", "q4")]
    row = rows["onnxruntime", "q4"]
    assert (row["status"], row["precision"], row["details"]["model_file"]) == ("ok", "q4", "model.onnx"), row["error"]
    texts = [" ".join(f"t{token}" for token in tokens) for tokens in json.loads(row["generated_tokens"])]
    assert len(texts) == 2 and json.loads(row["output_texts"]) == texts and row["output_text"] == texts[0]


def test_one_model_draws_one_prompt_in_every_layout_and_its_text_comes_back(genai_folder: Path, tmp_path: Path) -> None:
    """Issue 32 items 4 and 5. The drawn prompt of the HF folder and of the genai builder's folder made from it
    are the same ids (the seed is the vocabulary's, the ids its regular tokens: t0 unk and t2 eos never drawn).
    With --prompt, native ORT, onnxruntime-genai and the page store the prompt's ids, the output text decoded
    by the folder's tokenizer and the EOS policy that ran."""
    from transformers import AutoConfig

    from harness.prepare.inputs import make_inputs

    checkpoint = genai_folder.parent / "checkpoint"
    hf = make_inputs(spec_from_path(checkpoint, None), AutoConfig.from_pretrained(checkpoint), 1, 8)["input_ids"]
    built = next(prepare_model(PrepareJob(spec_from_path(genai_folder, None), [(1, 8)])))
    assert built.load_case((1, 8))[0]["input_ids"].tolist() == hf.tolist()
    assert not {0, 2} & set(hf.ravel().tolist())

    db = tmp_path / "p.duckdb"
    done = run_cli(*RUN, "--engines", "onnxruntime,onnxruntime-genai", "--model-path", str(genai_folder),
                   "--prompt", "t5 t6 t7", "--stop-at-eos", "--db", str(db), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = rows_of(db)
    assert set(rows) == {("onnxruntime", "q4"), ("onnxruntime-genai", "q4"), ("onnxruntime-web", "q4")}
    for row in rows.values():
        assert row["status"] == "ok", row["error"]
        assert json.loads(row["prompt_ids"]) == [[5, 6, 7]] and row["seq_len"] == 3
        generated = json.loads(row["generated_tokens"])[0]
        assert row["output_text"] == " ".join(f"t{token}" for token in generated)
        assert row["stop_at_eos"] is True and row["details"]["eos_policy"] == "stop at EOS (2)"
        assert generated == json.loads(rows["onnxruntime", "q4"]["generated_tokens"])[0]
