"""Page runtimes as targets (issue 43), the parts that need no page: the one table's names agree with core's, the
store holds another runtime's rows against the ceilings its EP's own loop measured, an answer of another runtime
is checked for what it must say of itself, the ranking reads rows of every engine, and what a runtime cannot run
is an `unsupported` row with its own reason before any browser starts."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from conftest import run_cli

from harness.analysis.runtimes import runtime_table
from harness.browser.run import StopRule
from harness.core.labels import PAGE_ENGINES, PAGE_HARDWARE, in_page
from harness.core.records import Case, Ceiling, Result, Target
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


def _generate(engine: str, tokens_per_s: float, provider: str = "wasm:threads=1", **details: object) -> Result:
    hardware = "cpu" if engine in ("onnxruntime", "llama.cpp") and provider.startswith("CPU") else "wasm"
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
                            (_generate("onnxruntime", 300.0, "CPUExecutionProvider:threads=1"), {}),
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
    """WebLLM without its compiled library and weights, transformers.js asked for inference: each an `unsupported`
    row naming why; our own loop's row beside them runs as before."""
    db = tmp_path / "u.duckdb"
    result = run_cli("web", "--model", "llama-tiny", "--mode", "inference", "--hardware", "wasm", "--runtimes",
                     "webllm,transformers.js", "--sequence-lengths", "8", "--no-ceilings", "--db", str(db),
                     "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = dict(duckdb.connect(str(db), read_only=True).execute(
        "SELECT engine, status || ': ' || error FROM results").fetchall())  # fmt: skip
    assert rows["webllm"].startswith("unsupported: WebLLM runs a TVM-compiled model library")
    assert rows["transformers.js"] == "unsupported: transformers.js runs generate here, not inference"


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
