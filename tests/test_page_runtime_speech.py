"""transformers.js's automatic-speech-recognition pipeline: the rule that holds its tokens to native ORT's (cheap),
and (slow) the pipeline in real Chromium on whisper-tiny's export (the session's
cache, shared with tests/test_seq2seq.py and tests/test_audio.py), as a transformers.js folder
(harness.browser.runtimes.speech_folder): the page hands it 5 s of espeak-ng's passage as samples, compares its own
log-mel features with the harness's, and its greedy tokens with native ONNX Runtime's on the harness's features."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.web import driver, runtime_dist
from harness.web.flags import gpu_profile, launch_flags
from harness.web.page_job import GenerateJob, PageInput, PageJob, StopRule

BROWSER = pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists() or runtime_dist.problem("transformers.js") is not None,
    reason="needs Chromium at /usr/bin/chromium and transformers.js's npm files (make setup)",
)
NEW_TOKENS, TOP_K, SECONDS = 6, 5, 5.0
# two timed generations; the untimed warm-up (until the time stops falling) cut at 1 s: the pipeline's first calls
# fall for seconds, which this test does not need
STOP = StopRule(warmup=0, iterations=2, min_duration_ms=0.0, max_iterations=2, min_iterations=2, max_time_ms=1000)


@pytest.fixture(scope="module")
def whisper(web_cache: Path) -> dict[str, Any]:  # noqa: F811
    """whisper-tiny's merged-decoder export as a transformers.js folder, 5 s of speech, the harness's features of
    it and native ORT's greedy tokens on them."""
    from harness.browser.runtimes import speech_folder
    from harness.prepare.audio import fit, log_mel, speech_input
    from harness.prepare.prepared import PrepareJob, prepare_model
    from harness.prepare.seq2seq import reference_seq2seq, seq2seq_files
    from harness.prepare.spec_tokenizer import TOKENIZER_FILE, spec_tokenizer
    from harness.prepare.specs import load_specs

    spec = load_specs()["whisper-tiny"]
    prepared = next(prepare_model(PrepareJob(spec, [(1, 8)], with_past=True, plain=False)))
    assert prepared.onnx_past_path is not None, prepared.onnx_past_error
    files = seq2seq_files(prepared.onnx_past_path.parent / "decoder_model_merged.onnx")
    assert files is not None and files.merged
    tokenizer = (spec_tokenizer(spec) / TOKENIZER_FILE).read_bytes()
    config = (files.decoder.parent / "config.json").read_bytes()
    folder = speech_folder(files.encoder, files.decoder, config, tokenizer, 80, 3000)
    samples = fit(speech_input(None).samples, SECONDS).astype(np.float32)
    features = log_mel(samples, 80, 3000)
    native = reference_seq2seq(files, {"input_features": features}, NEW_TOKENS)
    start = json.loads(config)["decoder_start_token_id"]
    return {"folder": folder, "samples": samples, "features": features, "native": native.tokens.tolist(),
            "start": start}  # fmt: skip


def speech_answer(folder: dict[str, Any], samples: np.ndarray, features: np.ndarray) -> dict[str, Any]:
    """The answer of one transformers.js speech job (wasm, 1 thread) and every URL the browser asked for."""
    from playwright.async_api import async_playwright

    from harness.web.server import PageServer

    async def answer() -> dict[str, Any]:
        server = PageServer()
        await server.start()
        try:
            urls = server.set_job_files({**folder, "audio.bin": samples.tobytes(), "features.bin": features.tobytes()})
            inputs = [PageInput("audio", urls["audio.bin"], "float32", [len(samples)]),
                      PageInput("input_features", urls["features.bin"], "float32", list(features.shape))]  # fmt: skip
            generate = GenerateJob(new_tokens=NEW_TOKENS, vocab_size=1000, top_k=TOP_K)
            base = {"runtime_model_base": f"{server.base_url}job/", "runtime_dtype": "fp32"}
            main = urls["onnx/decoder_model_merged.onnx"]
            job = PageJob(main, inputs, "wasm", 1, STOP, "b1_a5", generate=generate, runtime="transformers.js", **base)
            async with async_playwright() as playwright:
                source = driver.LocalBrowser(
                    driver.resolve_browser("chromium"), launch_flags(["wasm"], gpu_profile("off"))
                )
                session = driver.BrowserSession(playwright, source, server)
                requested: list[str] = []
                try:
                    assert await session.ensure_started() is None
                    session.context.on("request", lambda request: requested.append(request.url))
                    result = await session.run_job(server.page_url, "transformers.js", job, 120)
                finally:
                    await session.close()
            return {"answer": result, "requested": requested, "base": server.base_url}
        finally:
            await server.stop()

    return driver.run_sync(answer())


def test_a_pipelines_features_hold_its_tokens_to_native_orts_only_within_tolerance() -> None:
    """The row's rule (harness.browser.generate.speech_features): within FEATURE_TOLERANCE its tokens are checked
    against native ORT's; beyond it (planted: 0.1 apart), or unreadable (a shape that differed, a hostile value),
    they are held by WER instead, and the row says which."""
    from harness.browser.generate import FEATURE_TOLERANCE, speech_features

    same, said = speech_features({"max_abs_difference": 2.2e-5})
    assert same is True and "checked against native ORT's" in said and f"within {FEATURE_TOLERANCE:g}" in said
    same, said = speech_features({"max_abs_difference": 0.1})
    assert same is False and "held by WER against native ORT's" in said and "beyond" in said
    for bad in ({"same_shape": False}, {"max_abs_difference": "1e-9"}, {"max_abs_difference": True}, [], None):
        assert speech_features(bad)[0] is False


def test_transformers_js_runs_whisper_speech_at_fp32_on_the_merged_decoder_and_nothing_else(tmp_path: Path) -> None:
    """What an encoder–decoder case on a page runtime is refused with, before a page opens: T5 (text) and any
    runtime but transformers.js; a precision other than fp32; an export with no merged decoder (the file named), or
    without a config.json that gives the encoder's window as integers."""
    from types import SimpleNamespace

    from harness.browser.runtimes import _speech_refusal

    (tmp_path / "encoder_model.onnx").write_bytes(b"")
    (tmp_path / "decoder_model.onnx").write_bytes(b"")
    whisper = SimpleNamespace(spec=SimpleNamespace(takes_speech=True), onnx_past_path=tmp_path / "decoder_model.onnx")
    t5 = SimpleNamespace(spec=SimpleNamespace(takes_speech=False), onnx_past_path=whisper.onnx_past_path)
    fp32, int8 = SimpleNamespace(precision="fp32"), SimpleNamespace(precision="int8")
    assert "an encoder–decoder of text runs on onnxruntime-web" in _speech_refusal(t5, "transformers.js", fp32)
    assert _speech_refusal(whisper, "llama.cpp", fp32).startswith("llama.cpp is run here on decoder-only generation")
    assert (
        _speech_refusal(whisper, "transformers.js", int8)
        == "transformers.js speech is run here on the fp32 graphs, not int8"
    )
    assert "onnx/decoder_model_merged.onnx" in _speech_refusal(whisper, "transformers.js", fp32)  # none written
    (tmp_path / "decoder_model_merged.onnx").write_bytes(b"")
    assert "needs config.json beside the graphs" in _speech_refusal(whisper, "transformers.js", fp32)  # none there
    (tmp_path / "config.json").write_text(json.dumps({"num_mel_bins": "80", "max_source_positions": 1500}))
    assert "num_mel_bins and max_source_positions" in _speech_refusal(whisper, "transformers.js", fp32)  # not an int
    (tmp_path / "config.json").write_text(json.dumps({"num_mel_bins": 80, "max_source_positions": 1500}))
    assert _speech_refusal(whisper, "transformers.js", fp32) is None


@BROWSER
@pytest.mark.slow  # ~10-20 s of Chromium and the pipeline's first calls; CI runs the cheap checks above
def test_the_speech_pipeline_hears_the_harness_features_and_gives_native_ort_tokens(whisper: dict[str, Any]) -> None:
    ran = speech_answer(whisper["folder"], whisper["samples"], whisper["features"])
    answer = ran["answer"]
    assert answer["status"] == "ok", answer.get("error")
    generation = answer["generation"]
    assert generation["tokens"] == whisper["native"] and generation["tokens_stable"] is True
    assert len(answer["samples_ms"]) == 2 and all(len(s) == NEW_TOKENS - 1 for s in generation["step_samples_ms"])
    assert [ids[0] for ids in generation["step_top"]["ids"][0]] == generation["tokens"][0]  # greedy
    runtime = answer["facts"]["runtime"]
    assert runtime["pipeline"] == "automatic-speech-recognition" and runtime["model_type"] == "whisper"
    assert runtime["threads_effective"] == 1 and runtime["version"] == "4.3.1"
    assert runtime["decoder_prompt"] == [whisper["start"]]  # no language, task or timestamp token
    features = runtime["features"]
    assert features["same_shape"] is True and features["max_abs_difference"] < 1e-4  # measured 2.2e-5
    assert isinstance(runtime["text"], str) and runtime["text"].split()  # the pipeline's own ASR decoding
    outside = [url for url in ran["requested"] if not url.startswith((ran["base"], "blob:"))]
    assert outside == []


@BROWSER
@pytest.mark.slow
def test_features_of_other_audio_are_seen_as_different(whisper: dict[str, Any]) -> None:
    """Planted: the job's features are those of the passage's next 5 s, not of the samples the pipeline hears; the
    page's comparison says they differ (its tokens then cannot be held to native ORT's on the job's features)."""
    from harness.prepare.audio import SAMPLING_RATE, fit, log_mel, speech_input

    later = fit(speech_input(None).samples[int(SECONDS * SAMPLING_RATE) :], SECONDS)
    ran = speech_answer(whisper["folder"], whisper["samples"], log_mel(later, 80, 3000))
    features = ran["answer"]["facts"]["runtime"]["features"]
    assert features["same_shape"] is True and features["max_abs_difference"] > 0.1


@BROWSER
@pytest.mark.slow  # a run of its own (whisper-tiny and flan-t5-tiny, native and in the page): CI runs the tests above
def test_a_run_gives_a_checked_transformers_js_speech_row_and_refuses_t5(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """`accelharness run` of whisper-tiny on native ORT and transformers.js in the page: native ORT's tokens, on the
    pipeline's own features of the same audio within tolerance of the harness's, the real-time factor alone (no
    encoder timed apart), no prompt rate, the same WER; T5 on transformers.js is unsupported, saying why."""
    from conftest import run_cli
    from test_browser_runtimes import rows_of

    db = tmp_path / "s.duckdb"
    done = run_cli("run", "--mode", "generate", "--model", "whisper-tiny,flan-t5-tiny", "--hardware", "cpu",
                   "--web-hardware", "wasm", "--threads", "1", "--web-runtimes", "transformers.js", "--engines",
                   "onnxruntime", "--native-threads", "1", "--no-ceilings", "--iterations", "2", "--warmup", "0",
                   "--min-duration", "0", "--max-time", "2", "--new-tokens", str(NEW_TOKENS), "--sequence-lengths", "8",
                   "--audio-seconds", "5", "--db", str(db), "--no-reports")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {(r["model"], r["engine"]): r for r in rows_of(db)}
    native, tjs = rows["whisper-tiny", "onnxruntime"], rows["whisper-tiny", "transformers.js"]
    assert tjs["status"] == "ok", tjs["error"]
    assert tjs["generated_tokens"] == native["generated_tokens"] and tjs["tokens_matched"] == NEW_TOKENS
    details = tjs["details"]
    assert details["token_parity"].startswith(f"all {NEW_TOKENS} tokens"), details["token_parity"]
    assert "(within 0.0001)" in details["speech_features"] and details["runtime"]["decoder_prompt"]
    assert details["runtime"]["pipeline"] == "automatic-speech-recognition"
    assert details["real_time_factor"] > 0 and details["encoder_ms"] is None and details["audio_seconds"] == 5.0
    assert tjs["prefill_tokens_per_s"] is None and details["wer"] == native["details"]["wer"]
    t5 = rows["flan-t5-tiny", "transformers.js"]
    assert t5["status"] == "unsupported" and "an encoder–decoder of text runs on onnxruntime-web" in t5["error"]
