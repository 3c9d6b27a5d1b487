"""A generate case in the browser (web/page/generate.mjs): the page job's generation part, and the row
built from the page's answer, with the figures of harness.core.generation, its tokens and step logits checked
against native ONNX Runtime teacher-forced on the same graph file and its quality beside the fp32 graph
(harness.prepare.quality.check_generation)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.faults import injected_faults
from harness.core.generation import MEMORY_GROWTH_BOUND_MB, STEP_TOP_K, StepTop, encoder_figures, mean_steps
from harness.core.parity import GGML_SIDE, compare
from harness.core.records import Case, Result
from harness.prepare.folders import past_shape
from harness.prepare.perplexity import PREFILL, STEPS, Passage, over_budget, passage_facts
from harness.prepare.prepared import PreparedModel
from harness.prepare.quality import Graphs, check_generation, gguf_quality
from harness.prepare.seq2seq import Seq2SeqFiles, audio_seconds, precision_files, seq2seq_files, start_token
from harness.web.page_job import GenerateJob, PassageJob, Seq2SeqJob
from harness.web.runtimes import OWN_RUNTIME, RUNTIMES

# The faults hook's planted kernel bug (tests): the page is served a copy of its graph with one weight matrix
# scaled by this factor, while the row is checked against the file it names.
SCALED_WEIGHT_FAULT = "page-weight-scale"
SCALED_WEIGHT_FACTOR = 1.05


@cache
def _outputs(path: Path) -> tuple[tuple[str, int | None], ...]:
    """An ONNX file's outputs, read from the proto (weights not loaded): each name and its last dimension
    where the graph fixes it."""
    import onnx

    found = []
    for value in onnx.load(str(path), load_external_data=False).graph.output:
        dims = value.type.tensor_type.shape.dim
        last = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None
        found.append((value.name, last or None))
    return tuple(found)


def graph_outputs(path: Path) -> tuple[str, ...]:
    """An ONNX file's output names."""
    return tuple(name for name, _ in _outputs(path))


def vocab_size(path: Path) -> int | None:
    """The width of a generation graph's logits (its first output): the vocabulary a served page's token ids
    are checked against (harness.web.answers); None where the graph leaves it symbolic."""
    return _outputs(path)[0][1]


def seq2seq_layout(source: Path | None, precision: str) -> tuple[Seq2SeqFiles, int] | None:
    """An encoder–decoder's graphs at the precision and its decoder's start token, where `source` (the model's
    graph for generation, harness.prepare.prepared) is the first decoder step of such a layout."""
    if source is None or seq2seq_files(source) is None:
        return None
    return precision_files(source, precision)[0], start_token(source)


def layout_files(name: str, layout: Seq2SeqFiles) -> dict[str, Path]:
    """The other graphs a page job serves: the encoder and, for a split decoder, the later steps' one."""
    served = {f"{name}-encoder.onnx": layout.encoder}
    return served if layout.merged else served | {f"{name}-decoder-past.onnx": layout.decoder_past}


def _on_gpu(model: Path) -> dict[str, Any]:
    """WebGPU's output locations: present.* kept on the GPU, only the logits (the first output) to the CPU."""
    logits, *presents = graph_outputs(model)
    return {"preferredOutputLocation": {logits: "cpu"} | dict.fromkeys(presents, "gpu-buffer")}


def generate_job(model: Path, case: Case, keeps_on_gpu: bool, layout: tuple[Seq2SeqFiles, int] | None = None,
                 urls: dict[str, str] | None = None, eos: tuple[int, ...] = (),
                 passage: Passage | None = None) -> GenerateJob:  # fmt: skip
    """A page job's generation part: the token count, the logits width (the vocabulary its token ids are
    checked against), a model folder's past heads and head size and, on WebGPU, present.* kept on the GPU
    (only the logits, the first output, come back to the CPU); the EOS ids it stops at (--stop-at-eos), the
    KV-cache depth filled first and each step's top-k the page returns. An encoder–decoder's names its other graphs'
    URLs (`urls`, keyed as layout_files names them) and the decoder's start token (web/page/seq2seq.mjs). A
    decoder-only model's `passage` is forced after the timed loop, its fp32 reference at urls[PASSAGE_FILE]."""
    assert case.new_tokens is not None  # a generate case always has its count (harness.run.plan)
    shape = past_shape(model) if layout is None else None  # a folder's config, where the graph is symbolic
    vocab = vocab_size(model)
    forced = PassageJob(list(passage.ids), (urls or {}).get(PASSAGE_FILE)) if passage and passage.ids else None
    return GenerateJob(
        new_tokens=case.new_tokens,
        vocab_size=vocab,
        past_shape=None if shape is None else list(shape),
        session_options=_on_gpu(model) if keeps_on_gpu else None,
        depth=case.depth or 0,
        eos_ids=list(eos),
        top_k=STEP_TOP_K if vocab is None else min(STEP_TOP_K, vocab),  # each step's logits the page returns
        seq2seq=None if layout is None else _seq2seq_job(layout, keeps_on_gpu, urls or {}),
        passage=forced if layout is None else None,  # an encoder–decoder's decoder has no free passage
    )


PASSAGE_FILE = "passage-fp32.f32"  # the fp32 reference's log-probabilities over the passage, as the page is served it


def passage_files(passage: Passage | None) -> dict[str, Path]:
    """The file a generate job serves beside its graph for the passage: the fp32 reference, where at hand."""
    return {PASSAGE_FILE: Path(passage.reference)} if passage is not None and passage.reference else {}


def page_passage(generation: dict[str, Any], passage: Passage | None, engine: str) -> dict[str, Any]:
    """A page row's passage facts (harness.prepare.perplexity.passage_facts) from its answer's scores: our own loop
    forces the passage on its session; another page runtime's API yields tokens, not a forced sequence's logits."""
    if engine != OWN_RUNTIME:
        return {"perplexity": None, "perplexity_not_measured": f"{engine}'s API in the page yields generated tokens, "
                                                               "not the logits of a forced sequence"}  # fmt: skip
    if passage is None or not passage.ids:
        return {"perplexity": None, "perplexity_not_measured": passage.source if passage else "no passage prepared"}
    scored = generation.get("passage")
    if not isinstance(scored, dict) or "error" in scored:
        why = scored["error"][:500] if isinstance(scored, dict) else "the page forced no passage"
        return {"perplexity": None, "perplexity_not_measured": f"the page's forced passage failed: {why}"}
    if "skipped" in scored:  # checked (web/answers.py): its steps would pass the case's --max-time
        skipped = scored["skipped"]
        why = over_budget(skipped["steps"], skipped["step_ms"], skipped["estimate_ms"], skipped["limit_ms"] / 1000)
        return {"perplexity": None, "perplexity_not_measured": why}
    if any(v is None for v in scored["nll"] + (scored.get("kl") or [])):
        return {"perplexity": None, "perplexity_not_measured": "the page's logits over the passage were not finite"}
    kl = None if scored.get("kl") is None else np.asarray(scored["kl"], dtype=np.float64)
    forced = PREFILL if scored["method"] == "prefill" else STEPS
    how = (f"the page's own session (onnxruntime-web), {forced} from an empty KV cache, batch 1, untimed, after the "
           "timed loop; NLL, argmax and KL computed in the page")  # fmt: skip
    facts = passage_facts(np.asarray(scored["nll"], dtype=np.float64), np.asarray(scored["argmax"]), kl, passage, how)
    return facts | ({"perplexity_ms": scored["ms"]} if scored.get("ms") is not None else {})  # the untimed phase's


def _seq2seq_job(layout: tuple[Seq2SeqFiles, int], keeps_on_gpu: bool, urls: dict[str, str]) -> Seq2SeqJob:
    files, start = layout
    by_suffix = {key.rsplit("-", 1)[-1]: url for key, url in urls.items()}  # encoder.onnx, past.onnx
    options = _on_gpu(files.decoder_past) if keeps_on_gpu and not files.merged else None
    return Seq2SeqJob(by_suffix["encoder.onnx"], start, by_suffix.get("past.onnx"), options)


def prompt_feeds(feeds: dict[str, np.ndarray], seq2seq: bool = False) -> dict[str, np.ndarray]:
    """The prompt a generation starts from (the page builds positions and the empty past itself); an
    encoder–decoder's: its encoder's inputs (log-mel features, or tokens and their mask)."""
    names = ("input_features",) if seq2seq and "input_features" in feeds else ("input_ids", "attention_mask")
    return {name: feeds[name] for name in names}


def memory_growth(generation: dict[str, Any], details: dict[str, Any], on_gpu: bool = True) -> dict[str, Any]:
    """How memory moved over the repeated generations, and a flag when it grew beyond MEMORY_GROWTH_BOUND_MB
    (what a KV cache that is never disposed does): the page's own figure after the warm-up and after the
    repeats (JS and wasm heaps), and for a launched browser running a GPU EP (`on_gpu`) its GPU process's RSS
    at the timed loop's start and end (where a WebGPU cache lives on a software adapter). A wasm cache never
    reaches the GPU process: without the page's figure (Chromium's headless shell has none) it is not measured,
    never a GPU process's flat line."""
    before, after = generation.get("memory_before") or {}, generation.get("memory_after") or {}
    facts: dict[str, Any] = {"memory_growth_bound_mb": MEMORY_GROWTH_BOUND_MB}
    growth: dict[str, float] = {}
    if before.get("bytes") is not None and after.get("bytes") is not None:
        facts["page_memory_before_mb"], facts["page_memory_after_mb"] = before["bytes"] / 2**20, after["bytes"] / 2**20
        growth["the page's heaps"] = facts["page_memory_after_mb"] - facts["page_memory_before_mb"]
    start, end = details.get("gpu_process_loop_start_mb"), details.get("gpu_process_loop_end_mb")
    if start is not None and end is not None and on_gpu:
        growth["the browser's GPU process"] = end - start
    if not growth:
        why = before.get("error") or after.get("error") or "no figure before and after the repeats"
        return facts | {"memory_growth": f"not measured: {why}"}
    facts["memory_growth_mb"] = max(growth.values())
    facts["memory_growth_flag"] = facts["memory_growth_mb"] > MEMORY_GROWTH_BOUND_MB
    grew = ", ".join(f"{where} {mb:+.1f} MB" for where, mb in growth.items())
    facts["memory_growth"] = f"over the repeated generations: {grew} (bound {MEMORY_GROWTH_BOUND_MB:g} MB)"
    if facts["memory_growth_flag"]:
        facts["memory_growth"] += ": beyond it; a KV cache that is not disposed grows memory every generation"
    return facts


def served_graph(model: Path) -> Path:
    """The file the page is served for `model`: itself, or under the faults hook's SCALED_WEIGHT_FAULT a copy
    with its largest weight matrix scaled by SCALED_WEIGHT_FACTOR (a planted kernel bug the check must catch)."""
    if SCALED_WEIGHT_FAULT not in injected_faults() or model.suffix == ".gguf":  # a GGUF's: runtimes.served_gguf
        return model
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(model))
    weight = max((t for t in graph.graph.initializer if len(t.dims) == 2), key=lambda t: t.dims[0] * t.dims[1])
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * SCALED_WEIGHT_FACTOR, weight.name))
    scaled = model.with_name(f"{model.stem}-scaled{model.suffix}")
    onnx.save(graph, str(scaled))
    return scaled


def _prefill_logits(generation: dict[str, Any]) -> np.ndarray:
    logits = generation["prefill_logits"]
    values = [np.nan if v is None else v for v in logits["values"]]  # JSON carries a NaN as null
    return np.asarray(values, dtype=np.float32).reshape(logits["dims"])


def _step_top(generation: dict[str, Any]) -> StepTop:
    top = generation["step_top"]
    values = [[[np.nan if v is None else v for v in step] for step in row] for row in top["values"]]
    return StepTop(np.asarray(top["ids"], dtype=np.int64), np.asarray(values, dtype=np.float64))


def generation_result(prepared: PreparedModel, target: Any, case: Case, answer: dict[str, Any],
                      fields: dict[str, Any], extra: dict[str, Any], details: dict[str, Any],
                      model: Path | None = None) -> Result:  # fmt: skip
    """The row of a page's generate answer: figures from its samples; the prefill logits, each step's top-k
    and the tokens checked against native ORT on `model`, the file the page ran; quality beside fp32."""
    generation = answer["generation"]
    steps = generation["step_samples_ms"]
    fields |= {
        "ttft_samples_ms": generation["ttft_samples_ms"],
        "step_samples_ms": steps,
        "tpot_samples_ms": mean_steps(steps),
        "generated_tokens": generation["tokens"],
    }
    details |= memory_growth(generation, details, on_gpu=target.hardware != "wasm")
    if (warm := generation.get("warmup_samples_ms")) is not None:  # checked (web/answers.py): the last ones
        details |= {"warmup_generations": generation["warmup_generations"], "warmup_samples_ms": warm}
        details |= {"warmup_s": generation["warmup_ms"] / 1000} if "warmup_ms" in generation else {}
    runtime = answer.get("facts", {}).get("runtime")
    speech = isinstance(runtime, dict) and prepared.spec.takes_speech  # a speech pipeline's own (transformers.js)
    features = runtime.get("features") if speech else None
    if generation.get("encoder_samples_ms") or features is not None:  # the encoder's phase, speech's real-time factor
        encoder = generation.get("encoder_samples_ms") or []  # a pipeline times no encoder apart: the factor alone
        seconds = audio_seconds(prepared.load_case((case.batch_size, case.seq_len))[0], case.audio_seconds)
        details |= encoder_figures(encoder, answer["samples_ms"], seconds) | {"audio_seconds": seconds}
        details |= {"encoder_samples_ms": encoder} if encoder else {}
    details |= page_passage(generation, prepared.passage, target.engine)
    if not generation["tokens_stable"]:
        details["tokens_unstable"] = "the timed generations did not all give the warm-up's tokens"
    feeds, _ = prepared.load_case((case.batch_size, case.seq_len), case.audio_seconds)  # what the page's job carried
    encoder_decoder = prepared.onnx_past_path is not None and seq2seq_files(prepared.onnx_past_path) is not None
    # speech has no prompt tokens (input_ids None), but its output is text
    fields |= prepared.text_fields(feeds.get("input_ids"), generation["tokens"], details)
    if prepared.spec.is_gguf_file:  # llama.cpp on the GGUF given as the model: native llama.cpp's tokens the reference
        from harness.prepare.gguf_model import token_check

        top = _step_top(generation) if generation.get("step_top") else None  # wllama's: log-probabilities
        agree, facts = token_check(prepared, case, generation["tokens"], top, log_probs=True)
        details |= facts
        status, error = ("mismatch", facts["token_parity"]) if agree is False else ("ok", None)
        return prepared.result(target, case, status, error, details=details, **extra, **fields)
    if model is None or prepared.onnx_past_path is None:
        details["token_parity"] = "not checked: the page's graph is not at hand"
        return prepared.result(target, case, "ok", None, details=details, **extra, **fields)
    prompt = prompt_feeds(feeds, encoder_decoder)
    layout = seq2seq_layout(prepared.onnx_past_path, case.precision) if encoder_decoder else None
    graphs = model if layout is None else layout[0]  # an encoder–decoder's: every graph the page ran
    precision = extra.get("precision") or "fp32"
    if RUNTIMES[target.engine].format == "gguf":  # llama.cpp on a GGUF of the same weights: no ONNX graph ran
        checked = _gguf_check(generation, prepared, prompt, precision, details, case.depth or 0)
        return prepared.result(target, case, *checked, details=details, **extra, **fields)
    if features is not None:  # a speech pipeline computed its own features from the samples
        same, details["speech_features"] = speech_features(features)
        if not same:  # its tokens cannot be held to native ORT's on the harness's features: its WER is the check
            details["token_parity"] = "not checked: the pipeline heard other features; held by WER against native ORT's"
            return prepared.result(target, case, "ok", None, details=details, **extra, **fields)
    status, error, parity_fields = _parity(generation, graphs, prepared, prompt, precision, details, case.depth or 0)
    return prepared.result(target, case, status, error, details=details, **parity_fields, **extra, **fields)


# How far a page runtime's own log-mel features (transformers.js's WhisperFeatureExtractor on the samples) may be
# from the harness's (transformers' in Python) for its tokens to be checked against native ORT's on the harness's:
# float32 FFTs of the same samples, measured 2.2e-5 apart at most on whisper-tiny's 5 s case; features of other audio
# are 0.1 and more apart (tests/test_page_runtime_speech.py)
FEATURE_TOLERANCE = 1e-4


def speech_features(features: Any) -> tuple[bool, str]:
    """(whether a speech pipeline's features are the harness's within FEATURE_TOLERANCE, what the row says): read
    from the page's facts.runtime.features as data (typed, bounded)."""
    largest = features.get("max_abs_difference") if isinstance(features, dict) else None
    if not isinstance(largest, int | float) or isinstance(largest, bool) or not 0 <= largest < float("inf"):
        return False, "the pipeline's own log-mel features could not be compared with the harness's (shape or value)"
    same = largest <= FEATURE_TOLERANCE
    words = "within" if same else "beyond"
    return same, (f"the pipeline's own log-mel features, {largest:.3g} at most from the harness's ({words} "
                  f"{FEATURE_TOLERANCE:g}): its tokens {'checked against' if same else 'held by WER against'} "
                  "native ORT's")  # fmt: skip


def _gguf_check(generation: dict[str, Any], prepared: PreparedModel, prompt: dict[str, np.ndarray], precision: str,
                details: dict[str, Any], depth: int = 0) -> tuple[str, str | None]:  # fmt: skip
    """(status, error) of a generation llama.cpp ran on the GGUF the harness wrote of the model's weights, by native
    llama.cpp's rule (harness.run.native): at fp32 (GGUF F32: the weights the fp32 graph holds) its tokens and each
    step's top-k log-probabilities (the page's llama.cpp returns no logits) are checked against native ORT
    teacher-forced on the fp32 graph; at another precision no graph computes llama.cpp's own blocks (Q4_0 is not
    MatMulNBits, F16 weights are not an fp16 graph), so only its agreement with the fp32 graph is measured
    (quality, never a mismatch). depth: the KV cache llama.cpp filled first (fp32 only: runtime_refusal)."""
    source, reference = prepared.onnx_past_path, prepared.fp32_reference
    assert source is not None  # a page generation ran the model's graph for generation, or a GGUF of it
    tokens = generation["tokens"]
    if reference is None:
        details["token_parity"] = "not checked: no fp32 graph of the model is at hand"
        return "ok", None
    top = _step_top(generation) if generation.get("step_top") else None
    try:
        if precision == "fp32":
            agree, facts, _ = check_generation(reference, source, prompt, tokens, precision, GGML_SIDE, top, depth,
                                               log_probs=True, fp32=reference)  # fmt: skip
            details |= facts | {"token_reference": f"{facts['token_reference']} (fp32: the GGUF's weights)",
                                "step_top_values": "log-probabilities, against native ORT's log-softmax"}  # fmt: skip
            return ("ok", None) if agree else ("mismatch", facts["token_parity"])
        details |= gguf_quality(source, prompt, tokens, precision, reference)
    except ValueError as exc:
        return "error", f"parity check failed: {exc}"
    return "ok", None


def _parity(generation: dict[str, Any], model: Graphs, prepared: PreparedModel, prompt: dict[str, np.ndarray],
            precision: str, details: dict[str, Any], depth: int = 0) -> tuple[str, str | None, dict]:  # fmt: skip
    """(status, error, fields): the prefill logits within the precision's tolerance of native ORT's on the same
    file, then every step's top-k and the tokens (harness.core.generation.token_check)."""
    top = _step_top(generation) if generation.get("step_top") is not None else None  # another runtime's: optional
    try:
        assert prepared.onnx_past_path is not None  # the page ran the model's graph for generation
        agree, facts, native = check_generation(model, prepared.onnx_past_path, prompt, generation["tokens"], precision,
                                                "browser", top, depth, fp32=prepared.fp32_reference)  # fmt: skip
        if generation.get("prefill_logits") is None:  # a runtime whose API returns no logits: its tokens alone
            details |= facts | {"logits_checked": "no: the page runtime returns no logits; its tokens are checked"}
            return ("ok", None, {}) if agree else ("mismatch", facts["token_parity"], {})
        logits = compare([_prefill_logits(generation)], [native[:, :1]], precision, ["prefill logits"])
    except ValueError as exc:
        return "error", f"parity check failed: {exc}", {}
    details |= logits.details | facts
    problems = [text for text in (logits.error, None if agree else facts["token_parity"]) if text]
    return ("ok" if not problems else "mismatch"), "; ".join(problems) or None, logits.fields
