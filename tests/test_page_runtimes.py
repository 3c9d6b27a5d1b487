"""Page runtimes other than the harness's own onnxruntime-web loop (web/page/runtimes.json), in real Chromium through
the harness's own server and driver: llama.cpp in the page (wllama) on a tiny GGUF written here, and transformers.js
on llama-tiny's export with past laid out as a transformers.js folder, checked against native ONNX Runtime's greedy
tokens on the same file. Each answer has the page's generate shape, its runtime's threads read back, and the page
fetched nothing outside the served file set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.browser.runtime_tokenizer import synthetic, tokenizer_files
from harness.web import driver, runtime_dist
from harness.web.flags import gpu_profile, launch_flags
from harness.web.page_job import GenerateJob, PageInput, PageJob, StopRule

pytestmark = [
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium"),
    pytest.mark.skipif(
        any(runtime_dist.problem(name) for name in ("llama.cpp", "transformers.js")), reason="run `make setup`"
    ),
]
NEW_TOKENS = 6
TOP_K = 5
STOP = StopRule(warmup=0, iterations=2, min_duration_ms=0.0, max_iterations=2, min_iterations=1, max_time_ms=None)

# The tiny GGUF's SentencePiece vocabulary: specials, the 256 byte tokens, '▁', the letters and '▁'+letter. A prompt
# of '▁'+letter tokens is spelled "a b c" and tokenized back into the same ids by llama.cpp.
LETTERS = "abcdefghijklmnopqrstuvwxyz"
GGUF_TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581", *LETTERS]
GGUF_TOKENS += [f"\u2581{c}" for c in LETTERS]
GGUF_PROMPT = [GGUF_TOKENS.index(f"\u2581{c}") for c in "hello"]


def write_tiny_gguf(path: Path) -> Path:
    """A 2-layer llama GGUF (f32, random weights, hidden 64) with the vocabulary above."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    hidden, ff, heads, kv_heads, layers, vocab = 64, 128, 4, 2, 2, len(GGUF_TOKENS)
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("accelharness-tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(GGUF_TOKENS)
    writer.add_token_scores([0.0] * 3 + [0.0] * 256 + [-1.0] * 27 + [1.0] * 26)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 53
    writer.add_token_types([int(t) for t in types])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, hidden))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(hidden, hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(hidden, hidden))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(ff, hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(ff, hidden))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(hidden, ff))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    head = weight(vocab, hidden)
    head[: -len(LETTERS) * 2 - 1] = 0.0  # only letters are likely: a byte token's text would be incomplete UTF-8
    writer.add_tensor("output.weight", head)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_js_names(graph: Any) -> None:
    """The harness's -past names as transformers.js (Optimum's layout) reads them: past_key_values.N.key/value in,
    present.N.key/value out."""
    renames = {}
    for each in [*graph.input, *graph.output]:
        for kind in ("key", "value"):
            for old, new in (
                (f"past_{kind}_", "past_key_values.{}." + kind),
                (f"present_{kind}_", "present.{}." + kind),
            ):
                if each.name.startswith(old) and each.name[len(old) :].isdigit():
                    renames[each.name] = new.format(each.name[len(old) :])
    for each in [*graph.input, *graph.output]:
        each.name = renames.get(each.name, each.name)
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]


@pytest.fixture(scope="module")
def llama_tiny(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """llama-tiny's export with past as a transformers.js folder (config.json, onnx/model.onnx), and native ORT's
    greedy tokens on that graph for an 8-token prompt."""
    import onnx
    import transformers

    from harness.prepare.greedy import reference_generation
    from harness.prepare.prepared import PrepareJob, prepare_model
    from harness.prepare.specs import load_specs

    spec = load_specs()["llama-tiny"]
    prepared = next(prepare_model(PrepareJob(spec, [(1, 8)], with_past=True, plain=False)))
    assert prepared.onnx_past_path is not None, prepared.onnx_past_error
    folder = tmp_path_factory.mktemp("transformers-js")
    transformers.AutoConfig.for_model("llama", **spec.config).save_pretrained(folder)
    model = onnx.load(prepared.onnx_past_path)
    transformers_js_names(model.graph)
    (folder / "onnx").mkdir()
    onnx.save(model, folder / "onnx" / "model.onnx")
    tokenizer, _ = tokenizer_files([], dict(spec.config))  # the synthetic vocabulary's, as the harness serves it
    for name, data in tokenizer.items():
        (folder / name).write_bytes(data)
    ids = np.random.default_rng(1).integers(3, spec.config["vocab_size"], size=(1, 8)).astype(np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    native = reference_generation(prepared.onnx_past_path, inputs, NEW_TOKENS)
    return {"folder": folder, "ids": ids, "native": np.asarray(native.tokens).tolist()}


def page_answer(runtime: str, files: dict[str, Path | bytes], main: str, ids: np.ndarray, vocab: int,
                dtype: str | None = None, ep: str = "wasm", folder: bool = False) -> dict[str, Any]:  # fmt: skip
    """The validated answer of one generate job on `runtime` (1 thread) and every URL the browser asked for; with a
    dtype, the job's files are a transformers.js folder (runtime_model_base)."""
    from playwright.async_api import async_playwright

    from harness.web.server import PageServer

    async def answer() -> dict[str, Any]:
        server = PageServer()
        await server.start()
        try:
            prompt = {"ids.bin": ids.tobytes(), "mask.bin": np.ones_like(ids).tobytes()}
            urls = server.set_job_files({**files, **prompt})
            inputs = [PageInput(name, urls[f"{file}.bin"], "int64", list(ids.shape))
                      for name, file in (("input_ids", "ids"), ("attention_mask", "mask"))]  # fmt: skip
            base = {"runtime_model_base": f"{server.base_url}job/"} if dtype or folder else {}
            base |= {"runtime_dtype": dtype} if dtype else {}
            generate = GenerateJob(new_tokens=NEW_TOKENS, vocab_size=vocab, top_k=TOP_K)
            job = PageJob(urls[main], inputs, ep, 1, STOP, "b1_s8", generate=generate, runtime=runtime, **base)
            async with async_playwright() as playwright:
                source = driver.LocalBrowser(driver.resolve_browser("chromium"), launch_flags([ep], gpu_profile("off")))
                session = driver.BrowserSession(playwright, source, server)
                requested: list[str] = []
                try:
                    assert await session.ensure_started() is None
                    session.context.on("request", lambda request: requested.append(request.url))
                    result = await session.run_job(server.page_url, runtime, job, 120)
                finally:
                    await session.close()
            return {"answer": result, "requested": requested, "base": server.base_url}
        finally:
            await server.stop()

    return driver.run_sync(answer())


def check_answer(ran: dict[str, Any], runtime: str) -> dict[str, Any]:
    answer = ran["answer"]
    assert answer["status"] == "ok", answer.get("error")
    assert set(answer) >= {"samples_ms", "first_run_ms", "load_ms", "generation", "facts"}
    assert len(answer["samples_ms"]) == 2 and answer["load_ms"] > 0 and answer["first_run_ms"] > 0
    generation = answer["generation"]
    assert [len(row) for row in generation["tokens"]] == [NEW_TOKENS] and generation["tokens_stable"] is True
    assert len(generation["ttft_samples_ms"]) == 2 and all(
        len(s) == NEW_TOKENS - 1 for s in generation["step_samples_ms"]
    )
    top = generation["step_top"]
    assert [len(row) for row in top["ids"]] == [NEW_TOKENS] and all(len(ids) == TOP_K for ids in top["ids"][0])
    assert [ids[0] for ids in top["ids"][0]] == generation["tokens"][0]  # greedy: each token its step's best
    facts = answer["facts"]
    assert facts["runtime"]["name"] == runtime and facts["runtime"]["version"]
    assert facts["runtime"]["threads_requested"] == 1 and facts["runtime"]["threads_effective"] == 1
    assert facts["runtime"]["backend"] == "wasm" and facts["cross_origin_isolated"] is True
    # nothing from outside the served set: the page's origin under this run's token, or a worker's blob: URL
    outside = [url for url in ran["requested"] if not url.startswith((ran["base"], "blob:"))]
    assert outside == []
    assert any(f"runtimes/{runtime}/" in url for url in ran["requested"])
    return answer


def decode_rate(answer: dict[str, Any]) -> float:
    steps = [s for sample in answer["generation"]["step_samples_ms"] for s in sample]
    return 1000.0 * len(steps) / sum(steps)


def test_wllama_generates_on_a_gguf_with_one_thread_read_back(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    ran = page_answer(
        "llama.cpp", {"tiny.gguf": gguf}, "tiny.gguf", np.asarray([GGUF_PROMPT], np.int64), len(GGUF_TOKENS)
    )
    answer = check_answer(ran, "llama.cpp")
    runtime = answer["facts"]["runtime"]
    assert runtime["model_format"] == "gguf" and runtime["gguf_file_type"] == 0  # ALL_F32
    assert runtime["compat_build"] is False and runtime["multithread_build"] is False
    assert runtime["llama_cpp_timings"]["prompt_n"] == len(GGUF_PROMPT)  # the spelled prompt's ids, recounted
    assert answer["generation"]["prefill_logits"] is None  # wllama 3.x gives no prefill logits
    assert all(len(values) == TOP_K and values[0] <= 0 for values in answer["generation"]["step_top"]["values"][0])
    assert runtime["n_gpu_layers"] == 0 and runtime["offload"]["weight_buffers"] == ["CPU"]  # read back: CPU only
    print(f"llama.cpp decode {decode_rate(answer):.0f} tokens/s")


def test_wllama_on_webgpu_is_a_webgpu_row_only_where_llama_cpp_offloaded_layers(tmp_path: Path) -> None:
    """wllama 3.8.1's build carries ggml-webgpu. What ran is read back from llama.cpp's load log: on SwiftShader (no
    shader-f16) no layer is offloaded and llama.cpp would run on the CPU without an error, so the row is `unsupported`
    saying so, the adapter named; on an adapter where layers were offloaded, an ok row says how many."""
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    ran = page_answer("llama.cpp", {"tiny.gguf": gguf}, "tiny.gguf", np.asarray([GGUF_PROMPT], np.int64),
                      len(GGUF_TOKENS), ep="webgpu")  # fmt: skip
    answer = ran["answer"]
    runtime = answer["facts"]["runtime"]
    assert runtime["backend"] == "webgpu" and runtime["n_gpu_layers"] == 99999
    if answer["status"] == "unsupported" and runtime.get("adapter") is None:  # no WebGPU adapter in this browser
        assert "WebGPU" in answer["error"]
        return
    offload = runtime["offload"]
    if answer["status"] == "ok":
        assert offload["layers_offloaded"] > 0 and offload["weight_buffers"] != ["CPU"]
        return
    assert answer["status"] == "unsupported", answer.get("error")
    assert "offloaded no layer" in answer["error"] and runtime["adapter"]["description"] in answer["error"]
    assert offload == {"layers_offloaded": None, "layers_total": None, "weight_buffers": ["CPU"]}
    if not runtime["adapter"]["shader_f16"]:
        assert "no shader-f16" in answer["error"]


def tjs_files(folder: Path, tokenizer: dict[str, bytes] | None = None) -> dict[str, Path | bytes]:
    names = ("config.json", "onnx/model.onnx", "tokenizer.json", "tokenizer_config.json")
    return {name: folder / name for name in names} | (tokenizer or {})


def test_transformers_js_pipeline_generates_native_ort_tokens(llama_tiny: dict[str, Any]) -> None:
    ran = page_answer("transformers.js", tjs_files(llama_tiny["folder"]), "onnx/model.onnx", llama_tiny["ids"], 1000,
                      dtype="fp32")  # fmt: skip
    answer = check_answer(ran, "transformers.js")
    assert answer["generation"]["tokens"] == llama_tiny["native"]
    runtime = answer["facts"]["runtime"]
    assert runtime["pipeline"] == "text-generation" and runtime["version"] == "4.3.1"
    assert runtime["prompt"]["pipeline_ids_equal"] is True and runtime["prompt"]["route"].startswith("text")
    assert runtime["model_format"] == "onnx" and runtime["ort_web_version"].startswith("1.31.0-dev")
    assert runtime["ort_web_version"] == runtime_dist.versions("transformers.js")["onnxruntime-web"]
    assert sorted(runtime["wasm_files"]) == [
        "ort-wasm-simd-threaded.asyncify.mjs",
        "ort-wasm-simd-threaded.asyncify.wasm",
    ]
    logits = answer["generation"]["prefill_logits"]
    assert logits["dims"] == [1, 1, 1000] and len(logits["values"]) == 1000
    print(f"transformers.js decode {decode_rate(answer):.0f} tokens/s")


def test_a_pipeline_tokenizer_with_other_ids_is_said_and_the_ids_run(llama_tiny: dict[str, Any]) -> None:
    """Planted: a tokenizer that adds a BOS the prompt lacks (tokenizer_config's add_bos_token and a template that
    prepends <s>): the page says the pipeline's ids differ from the first position, and generates on the prompt ids
    through the pipeline's model: native ORT's tokens."""
    tokenizer = synthetic(1000, 1, 2)
    vocab = json.loads(tokenizer["tokenizer.json"])
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    vocab["post_processor"] = {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}  # fmt: skip
    tokenizer["tokenizer.json"] = json.dumps(vocab).encode()
    tokenizer["tokenizer_config.json"] = json.dumps(
        json.loads(tokenizer["tokenizer_config.json"]) | {"add_bos_token": True}
    ).encode()
    ids = llama_tiny["ids"]
    ran = page_answer("transformers.js", tjs_files(llama_tiny["folder"], tokenizer), "onnx/model.onnx", ids, 1000,
                      dtype="fp32")  # fmt: skip
    answer = check_answer(ran, "transformers.js")
    assert answer["generation"]["tokens"] == llama_tiny["native"]
    prompt = answer["facts"]["runtime"]["prompt"]
    assert prompt["pipeline_ids_equal"] is False and prompt["route"].startswith("ids")
    assert prompt["first_differing_position"] == 0 and prompt["pipeline_prompt_length"] == ids.shape[1] + 1


def test_webllm_answers_unsupported_with_its_reason() -> None:
    ran = page_answer("webllm", {"none.bin": b"\0"}, "none.bin", np.asarray([[1, 2]], np.int64), 8)
    answer = ran["answer"]
    assert answer["status"] == "unsupported" and "TVM-compiled model library" in answer["error"]
    assert answer["facts"]["runtime"]["name"] == "webllm"


def test_the_runtime_files_are_a_closed_set() -> None:
    files = runtime_dist.files("llama.cpp")
    assert set(files) == {"wllama.js", "wllama.wasm", "package.json", "compat-wllama.js", "compat-wllama.wasm"}
    assert json.loads(files["package.json"].read_text())["version"] == "3.8.1"
    assert runtime_dist.versions("transformers.js")["@huggingface/transformers"] == "4.3.1"
    assert runtime_dist.problem("llama.cpp", root=Path("/nonexistent")).endswith(
        "run `make setup` (it runs `cd web && npm ci`)"
    )


def test_webllm_loads_the_served_folder_and_a_library_that_is_no_wasm_is_an_error(tmp_path: Path) -> None:
    """--webllm-model's folder served as WebLLM fetches it (harness.prepare.mlc_folder), on SwiftShader's WebGPU: no
    model library can be compiled here, so the folder's is no wasm, and WebLLM's load fails: an `error` in WebLLM's
    words, with its version, having fetched its chat config and the library from the served set only."""
    from test_page_runtime_plan import mlc_folder

    from harness.prepare.mlc_folder import read_mlc_folder

    mlc = read_mlc_folder(mlc_folder(tmp_path))
    ran = page_answer("webllm", dict(mlc.files), mlc.library, np.asarray([[1, 2]], np.int64), 1000, ep="webgpu",
                      folder=True)  # fmt: skip
    answer = ran["answer"]
    assert answer["status"] in ("error", "unsupported"), answer
    runtime = answer["facts"]["runtime"]
    assert runtime["name"] == "webllm" and runtime["version"] == "0.2.86"
    if answer["status"] == "unsupported":  # a browser with no WebGPU adapter: said so before WebLLM loads
        assert "WebGPU" in answer["error"]
        return
    assert runtime["adapter"] is not None and "load_ms" not in runtime
    outside = [url for url in ran["requested"] if not url.startswith((ran["base"], "blob:", "data:"))]
    assert outside == []
    fetched = {url.removeprefix(ran["base"]).split("/", 1)[-1] for url in ran["requested"]}
    assert any(url.endswith("mlc/mlc-chat-config.json") for url in fetched), fetched
    assert any(url.endswith(mlc.library) for url in fetched), fetched
    print(f"webllm: {answer['status']}: {answer['error'][:200]}")
