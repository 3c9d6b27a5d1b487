"""A page runtime other than our own loop (web/runtimes.py's table): what it cannot run, decided before any page
is opened; the files it is handed, laid out as that runtime loads them (transformers.js: a model folder of
config.json and onnx/model[_dtype].onnx, a Whisper model's for its speech pipeline: speech_folder, a text encoder's
for its feature-extraction pipeline (inference); llama.cpp: the GGUF the prepare worker wrote of the same weights);
and the job fields that name them. A generation's checks are harness.browser.generate's, by the graph each runtime
ran; an inference row's outputs are checked as our own loop's (harness.browser.run.build_result).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from harness.browser.runtime_tokenizer import tokenizer_files
from harness.core.generation import STEP_TOP_K
from harness.core.records import Case
from harness.prepare.folder_layouts import DECODER_MERGED
from harness.prepare.gguf_file import NO_ONNX
from harness.prepare.prepared import PreparedModel
from harness.prepare.seq2seq import Seq2SeqFiles, seq2seq_files
from harness.web import runtime_dist
from harness.web.page_job import GenerateJob
from harness.web.runtimes import OWN_RUNTIME, RUNTIMES

# transformers.js names a precision's file by a suffix (model.onnx, model_fp16.onnx, model_q4.onnx): the dtype it
# is asked for. The file served is the harness's own conversion at that precision, the one native ORT runs.
TJS_DTYPES = {"fp32": "fp32", "fp16": "fp16", "int8": "int8", "q4": "q4", "q4f16": "q4f16"}
TJS_FILES = {"fp32": "model.onnx", "fp16": "model_fp16.onnx", "int8": "model_int8.onnx", "q4": "model_q4.onnx",
             "q4f16": "model_q4f16.onnx"}  # fmt: skip
# What WebLLM loads, none of which a package registry ships: mlc_llm's compiler makes both per model and GPU target
WEBLLM_NEEDS = (
    "WebLLM runs a TVM-compiled model library (<model>-webgpu.wasm, built by mlc_llm's compiler for the model) and "
    "MLC weights (mlc-chat-config.json, tensor-cache.json, tokenizer files, params_shard_*.bin); this harness does not "
    "compile them: give them as a folder with --webllm-model DIR"
)


def check_runtime_folder(runtimes: list[str], folder: Path | None) -> None:
    """--webllm-model: WebLLM's folder, read as data (harness.prepare.mlc_folder) before a run exists, and only with
    the runtime that loads it; RequestError saying what is wrong and what to supply."""
    from harness.prepare.folder_checks import FolderError
    from harness.prepare.mlc_folder import read_mlc_folder
    from harness.run.plan import RequestError

    if folder is None:
        return
    if "webllm" not in runtimes:
        raise RequestError("--webllm-model is the webllm page runtime's model folder: add webllm to the runtimes")
    try:
        read_mlc_folder(folder)
    except FolderError as exc:
        raise RequestError(str(exc)) from None


def runtime_refusal(prepared: PreparedModel, runtime: str, ep: str, case: Case,
                    folder: Path | None = None) -> str | None:  # fmt: skip
    """Why `runtime` cannot run this case here (the row is then `unsupported` with it), or None. Our own loop
    refuses nothing here (its EPs and modes are planned as before); WebLLM refuses without its folder."""
    table = RUNTIMES[runtime]
    if prepared.spec.is_gguf_file and table.format != "gguf":  # a GGUF given as the model
        return f"not applicable: {NO_ONNX}; {runtime} loads {table.format} files (--runtimes llama.cpp runs it)"
    if runtime == OWN_RUNTIME:
        return None
    if runtime == "webllm" and folder is None:
        return WEBLLM_NEEDS
    if (why := table.refusal(ep, case.mode)) is not None:
        return why
    if (missing := runtime_dist.problem(runtime)) is not None:  # its npm files: make setup
        return missing
    if case.mode == "inference":  # transformers.js alone runs it (the table): its feature-extraction pipeline
        return _inference_refusal(prepared, case)
    if prepared.spec.is_encoder_decoder and (why := _speech_refusal(prepared, runtime, case)) is not None:
        return why
    if case.batch_size != 1:
        return f"{runtime} generates one sequence at a time here (batch 1); batch {case.batch_size} was asked"
    if case.depth and (why := _depth_refusal(prepared, runtime, case, ep)) is not None:
        return why
    if table.format == "mlc":  # the folder's own weights: the case's precision names the model's other rows
        return None
    if table.format == "gguf" and case.precision not in gguf_files(prepared):
        why = getattr(prepared, "gguf_error", None) or "none was written for this model"
        return f"no GGUF of this model at {case.precision}: {why}"
    if table.format == "onnx" and case.precision not in TJS_DTYPES:
        return f"{runtime} has no file name for precision {case.precision} (it loads {', '.join(TJS_DTYPES)})"
    return None


# The model types whose graph transformers.js's feature-extraction pipeline runs as their encoder model (AutoModel:
# its MODEL_MAPPING_NAMES_ENCODER_ONLY's text encoders, fed input_ids, attention_mask and token_type_ids) and whose
# output with pooling 'none' is last_hidden_state, what the other rows of the case output
FEATURE_EXTRACTION_TYPES = ("bert", "distilbert", "roberta", "xlm-roberta", "camembert", "albert", "electra", "mpnet",
                            "mobilebert", "deberta", "deberta-v2", "roformer", "convbert", "squeezebert")  # fmt: skip


def _inference_refusal(prepared: PreparedModel, case: Case) -> str | None:
    """Why an inference case is not run on transformers.js: it runs pipeline('feature-extraction') on a text encoder
    (FEATURE_EXTRACTION_TYPES) whose one output is last_hidden_state, at a precision it has a file name for."""
    spec = prepared.spec
    what = ("transformers.js runs inference here as pipeline('feature-extraction') on a text encoder whose one output "
            f"is last_hidden_state ({', '.join(FEATURE_EXTRACTION_TYPES)})")  # fmt: skip
    if spec.is_onnx_file:
        return f"{what}; an .onnx file given alone has no config.json naming its model type (give its folder)"
    if spec.is_generative:
        return f"{what}; {spec.name} is a {spec.architecture}: its text-generation pipeline runs with --mode generate"
    if spec.inputs.kind != "text" or spec.model_type not in FEATURE_EXTRACTION_TYPES:
        return f"{what}; {spec.name} is a {spec.model_type} {spec.architecture} of {spec.inputs.kind} input"
    if tuple(spec.outputs) != ("last_hidden_state",):
        return f"{what}; {spec.name} outputs {', '.join(spec.outputs)}"
    if case.precision not in TJS_DTYPES:
        return f"transformers.js has no file name for precision {case.precision} (it loads {', '.join(TJS_DTYPES)})"
    return None


def _speech_refusal(prepared: PreparedModel, runtime: str, case: Case) -> str | None:
    """Why an encoder–decoder case is not run on `runtime`: transformers.js runs a Whisper model's speech
    generation (its automatic-speech-recognition pipeline) on the fp32 merged-decoder layout; nothing else."""
    if runtime != "transformers.js" or not prepared.spec.takes_speech:
        return (f"{runtime} is run here on decoder-only generation (transformers.js: and Whisper speech); "
                "an encoder–decoder of text runs on onnxruntime-web")  # fmt: skip
    if case.precision != "fp32":
        return f"transformers.js speech is run here on the fp32 graphs, not {case.precision}"
    if (speech := speech_graphs(prepared)) is None:
        return "transformers.js speech needs the merged decoder (onnx/decoder_model_merged.onnx); none was written"
    found = speech_config(speech)
    return found if isinstance(found, str) else None


def speech_config(speech: Seq2SeqFiles) -> tuple[bytes, int, int] | str:
    """(config.json as served, the encoder's mel bins and frames) of the folder the graphs belong to, read as data
    (inside it, bounded, typed), or why it cannot be served."""
    from harness.core.bounds import MAX_CONFIG_BYTES
    from harness.prepare.folder_checks import FolderError, read_file
    from harness.prepare.folders import folder_root

    why = "transformers.js speech needs config.json beside the graphs with num_mel_bins and max_source_positions"
    if (root := folder_root(speech.decoder)) is None:
        return why
    try:
        config = read_file(root, "config.json", MAX_CONFIG_BYTES, "config.json", "MAX_CONFIG_BYTES")
        settings = json.loads(config)
    except (FolderError, ValueError):
        return why
    bins, positions = (settings.get(k) if isinstance(settings, dict) else None
                       for k in ("num_mel_bins", "max_source_positions"))  # fmt: skip
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 16 for v in (bins, positions)):
        return why
    return config, bins, 2 * positions  # the encoder's window: two feature frames per position (its stride-2 conv)


def speech_graphs(prepared: PreparedModel) -> Seq2SeqFiles | None:
    """The fp32 encoder and merged decoder of a speech model's export (harness.prepare.merged_decoder), or None."""
    source = prepared.onnx_past_path
    return None if source is None else seq2seq_files(source.with_name(f"{DECODER_MERGED}.onnx"))


def speech_feeds(prepared: PreparedModel, feeds: dict[str, np.ndarray], seconds: int | None) -> dict[str, np.ndarray]:
    """A transformers.js speech job's inputs: the case's audio as 16 kHz float32 samples (`audio`: what the pipeline
    hears, cut as the case's features were: harness.prepare.audio.speech_features) and the features native ORT runs
    on (`input_features`), which the page compares with the pipeline's own."""
    from harness.prepare.audio import fit, speech_input, window_seconds

    features = feeds["input_features"]
    clip = fit(speech_input(prepared.spec.audio).samples, window_seconds(features.shape[-1]) if seconds is None
               else seconds)  # fmt: skip
    return {"audio": np.ascontiguousarray(clip, dtype=np.float32), "input_features": features}


def speech_tokenizer(prepared: PreparedModel) -> bytes:
    """The tokenizer.json a speech pipeline decodes with: the spec's built-in one where its toml names one (the one
    the rows' texts are decoded with: harness.prepare.spec_tokenizer), else the model folder's, else synthetic."""
    from harness.prepare.spec_tokenizer import TOKENIZER_FILE, spec_tokenizer

    if (folder := spec_tokenizer(prepared.spec)) is not None:
        return (folder / TOKENIZER_FILE).read_bytes()  # written by the harness, from the spec's own vocabulary
    return tokenizer_files(_folders(prepared), dict(prepared.spec.config))[0][TOKENIZER_FILE]


def _depth_refusal(prepared: PreparedModel, runtime: str, case: Case, ep: str = "wasm") -> str | None:
    """Why a case at --depths is not run on `runtime`: llama.cpp (wllama.mjs) fills its cache untimed as our own loop
    does, checked at fp32 against the fp32 graph after the same filler; transformers.js (transformers.mjs) a text
    generation's on wasm, checked on the very graph it ran after the same filler; nothing else here."""
    depth = f"--depths {case.depth}"
    if runtime == "transformers.js":  # its module hands generate a DynamicCache it filled untimed
        if prepared.spec.is_encoder_decoder:
            return f"{depth}: transformers.js's speech pipeline starts from its encoder's output, not a filled cache"
        if ep != "wasm":  # on the GPU, generate disposes the cache tensors it replaces: the fill cannot be reused
            return (f"{depth}: transformers.js fills its cache once per job and reuses it on wasm only (on {ep} its "
                    "generate disposes the GPU tensors of a cache it updates)")  # fmt: skip
        return None
    if RUNTIMES[runtime].format != "gguf":  # the GGUF runtime's module (wllama.mjs) alone fills a cache to a depth
        return (f"{depth}: {runtime}'s page module starts each generation from an empty KV cache (it does not carry "
                "a cache filled untimed into its generate call)")  # fmt: skip
    if prepared.spec.is_gguf_file or case.precision != "fp32":
        return (f"{depth}: llama.cpp in the page is run at a depth on the fp32 GGUF of the model's weights only, "
                "the one its tokens are checked on against the fp32 graph after the same filler")  # fmt: skip
    return None


def gguf_files(prepared: PreparedModel) -> dict[str, str]:
    """The GGUF files the prepare worker wrote of this model's weights, by harness precision."""
    return dict(getattr(prepared, "gguf_files", None) or {})


def model_config(prepared: PreparedModel) -> bytes:
    """The config.json transformers.js reads (model type, layers, heads, head size, vocabulary): the model folder's
    own where its weights came from one, else the spec's, the one the model was built from."""
    from harness.core.bounds import MAX_CONFIG_BYTES
    from harness.prepare.folder_checks import read_file

    for folder in _folders(prepared):
        if (folder / "config.json").is_file():
            return read_file(folder, "config.json", MAX_CONFIG_BYTES, "config.json", "MAX_CONFIG_BYTES")
    spec = prepared.spec
    config = {"model_type": spec.model_type, "architectures": [spec.architecture]} | dict(spec.config)
    return json.dumps(config).encode()


def _folders(prepared: PreparedModel) -> list[Path]:
    found = []
    if prepared.weights == "pretrained" and Path(prepared.weights_source).is_dir():
        found.append(Path(prepared.weights_source))
    local = prepared.spec.local_path
    if local is not None:
        found += [local] if local.is_dir() else [local.parent, local.parent.parent]  # a folder's onnx/model.onnx
    return found


def runtime_files(prepared: PreparedModel, runtime: str, case: Case, model: Path,
                  folder: Path | None = None) -> tuple[dict[str, Any], str]:  # fmt: skip
    """(the files the runtime's job serves, by name; the name of the one its job's model_url points at): for
    transformers.js its folder (config.json, generation_config.json, its tokenizer (harness.browser.runtime_tokenizer),
    onnx/<the precision's file name>: the graph
    `model` native ORT runs, its cache inputs and outputs named as transformers.js reads them), for llama.cpp the
    GGUF of the case's precision, for WebLLM its folder (`folder`: its weights' files in mlc/, the
    model library beside them)."""
    if RUNTIMES[runtime].format == "mlc":
        from harness.prepare.mlc_folder import read_mlc_folder

        assert folder is not None  # runtime_refusal refused a webllm case without one
        mlc = read_mlc_folder(folder)  # checked again: the files served are the files checked
        return dict(mlc.files), mlc.library
    if RUNTIMES[runtime].format == "gguf":
        gguf = served_gguf(Path(gguf_files(prepared)[case.precision]))
        return {gguf.name: gguf}, gguf.name
    if (speech := speech_graphs(prepared) if prepared.spec.takes_speech else None) is not None:
        found = speech_config(speech)
        assert not isinstance(found, str)  # runtime_refusal refused a speech case without it
        return speech_folder(speech.encoder, speech.decoder, found[0], speech_tokenizer(prepared), *found[1:]), (
            f"onnx/{DECODER_MERGED}.onnx"
        )
    onnx = f"onnx/{TJS_FILES[case.precision]}"
    generation = json.dumps({"do_sample": False}).encode()  # transformers.js asks for it (a 404 is logged)
    tokenizer, _ = tokenizer_files(_folders(prepared), dict(prepared.spec.config))  # its pipeline's tokenizer
    return {"config.json": model_config(prepared), "generation_config.json": generation, **tokenizer,
            onnx: transformers_js_graph(model)}, onnx  # fmt: skip


def speech_folder(encoder: Path, decoder: Path, config: bytes, tokenizer: bytes, mel_bins: int,
                  frames: int) -> dict[str, Any]:  # fmt: skip
    """A Whisper model as transformers.js's automatic-speech-recognition pipeline loads it: config.json, the
    feature extractor's preprocessor_config.json (the one harness.prepare.audio.log_mel builds: the pipeline
    computes its features from the samples), a WhisperTokenizer over `tokenizer` (its ASR decoding is that class's),
    a generation config with no language, task or timestamp token (its decoder starts from the start token alone,
    as native ORT's loop does), and onnx/encoder_model.onnx + onnx/decoder_model_merged.onnx (the merged decoder of
    harness.prepare.merged_decoder, its batch dimension named as transformers.js reads it)."""
    from transformers import WhisperFeatureExtractor

    from harness.prepare.audio import HOP_LENGTH, N_FFT, SAMPLING_RATE

    extractor = WhisperFeatureExtractor(feature_size=mel_bins, sampling_rate=SAMPLING_RATE, hop_length=HOP_LENGTH,
                                        chunk_length=frames * HOP_LENGTH // SAMPLING_RATE, n_fft=N_FFT)  # fmt: skip
    settings = json.loads(config)
    generation = {key: settings[key] for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id")
                  if isinstance(settings.get(key), int)}  # fmt: skip
    return {"config.json": config, "generation_config.json": json.dumps(generation).encode(),
            "preprocessor_config.json": extractor.to_json_string().encode(), "tokenizer.json": tokenizer,
            "tokenizer_config.json": json.dumps({"tokenizer_class": "WhisperTokenizer"}).encode(),
            "onnx/encoder_model.onnx": encoder,
            "onnx/decoder_model_merged.onnx": transformers_js_graph(decoder)}  # fmt: skip


# Optimum's cache names, which transformers.js reads (the harness's export names them past_key_0, present_value_1)
_OPTIMUM_NAMES = (("past_{}_", "past_key_values.{}.{}"), ("present_{}_", "present.{}.{}"))


def optimum_names(names: list[str]) -> dict[str, str]:
    """Each of a graph's cache input and output names that transformers.js reads otherwise, and its name there."""
    renames = {}
    for name in names:
        for kind in ("key", "value"):
            for ours, theirs in _OPTIMUM_NAMES:
                prefix = ours.format(kind)
                if name.startswith(prefix) and name[len(prefix) :].isdigit():
                    renames[name] = theirs.format(name[len(prefix) :], kind)
    return renames


# transformers.js (4.x, addPastKeyValues) makes the first step's empty cache from the session's input metadata: a
# symbolic dimension named `batch_size` is the prompt's batch, any other symbol 0. The export names it `batch`, so
# the cache would come as [0, heads, 0, head size]: a graph that reads its batch off a cache input (the dynamo
# export of real SmolLM2 does, Shape(past_key_values.23.value)[0]) then reshapes the prompt to batch 0
# (Reshape allowzero=1: "{1,5,192} to {0,5,-1,64}"). The copy names that dimension as Optimum does.
_OPTIMUM_DIMS = {"batch": "batch_size"}
# The copy's name; a new one whenever what the copy changes does (the copy is made once, by this name)
_TJS_COPY = "tjs2"


def optimum_dims(graph: Any) -> dict[str, str]:
    """The symbolic dimensions of a graph's inputs and outputs that transformers.js resolves by Optimum's name only,
    and that name (none where the graph uses that name already)."""
    values = [*graph.input, *graph.output, *graph.value_info]
    used = {d.dim_param for v in values for d in v.type.tensor_type.shape.dim if d.dim_param}
    return {ours: theirs for ours, theirs in _OPTIMUM_DIMS.items() if ours in used and theirs not in used}


def transformers_js_graph(model: Path) -> Path:
    """The graph as transformers.js loads it: `model` itself where its cache names and batch dimension are
    Optimum's already, else a copy beside it (`<stem>-tjs2.onnx`, made once) whose cache inputs and outputs carry
    Optimum's names and whose batch dimension is `batch_size`: the same nodes and weights (its external data, if
    any, is the original's, found by the same relative names)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False)
    renames = optimum_names([v.name for v in [*graph.graph.input, *graph.graph.output]])
    dims = optimum_dims(graph.graph)
    if not renames and not dims:
        return model
    renamed = model.with_name(f"{model.stem}-{_TJS_COPY}.onnx")
    if renamed.is_file() and renamed.stat().st_mtime >= model.stat().st_mtime:
        return renamed
    for value in [*graph.graph.input, *graph.graph.output]:
        value.name = renames.get(value.name, value.name)
    for value in [*graph.graph.input, *graph.graph.output, *graph.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in dims:
                dim.dim_param = dims[dim.dim_param]
    for node in graph.graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    staging = renamed.with_name(f"{renamed.name}.{os.getpid()}.tmp")
    onnx.save(graph, str(staging))
    os.replace(staging, renamed)
    return renamed


def gguf_generate_job(prepared: PreparedModel, case: Case) -> GenerateJob:
    """The generation part of a page job on a GGUF given as the model: its vocabulary from the file's header (no
    ONNX graph states one), the EOS ids it stops at, each step's top-k (llama.cpp's log-probabilities)."""
    assert case.new_tokens is not None
    vocab = int(prepared.spec.config["vocab_size"])
    return GenerateJob(new_tokens=case.new_tokens, vocab_size=vocab, past_shape=None, session_options=None,
                       depth=case.depth or 0, eos_ids=list(prepared.eos), top_k=min(STEP_TOP_K, vocab))  # fmt: skip


def runtime_fields(runtime: str, case: Case) -> dict[str, Any]:
    """The job's runtime fields beside its model URL (web/page_job.py's PageJob)."""
    fields: dict[str, Any] = {"runtime": runtime}
    if RUNTIMES[runtime].format == "onnx" and runtime != OWN_RUNTIME:
        fields["runtime_dtype"] = TJS_DTYPES[case.precision]
    return fields


def runtime_details(runtime: str) -> dict[str, Any]:
    """What every row of a page runtime says of it before the page answers (the page adds its versions)."""
    table = RUNTIMES[runtime]
    return {"page_runtime": runtime, "page_runtime_package": table.package, "page_runtime_format": table.format,
            "page_runtime_check": table.check}  # fmt: skip


def work_file(prepared: PreparedModel, runtime: str, case: Case, model: Path) -> Path:
    """The file a row's work per token is counted on: the one the runtime ran. llama.cpp's is the GGUF (given as the
    model, or written from it at the case's precision: its own quantization, not the ONNX graph's), counted from its
    tensors (harness.prepare.gguf_file.gguf_generation_work); every other runtime's the ONNX graph it ran."""
    if RUNTIMES[runtime].format == "gguf" and not prepared.spec.is_gguf_file:
        return Path(gguf_files(prepared)[case.precision])
    return model


def runtime_model(prepared: PreparedModel, runtime: str, case: Case, model: Path,
                  folder: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """What a row of another page runtime says of the file it ran: transformers.js the same ONNX graph native ORT
    runs (its name in the folder it was served as); llama.cpp the GGUF (its work per token counted on it: work_file)."""
    if runtime == OWN_RUNTIME:
        return {}
    if RUNTIMES[runtime].format == "mlc" and folder is not None:  # WebLLM's own folder: what it holds
        from harness.prepare.mlc_folder import read_mlc_folder

        return read_mlc_folder(folder).facts | {"webllm_model_folder": folder.name}
    if prepared.spec.is_gguf_file:  # the GGUF given as the model: no ONNX graph to count its work on
        return {"model_file": model.name, "model_bytes": model.stat().st_size}
    if RUNTIMES[runtime].format == "gguf":
        gguf = Path(gguf_files(prepared)[case.precision])
        return {"model_file": gguf.name, "model_bytes": gguf.stat().st_size}
    if prepared.spec.is_encoder_decoder and (speech := speech_graphs(prepared)) is not None:  # refused otherwise
        return {"model_file": speech.label(), "served_as": f"onnx/encoder_model.onnx + onnx/{DECODER_MERGED}.onnx",
                "pipeline_task": "automatic-speech-recognition"}  # fmt: skip
    _, tokenizer = tokenizer_files(_folders(prepared), dict(prepared.spec.config))
    served = {"model_file": model.name, "served_as": f"onnx/{TJS_FILES[case.precision]}", "tokenizer_served": tokenizer}
    if case.mode == "inference":  # web/page/runtimes/transformers.mjs's infer(): its output unpooled
        served |= {"pipeline_task": "feature-extraction", "pooling": "none (last_hidden_state)"}
    return served


def gguf_precisions(runtimes: list[str], cases: list[Case]) -> tuple[str, ...]:
    """The precisions the prepare worker writes a GGUF at for a browser run: its generate cases' where a page runtime
    that loads a GGUF (llama.cpp through wllama) is asked for."""
    if not any(RUNTIMES[name].format == "gguf" for name in runtimes):
        return ()
    return tuple(dict.fromkeys(case.precision for case in cases if case.mode == "generate"))


def served_gguf(gguf: Path) -> Path:
    """The GGUF the page is served: itself, or under the faults hook's planted weight (harness.browser.generate's
    SCALED_WEIGHT_FAULT, the same one an ONNX graph gets) a copy with its largest F32 weight matrix scaled by the
    same factor, while the row is checked against the fp32 graph of the unscaled weights: the check must see it."""
    from harness.browser.generate import SCALED_WEIGHT_FACTOR, SCALED_WEIGHT_FAULT
    from harness.core.faults import injected_faults

    if SCALED_WEIGHT_FAULT not in injected_faults():
        return gguf
    import shutil

    from gguf import GGMLQuantizationType, GGUFReader

    if not any(t.tensor_type == GGMLQuantizationType.F32 and len(t.shape) == 2 for t in GGUFReader(gguf).tensors):
        return gguf  # a quantized GGUF's weights: its row is quality, not a check a planted weight must fail
    scaled = gguf.with_name(f"{gguf.stem}-scaled{gguf.suffix}")
    shutil.copyfile(gguf, scaled)
    reader = GGUFReader(scaled, "r+")
    weights = [t for t in reader.tensors if t.tensor_type == GGMLQuantizationType.F32 and len(t.shape) == 2]
    largest = max(weights, key=lambda t: int(t.n_elements))
    largest.data[...] = largest.data * SCALED_WEIGHT_FACTOR
    reader.data.flush()
    return scaled
