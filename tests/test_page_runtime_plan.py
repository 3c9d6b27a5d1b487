"""Page runtimes as targets (issue 43), the parts that need no page: the one table's names agree with core's, the
store holds another runtime's rows against the ceilings its EP's own loop measured, an answer of another runtime
is checked for what it must say of itself, the ranking reads rows of every engine, and what a runtime cannot run
is an `unsupported` row with its own reason before any browser starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import run_cli

from harness.analysis.roofline_data import Where
from harness.analysis.runtimes import runtime_table
from harness.browser.run import StopRule
from harness.core.labels import CPU_CEILING_BORROWERS, PAGE_ENGINES, PAGE_HARDWARE, in_page
from harness.core.records import Case, Ceiling, Result, Target
from harness.native import ENGINES, capabilities
from harness.store import open_store
from harness.web.answers import PageResultError, validate_page_result
from harness.web.eps import WEB_HARDWARE
from harness.web.page_job import GenerateJob, PageInput, PageJob
from harness.web.runtimes import OWN_RUNTIME, PAGE_RUNTIMES, RUNTIMES


def test_core_names_the_page_runtimes_and_eps_the_tables_hold() -> None:
    assert PAGE_ENGINES == PAGE_RUNTIMES and PAGE_HARDWARE == WEB_HARDWARE
    assert PAGE_RUNTIMES[0] == OWN_RUNTIME and RUNTIMES[OWN_RUNTIME].module is None
    assert in_page({"engine": "llama.cpp", "hardware": "wasm"})
    assert not in_page({"engine": "llama.cpp", "hardware": "cpu"})  # native llama.cpp
    assert not in_page({"engine": "onnxruntime", "hardware": "webgpu"})  # native ORT's WebGPU EP


def _generate(engine: str, tokens_per_s: float, provider: str = "wasm:threads=1", hardware: str = "wasm",
              **details: object) -> Result:  # fmt: skip
    step = 1000.0 / tokens_per_s
    return Result("llama-tiny", "text_generation", "random", Target(hardware, engine, provider),
                  Case(1, 8, "fp32", "generate", new_tokens=4), "ok", samples_ms=[10.0] * 3,
                  ttft_samples_ms=[2.0] * 3, step_samples_ms=[[step] * 3] * 3, tpot_samples_ms=[step] * 3,
                  generated_tokens=[[1, 2, 3, 4]], bytes_per_token=1e6, details=dict(details))  # fmt: skip


def test_another_runtimes_rows_are_held_against_their_eps_ceiling(tmp_path: Path) -> None:
    """A transformers.js row on wasm at 1 thread takes the bandwidth ceiling onnxruntime-web's loop measured on
    wasm at 1 thread (the EP's limit), whichever arrives first; a row at 2 threads does not."""
    db = tmp_path / "r.duckdb"
    with open_store(db) as store:
        run_id = store.start_run("web", {}, {})
        store.add_result(run_id, _generate("transformers.js", 100.0), None)  # before the ceiling
        own = Target("wasm", OWN_RUNTIME, "wasm:threads=1")
        store.add_ceiling(run_id, Ceiling(own, "bandwidth", "bytes", "add", 1e9, samples_ms=[100.0] * 5))
        store.add_result(run_id, _generate("llama.cpp", 50.0), None)  # after it
        store.add_result(run_id, _generate("transformers.js", 100.0, "wasm:threads=2"), None)
    rows = (
        duckdb.connect(str(db), read_only=True)
        .execute("SELECT engine, provider, bandwidth_fraction FROM results ORDER BY engine, provider")
        .fetchall()
    )
    assert rows == [("llama.cpp", "wasm:threads=1", pytest.approx(0.005)),
                    ("transformers.js", "wasm:threads=1", pytest.approx(0.01)),
                    ("transformers.js", "wasm:threads=2", None)]  # fmt: skip


def test_a_native_gguf_runtime_is_held_against_ort_cpu_ceiling_at_its_threads(tmp_path: Path) -> None:
    """Native llama.cpp (node-llama-cpp, llama-cpp-python) runs no ONNX calibration graph: at a stated thread count its
    rows take the bandwidth ceiling ONNX Runtime's CPU EP measured at that count in the run, whichever arrives first;
    at another count, or at its default count (no `:threads=`), none; ORT's own rows keep theirs."""
    db = tmp_path / "n.duckdb"
    with open_store(db) as store:
        run_id = store.start_run("native", {}, {})
        store.add_result(run_id, _generate("llama.cpp", 100.0, "cpu:threads=1", hardware="cpu"), None)  # before it
        ort = Target("cpu", "onnxruntime", "CPUExecutionProvider:threads=1")
        store.add_ceiling(run_id, Ceiling(ort, "bandwidth", "bytes", "add", 1e9, samples_ms=[100.0] * 5))
        for engine, provider in (("llama-cpp-python", "cpu:threads=1"), ("llama-cpp-python", "cpu:threads=2"),
                                 ("llama.cpp", "cpu"), ("onnxruntime", "CPUExecutionProvider:threads=1")):  # fmt: skip
            store.add_result(run_id, _generate(engine, 50.0, provider, hardware="cpu"), None)
    rows = (
        duckdb.connect(str(db), read_only=True)
        .execute("SELECT engine, provider, bandwidth_fraction FROM results ORDER BY engine, provider")
        .fetchall()
    )
    assert rows == [("llama-cpp-python", "cpu:threads=1", pytest.approx(0.005)),
                    ("llama-cpp-python", "cpu:threads=2", None),
                    ("llama.cpp", "cpu", None), ("llama.cpp", "cpu:threads=1", pytest.approx(0.01)),
                    ("onnxruntime", "CPUExecutionProvider:threads=1", pytest.approx(0.005))]  # fmt: skip
    where = Where("m", "cpu", "llama.cpp", "cpu:threads=2", "", "fp32")  # predict's books hold it the same way
    assert where.ceiling_key("bandwidth")[2:4] == ("onnxruntime", "CPUExecutionProvider:threads=2")
    assert tuple(e for e in ENGINES if capabilities(e).runs_gguf) == CPU_CEILING_BORROWERS  # every GGUF runtime


def _job(runtime: str) -> PageJob:
    stop = StopRule(warmup=1, iterations=2, min_duration_ms=0, max_iterations=5, min_iterations=1, max_time_ms=None)
    return PageJob("http://x/m.gguf", [PageInput("input_ids", "http://x/0.bin", "int64", [1, 3])], "wasm", 1, stop,
                   "case", generate=GenerateJob(new_tokens=3, vocab_size=10), runtime=runtime)  # fmt: skip


def _answer(runtime: dict | None) -> dict:
    generation = {"ttft_samples_ms": [1.0, 1.0], "step_samples_ms": [[1.0, 1.0], [1.0, 1.0]],
                  "tokens": [[1, 2, 3]], "tokens_stable": True, "prefill_logits": None, "step_top": None,
                  "memory_before": None, "memory_after": None}  # fmt: skip
    facts = {} if runtime is None else {"runtime": runtime}
    return {"status": "ok", "samples_ms": [5.0, 5.0], "first_run_ms": 5.0, "load_ms": 1.0, "generation": generation,
            "facts": facts}  # fmt: skip


def test_another_runtimes_answer_says_what_ran() -> None:
    """No logits is allowed of another runtime (its tokens are checked alone); not saying which runtime ran, or
    naming another, or a thread count out of bounds, is refused; our own loop must still return its logits."""
    ok = {"name": "llama.cpp", "version": "3.8.1", "threads_effective": 1}
    assert validate_page_result(_answer(ok), _job("llama.cpp"), 60)["generation"]["tokens"] == [[1, 2, 3]]
    for runtime, words in [(None, "runtime"), (ok | {"name": "transformers.js"}, "this job ran llama.cpp"),
                           (ok | {"threads_effective": 0}, "threads_effective")]:  # fmt: skip
        with pytest.raises(PageResultError, match=words):
            validate_page_result(_answer(runtime), _job("llama.cpp"), 60)
    with pytest.raises(PageResultError, match="prefill_logits"):
        validate_page_result(_answer(ok), _job(OWN_RUNTIME), 60)


def test_the_ranking_puts_every_engine_of_a_case_side_by_side() -> None:
    rows = []
    quantized = {"agreement_top1": 0.75, "token_parity": "not checked: Q4"}
    for result, details in [(_generate("transformers.js", 100.0), {"tokens_matched": 4, "tokens_compared": 4}),
                            (_generate("onnxruntime", 300.0, "CPUExecutionProvider:threads=1", hardware="cpu"), {}),
                            (_generate("llama.cpp", 200.0), quantized)]:  # fmt: skip
        rows.append({"model": result.model, "mode": "generate", "status": "ok", "batch_size": 1, "seq_len": 8,
                     "new_tokens": 4, "depth": None, "precision": "fp32", "hardware": result.target.hardware,
                     "engine": result.target.engine, "provider": result.target.provider, "device": None,
                     "decode_tokens_per_s": 1000.0 / result.step_samples_ms[0][0], "ttft_ms": 2.0,
                     "details": details})  # fmt: skip
    table = runtime_table(rows)
    assert table is not None
    assert [r["Target"].split(":")[0] for r in table.rows] == [
        "cpu/onnxruntime",
        "wasm/llama.cpp",
        "wasm/transformers.js",
    ]
    assert [round(r["÷ best native tg"], 3) for r in table.rows] == [1.0, 0.667, 0.333]
    assert table.rows[1]["tokens"] == "agreement 0.75 vs fp32" and table.rows[2]["tokens"].startswith("= native ORT")


def test_what_a_runtime_cannot_run_is_unsupported_before_a_browser_starts(tmp_path: Path) -> None:
    """WebLLM without its compiled library and weights, transformers.js asked for a causal LM's inference: each an
    `unsupported` row naming why; our own loop's row beside them runs as before."""
    db = tmp_path / "u.duckdb"
    result = run_cli("web", "--model", "llama-tiny", "--mode", "inference", "--hardware", "wasm", "--runtimes",
                     "webllm,transformers.js", "--sequence-lengths", "8", "--no-ceilings", "--db", str(db),
                     "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = dict(duckdb.connect(str(db), read_only=True).execute(
        "SELECT engine, status || ': ' || error FROM results").fetchall())  # fmt: skip
    assert rows["webllm"].startswith("unsupported: WebLLM runs a TVM-compiled model library")
    assert rows["transformers.js"].startswith("unsupported: transformers.js runs inference here as pipeline(")
    assert rows["transformers.js"].endswith("llama-tiny is a LlamaForCausalLM: its text-generation pipeline runs with "
                                            "--mode generate")  # fmt: skip


def test_an_unknown_runtime_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    result = run_cli("run", "--model", "llama-tiny", "--web-runtimes", "mlc", "--db", str(tmp_path / "x.duckdb"))
    assert result.returncode == 2 and not (tmp_path / "x.duckdb").exists()
    assert "transformers.js" in result.stdout + result.stderr


def test_transformers_js_copy_feeds_its_empty_cache_at_the_prompts_batch(tmp_path: Path) -> None:
    """transformers.js makes the first step's empty cache from the graph's input metadata, resolving only Optimum's
    `batch_size` (any other symbol is 0). A graph that reads its batch off a cache input and reshapes with
    allowzero=1 (the dynamo export of real SmolLM2) fails at batch 0; the copy it is served names the batch
    `batch_size` beside Optimum's cache names, and runs on what transformers.js feeds."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from harness.browser.runtimes import transformers_js_graph

    def value(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, shape)

    nodes = [
        helper.make_node("Shape", ["past_key_0"], ["b"], start=0, end=1),  # the batch, read off the cache
        helper.make_node("Shape", ["hidden"], ["s"], start=1, end=2),
        helper.make_node("Concat", ["b", "s", "heads", "size"], ["shape"], axis=0),
        helper.make_node("Reshape", ["hidden", "shape"], ["split"], allowzero=1),
        helper.make_node("Transpose", ["split"], ["key"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["past_key_0", "key"], ["present_key_0"], axis=2),
    ]
    consts = [
        helper.make_tensor("heads", TensorProto.INT64, [1], [2]),
        helper.make_tensor("size", TensorProto.INT64, [1], [4]),
    ]
    inputs = [value("hidden", TensorProto.FLOAT, ["batch", "sequence", 8]),
              value("past_key_0", TensorProto.FLOAT, ["batch", 2, "past", 4])]  # fmt: skip
    outputs = [value("present_key_0", TensorProto.FLOAT, ["batch", 2, "total", 4])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, consts)
    model = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(model))

    copy = transformers_js_graph(model)
    assert copy.name == "model-tjs2.onnx" and transformers_js_graph(model) == copy  # made once, by a new name
    session = ort.InferenceSession(str(copy), providers=["CPUExecutionProvider"])
    cache = session.get_inputs()[1]
    assert cache.name == "past_key_values.0.key" and cache.shape == ["batch_size", 2, "past", 4]
    # transformers.js 4.x's resolveCacheShape: batch_size is the prompt's batch, any other symbol 0
    empty = np.zeros([{"batch_size": 1}.get(d, 0) if isinstance(d, str) else d for d in cache.shape], np.float32)
    hidden = np.ones((1, 3, 8), np.float32)
    (present,) = session.run(None, {"hidden": hidden, "past_key_values.0.key": empty})
    assert present.shape == (1, 2, 3, 4)
    with pytest.raises(Exception, match="Reshape"):  # the export's own name, `batch`, resolved to 0 as before
        session.run(None, {"hidden": hidden, "past_key_values.0.key": np.zeros((0, 2, 0, 4), np.float32)})


def test_one_tarball_extraction_names_the_file_a_package_lacks(tmp_path: Path) -> None:
    """web/ort_dist.extract, the one reader of an npm tarball both the page's ORT and the runtimes' files are staged
    with: the paths asked for, written; the first one missing named (planted: a path the tarball lacks)."""
    import io
    import tarfile

    from harness.web.ort_dist import extract

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = b"export {};"
        info = tarfile.TarInfo("package/dist/a.mjs")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    assert extract(buffer.getvalue(), {"dist/a.mjs": tmp_path / "x" / "a.mjs"}) is None
    assert (tmp_path / "x" / "a.mjs").read_bytes() == b"export {};"
    assert (
        extract(buffer.getvalue(), {"dist/a.mjs": tmp_path / "a.mjs", "dist/b.wasm": tmp_path / "b"}) == "dist/b.wasm"
    )


def mlc_folder(root: Path) -> Path:
    """A WebLLM folder of the right shape (harness.prepare.mlc_folder): its configs, one params shard of the bytes
    its record states, a tokenizer file, and a model library that is no wasm (none can be compiled here)."""
    import json

    folder = root / "mlc"
    folder.mkdir()
    config = {"model_type": "llama", "quantization": "q4f32_1", "vocab_size": 1000, "context_window_size": 256,
              "tokenizer_files": ["tokenizer.json"]}  # fmt: skip
    (folder / "mlc-chat-config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "params_shard_0.bin").write_bytes(b"\0" * 64)
    records = [{"dataPath": "params_shard_0.bin", "format": "raw-shard", "nbytes": 64, "records": []}]
    (folder / "tensor-cache.json").write_text(json.dumps({"metadata": {}, "records": records}))
    (folder / "tiny-webgpu.wasm").write_bytes(b"not wasm")
    return folder


def test_a_webllm_folder_is_read_as_data_and_served_as_webllm_fetches_it(tmp_path: Path) -> None:
    from harness.prepare.mlc_folder import read_mlc_folder

    mlc = read_mlc_folder(mlc_folder(tmp_path))
    assert mlc.library == "tiny-webgpu.wasm" and mlc.facts["mlc_shards"] == 1 and mlc.facts["mlc_weight_bytes"] == 64
    assert set(mlc.files) == {
        "mlc/mlc-chat-config.json",
        "mlc/tensor-cache.json",
        "mlc/tokenizer.json",
        "mlc/params_shard_0.bin",
        "tiny-webgpu.wasm",
    }


def _hostile(folder: Path, how: str) -> None:
    import json
    import os

    cache = folder / "tensor-cache.json"
    records = json.loads(cache.read_text())
    if how == "no chat config":
        (folder / "mlc-chat-config.json").unlink()
    elif how == "a FIFO as its chat config":
        (folder / "mlc-chat-config.json").unlink()
        os.mkfifo(folder / "mlc-chat-config.json")
    elif how == "a shard outside":
        records["records"][0]["dataPath"] = "../outside.bin"
        (folder.parent / "outside.bin").write_bytes(b"\0" * 64)
    elif how == "a shard linked outside":
        (folder.parent / "elsewhere.bin").write_bytes(b"\0" * 64)
        (folder / "params_shard_0.bin").unlink()
        (folder / "params_shard_0.bin").symlink_to(folder.parent / "elsewhere.bin")
    elif how == "a shard whose record lies":
        records["records"][0]["nbytes"] = 10**6
    elif how == "too many shards":
        records["records"] = records["records"] * 70_000
    elif how == "two libraries":
        (folder / "other-webgpu.wasm").write_bytes(b"x")
    elif how == "no library":
        (folder / "tiny-webgpu.wasm").unlink()
    elif how == "a tokenizer file outside":
        config = json.loads((folder / "mlc-chat-config.json").read_text())
        (folder / "mlc-chat-config.json").write_text(json.dumps(config | {"tokenizer_files": ["/etc/passwd"]}))
    elif how == "a vocabulary too large":
        config = json.loads((folder / "mlc-chat-config.json").read_text())
        (folder / "mlc-chat-config.json").write_text(json.dumps(config | {"vocab_size": 10**12}))
    cache.write_text(json.dumps(records))


@pytest.mark.parametrize(("how", "says"), [
    ("no chat config", "no mlc-chat-config.json"),
    ("a FIFO as its chat config", "is a FIFO, not a regular file"),
    ("a shard outside", "outside the model folder"),
    ("a shard linked outside", "outside the model folder"),
    ("a shard whose record lies", "states 1,000,000 bytes; params_shard_0.bin holds 64"),
    ("too many shards", "must be a list of 1 to 65,536 shards"),
    ("two libraries", "2 .wasm files at its top"),
    ("no library", "0 .wasm files at its top (none)"),
    ("a tokenizer file outside", "outside the model folder"),
    ("a vocabulary too large", "vocab_size must be a whole number from 1 to"),
])  # fmt: skip
def test_a_hostile_webllm_folder_is_refused_saying_what_to_supply(tmp_path: Path, how: str, says: str) -> None:
    from harness.prepare.folder_checks import FolderError
    from harness.prepare.mlc_folder import read_mlc_folder

    folder = mlc_folder(tmp_path)
    _hostile(folder, how)
    with pytest.raises(FolderError) as refused:
        read_mlc_folder(folder)
    assert says in " ".join(str(refused.value).split())


def test_webllm_model_is_checked_before_a_run_exists(tmp_path: Path) -> None:
    """--webllm-model with a folder that lacks its library, or without the webllm runtime: exit 2, nothing written."""
    folder = mlc_folder(tmp_path)
    (folder / "tiny-webgpu.wasm").unlink()
    db = tmp_path / "w.duckdb"
    done = run_cli("web", "--mode", "generate", "--model", "llama-tiny", "--hardware", "webgpu", "--runtimes",
                   "webllm", "--webllm-model", str(folder), "--db", str(db))  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "0 .wasm files" in said and "TVM-compiled model library" in said
    assert "Traceback" not in done.stderr and not db.exists()
    done = run_cli("run", "--mode", "generate", "--model", "llama-tiny", "--web-hardware", "webgpu",
                   "--webllm-model", str(folder), "--db", str(db))  # fmt: skip
    assert done.returncode == 2 and "add webllm to the runtimes" in " ".join(done.stderr.split()) and not db.exists()


def test_a_webllm_case_is_refused_without_its_folder_and_served_it_with_one(tmp_path: Path) -> None:
    """runtime_refusal: no folder, the row names what to supply; with one, a webgpu generate case runs (wasm is
    refused by the table); runtime_files serves exactly the checked folder, the library as the job's model."""
    from types import SimpleNamespace

    from harness.browser.runtimes import runtime_files, runtime_refusal
    from harness.prepare.mlc_folder import read_mlc_folder

    folder = mlc_folder(tmp_path)
    prepared: Any = SimpleNamespace(spec=SimpleNamespace(is_gguf_file=False, is_encoder_decoder=False))
    case = Case(1, 8, "fp32", "generate", 4)
    assert "--webllm-model DIR" in (runtime_refusal(prepared, "webllm", "webgpu", case) or "")
    assert runtime_refusal(prepared, "webllm", "webgpu", case, folder) is None
    assert "webgpu" in (runtime_refusal(prepared, "webllm", "wasm", case, folder) or "")
    served, main = runtime_files(prepared, "webllm", case, tmp_path / "unused.onnx", folder)
    assert main == "tiny-webgpu.wasm" and served == read_mlc_folder(folder).files
