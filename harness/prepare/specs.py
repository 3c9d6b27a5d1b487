"""Declarative model specs: models/*.toml (and --model-path) → ModelSpec.

A spec file describes one architecture with a `base` variant (the real model's dimensions) and
a `tiny` variant (overrides for fast runs). Each variant is a separately named model. A decoder may add a
`small` variant (overrides too, random weights, a few to tens of MB): a size between where a step's fixed
cost and where its bytes dominate, for predicting generation (harness.analysis.roofline_predict); it is run
by name only, never by --small-models nor by default.
"""

from __future__ import annotations

import copy
import json
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from harness.core.bounds import MAX_CONFIG_BYTES
from harness.prepare.folder_layouts import seq2seq_decoder

FAMILIES = ("embedding", "text_generation", "vision", "audio", "multimodal")
# How inputs are generated (harness/prepare/inputs.py): token ids, images, waveforms, log-mel features,
# encoder-decoder token pairs, videos, and images spliced into a decoder's tokens.
INPUT_KINDS = (
    "text",
    "vision",
    "audio",
    "text+vision",
    "seq2seq",
    "audio-features",
    "video+text",
    "image+text-generation",
    "onnx-signature",
)
NO_SEQUENCE_KINDS = ("vision", "audio")  # kinds whose inputs have no token axis
SEQ2SEQ_KINDS = ("seq2seq", "audio-features")  # the encoder–decoder kinds that generate on ONNX Runtime
VARIANTS = ("base", "tiny", "small")
SPEC_TOKENIZERS = ("passage-words",)  # the tokenizers a spec's variant may name (harness.prepare.spec_tokenizer)


class SpecError(ValueError):
    """A spec or model selection that cannot be used; the message says what is valid."""


@dataclass(frozen=True)
class InputSpec:
    kind: str
    text_inputs: tuple[str, ...] = ()
    audio_seconds: float = 1.0
    sampling_rate: int = 16000
    extra_inputs: tuple[str, ...] = ()  # model-specific inputs, e.g. CLAP's is_longer, LLaVA-NeXT's image_sizes
    image_size: int | None = None  # for configs without an image_size (ResNet, DETR)
    audio_frames: int | None = None  # log-mel frames for CLAP-style features (Whisper's come from its config)
    image_aspect: tuple[int, int] = (1, 1)  # LLaVA-NeXT image height, width in vision-tower resolutions

    @property
    def uses_sequence(self) -> bool:
        return self.kind not in NO_SEQUENCE_KINDS

    def fingerprint(self) -> dict[str, Any]:
        """The fields that affect inputs; fields left at their defaults are omitted so adding a
        field does not change every existing export's cache key."""
        defaults = InputSpec(kind=self.kind)
        return {k: v for k, v in self.__dict__.items() if k in LEGACY_INPUT_FIELDS or v != getattr(defaults, k)}


LEGACY_INPUT_FIELDS = ("kind", "text_inputs", "audio_seconds", "sampling_rate")
ASKED = "asked"  # an .onnx file's sequence axis is symbolic: cases take the request's lengths


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarkable model: an architecture and config, or a local directory / ONNX file."""

    name: str
    family: str
    variant: str
    model_type: str
    architecture: str
    outputs: tuple[str, ...]
    inputs: InputSpec
    config: dict[str, Any] = field(default_factory=dict)
    pretrained_id: str | None = None
    # An installed Python package that ships the weights: its import name and the directory inside it.
    pretrained_package: str | None = None
    pretrained_package_path: str = ""
    local_path: Path | None = None  # an HF model directory or an .onnx file given by --model-path
    source: str = ""
    # An .onnx file's own shapes (onnx_axes): its fixed batch (None: symbolic, the request's), and its
    # sequence: ASKED (a symbolic axis: the request's lengths), a fixed length, or None (no such axis).
    file_batch: int | None = None
    file_seq: int | str | None = ASKED
    # the prompt's token ids where the run gives one (--prompt, --chat, --prompt-ids: harness.prepare.prompts):
    # every case's input_ids, its length the sequence length; None: a prompt drawn per case. Not in the
    # fingerprint: one export serves every prompt.
    prompt: tuple[int, ...] | None = None
    # the WAV a speech model's input is cut from where the run gives one (--audio: harness.prepare.audio); None:
    # espeak-ng's passage. Not in the fingerprint: one export serves every clip.
    audio: Path | None = None
    # the user's transcript of that WAV (--transcript: harness.prepare.wer), what its rows' WER is measured against;
    # None: espeak-ng's passage where that is what the model hears, else no WER. Not in the fingerprint either.
    transcript: Path | None = None
    # a built-in tokenizer the spec's toml names (SPEC_TOKENIZERS: harness.prepare.spec_tokenizer makes it offline):
    # a random tiny spec's tokens then decode to text (a speech row's WER). Not in the fingerprint: the graph's same.
    tokenizer: str | None = None

    def case_shapes(self, batch_sizes: list[int], sequence_lengths: list[int]) -> list[tuple[int, int | None]]:
        """The (batch, seq) cases the request's sizes become for this model: an .onnx file with fixed
        shapes has one, labelled by its real shapes whatever sizes were asked for."""
        seqs: list[int | None] = list(sequence_lengths) if self.inputs.uses_sequence else [None]
        if self.prompt is not None and self.inputs.uses_sequence:
            seqs = [len(self.prompt)]  # a given prompt is the sequence
        if self.file_seq != ASKED:
            seqs = [self.file_seq]  # type: ignore[list-item]
        batches = [self.file_batch] if self.file_batch is not None else list(batch_sizes)
        return [(b, s) for b in batches for s in seqs]

    @property
    def is_generative(self) -> bool:
        """Architectures with a language-model head that transformers' generate() can drive, and a GGUF's decoder."""
        heads = ("LMHeadModel", "ForCausalLM", "ForConditionalGeneration")
        return self.is_gguf_file or self.architecture.endswith(heads)

    @property
    def has_past_export(self) -> bool:
        """Decoder-only LMs (GPT-2, LLaMA, Qwen2) get an ONNX export with past key/values, encoder–decoders
        (T5, Whisper) an encoder and decoders with both caches: ONNX Runtime generates with a KV-cache loop
        (harness.prepare.export_past, harness.prepare.export_seq2seq)."""
        return not self.is_onnx_file and (self.architecture.endswith(("LMHeadModel", "ForCausalLM")) or self.is_seq2seq)

    @property
    def is_seq2seq(self) -> bool:
        """An encoder–decoder with an LM head whose encoder reads tokens (T5) or log-mel features (Whisper)."""
        return self.architecture.endswith("ForConditionalGeneration") and self.inputs.kind in SEQ2SEQ_KINDS

    @property
    def takes_speech(self) -> bool:
        """An encoder–decoder whose encoder reads log-mel features of speech (Whisper, or a folder's layout whose
        encoder takes them): its input is cut from a spoken passage or a given WAV (harness.prepare.audio), its
        length a generation axis (--audio-seconds)."""
        if self.is_onnx_file:
            from harness.prepare.audio import takes_log_mel

            return self.is_encoder_decoder and takes_log_mel(Path(str(self.local_path)))
        return self.is_seq2seq and self.inputs.kind == "audio-features"

    @property
    def is_encoder_decoder(self) -> bool:
        """An encoder–decoder that generates on ONNX graphs: T5, Whisper, or a folder's layout given by
        --model-path (its graph the encoder, a decoder beside it): the models a per-graph precision names."""
        return self.is_seq2seq or (self.is_onnx_file and seq2seq_decoder(self.local_path) is not None)

    @property
    def context_length(self) -> int | None:
        """The most positions (prompt + generated tokens) the model takes, where its config says."""
        found = (self.config.get(key) for key in ("max_position_embeddings", "n_positions", "n_ctx"))
        return next((value for value in found if isinstance(value, int) and value > 0), None)

    @property
    def is_onnx_file(self) -> bool:
        return self.local_path is not None and self.local_path.suffix == ".onnx"

    @property
    def is_gguf_file(self) -> bool:
        """A GGUF given as the model (--model-path x.gguf): llama.cpp runs it, natively and in the page."""
        return self.local_path is not None and self.local_path.suffix == ".gguf" and self.architecture == "gguf"

    def fingerprint(self) -> str:
        """Everything that determines the module's graph and weights, as canonical JSON."""
        return json.dumps(
            {
                "name": self.name,
                "architecture": self.architecture,
                "model_type": self.model_type,
                "config": self.config,
                "outputs": self.outputs,
                "inputs": self.inputs.fingerprint(),
                "local_path": str(self.local_path) if self.local_path else None,
            },
            sort_keys=True,
        )


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _require(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise SpecError(f"{where}: missing key '{key}'")
    return table[key]


def _parse_inputs(table: dict[str, Any], where: str) -> InputSpec:
    kind = _require(table, "kind", f"{where} [inputs]")
    if kind not in INPUT_KINDS[:-1]:
        raise SpecError(f"{where}: inputs.kind '{kind}' is not one of {', '.join(INPUT_KINDS[:-1])}")
    return InputSpec(
        kind=kind,
        text_inputs=tuple(table.get("text_inputs", ())),
        audio_seconds=float(table.get("audio_seconds", 1.0)),
        sampling_rate=int(table.get("sampling_rate", 16000)),
        extra_inputs=tuple(table.get("extra_inputs", ())),
        image_size=table.get("image_size"),
        audio_frames=table.get("audio_frames"),
        image_aspect=tuple(table.get("image_aspect", (1, 1))),
    )


def parse_spec_file(path: Path, text: str) -> list[ModelSpec]:
    """Parse one spec file into its base, tiny and small ModelSpecs."""
    where = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where}: not valid TOML ({exc})") from exc
    family = _require(data, "family", where)
    if family not in FAMILIES:
        raise SpecError(f"{where}: family '{family}' is not one of {', '.join(FAMILIES)}")
    inputs_table = _require(data, "inputs", where)
    _parse_inputs(inputs_table, where)  # report a bad [inputs] table even without a tiny variant
    base = _require(data, "base", where)
    specs = []
    for variant in VARIANTS:
        table = data.get(variant)
        if table is None:
            continue
        config = base.get("config", {})
        if variant != "base":
            config = _deep_merge(config, table.get("config", {}))
        specs.append(
            ModelSpec(
                name=_require(table, "name", f"{where} [{variant}]"),
                family=family,
                variant=variant,
                model_type=_require(data, "model_type", where),
                architecture=_require(data, "architecture", where),
                outputs=tuple(_require(data, "outputs", where)),
                # A variant may override input fields, e.g. a tiny model's smaller image.
                inputs=_parse_inputs(inputs_table | table.get("inputs", {}), f"{where} [{variant}]"),
                config=config,
                # Pretrained weights only match the dimensions they were trained with.
                pretrained_id=table.get("pretrained_id"),
                pretrained_package=table.get("pretrained_package"),
                pretrained_package_path=table.get("pretrained_package_path", ""),
                source=where,
                tokenizer=_spec_tokenizer(table, f"{where} [{variant}]"),
            )
        )
    return specs


def _spec_tokenizer(table: dict[str, Any], where: str) -> str | None:
    name = table.get("tokenizer")
    if name is not None and name not in SPEC_TOKENIZERS:
        raise SpecError(f"{where}: tokenizer '{name}' is not one of {', '.join(SPEC_TOKENIZERS)}")
    return name


def load_specs() -> dict[str, ModelSpec]:
    """Every spec shipped in models/, keyed by model name."""
    specs: dict[str, ModelSpec] = {}
    for entry in sorted(resources.files("harness.models").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            for spec in parse_spec_file(Path(entry.name), entry.read_text()):
                specs[spec.name] = spec
    return specs


def spec_from_path(path: Path, family: str | None) -> ModelSpec:
    """A spec for --model-path: an .onnx file, a GGUF (llama.cpp's file: harness.prepare.gguf_file), a folder of ONNX
    files (onnxruntime-genai, transformers.js, optimum: harness.prepare.folders), or an HF model directory
    (config.json [+ weights])."""
    from harness.prepare.folder_checks import FolderError, check_external_data, check_folder_files, refuse_special
    from harness.prepare.folders import folder_graph, folder_root

    if not path.exists():
        raise SpecError(f"--model-path {path}: no such file or directory")
    if path.suffix == ".gguf" and not path.is_dir():  # llama.cpp's file: its header read as data, bounded
        return _gguf_file_spec(path, family)
    try:
        if not path.is_dir():
            refuse_special(path)  # a FIFO given as the model would block its read for good
        # the configs and tokenizer files of the folder the model is read from: a FIFO among them refused now,
        # not waited on by a worker
        if (root := path if path.is_dir() else folder_root(path)) is not None:
            check_folder_files(root)
        if path.is_file():
            if path.suffix != ".onnx":
                raise SpecError(f"--model-path {path}: expected an .onnx file, a .gguf file or a model folder")
            check_external_data(path, path.parent)  # a lone file's weights stay in its own folder too
            return _onnx_file_spec(path, path.stem, family)
        graph = folder_graph(path)
    except FolderError as exc:
        raise SpecError(f"--model-path {path}: {exc}") from exc
    if graph is not None:
        return _onnx_file_spec(graph, path.resolve().name, family)
    return _checkpoint_spec(path, family)


def _onnx_file_spec(path: Path, name: str, family: str | None) -> ModelSpec:
    check_onnx_file(path)
    file_batch, file_seq = onnx_axes(path)
    return ModelSpec(
        name=name,
        family=family or graph_family(path),
        variant="file",
        model_type="onnx",
        architecture="onnx",
        outputs=(),
        inputs=InputSpec(kind="onnx-signature"),
        local_path=path.resolve(),
        source=str(path),
        file_batch=file_batch,
        file_seq=file_seq,
    )


def _gguf_file_spec(path: Path, family: str | None) -> ModelSpec:
    """A GGUF given as the model (harness.prepare.gguf_file): its header checked before a run exists; its context,
    vocabulary, BOS and EOS in the spec's config, where the run's checks read a model's."""
    from harness.prepare.gguf_file import PRECISIONS, GgufError, read_gguf

    try:
        facts = read_gguf(path)
    except GgufError as exc:
        raise SpecError(f"--model-path {path}: refused as a GGUF: {exc}") from exc
    if facts.precision is None:
        raise SpecError(f"--model-path {path}: its weights are {facts.quantization}, which no harness precision "
                        f"names (taken: {', '.join(PRECISIONS)})")  # fmt: skip
    config = {"max_position_embeddings": facts.context_length, "vocab_size": facts.vocab_size,
              "bos_token_id": facts.bos, "eos_token_id": facts.eos}  # fmt: skip
    return ModelSpec(name=path.stem, family=family or "text_generation", variant="file", model_type="gguf",
                     architecture="gguf", outputs=(), inputs=InputSpec(kind="text"), config=config,
                     local_path=path.resolve(), source=str(path))  # fmt: skip


def graph_family(graph: Path) -> str:
    """The family a graph's rows are filed under (no --model-families): its folder's own model_type (config.json's,
    else genai_config.json's model.type) as the built-in spec of that type files it; else a graph that runs the
    KV-cache loop (greedy.onnx_takes_past: a decoder that generates) text_generation; else embedding. Every folder
    was embedding: a Llama folder's generate rows sat among the embedding models, and `--model-families
    text_generation` left them out."""
    from harness.prepare.folders import folder_root

    root = folder_root(graph)
    model_type = _folder_model_type(root) if root is not None else None
    template = next((s for s in load_specs().values() if s.model_type == model_type), None)
    if template is not None:
        return template.family
    from harness.prepare.greedy import onnx_takes_past  # the one definition of a graph that runs the KV-cache loop

    return "text_generation" if onnx_takes_past(graph) else "embedding"


def _folder_model_type(folder: Path) -> str | None:
    """config.json's model_type, else genai_config.json's model.type; None where neither says or can be read (a
    file beside a broken config keeps the graph's own signs: its layout's configs were checked when found)."""
    from harness.prepare.folder_checks import FolderError, read_config

    for name, keys in (("config.json", ("model_type",)), ("genai_config.json", ("model", "type"))):
        if not (folder / name).is_file():
            continue
        try:
            value: Any = read_config(folder, name)
        except FolderError:
            continue
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str):
            return value
    return None


def _checkpoint_spec(path: Path, family: str | None) -> ModelSpec:
    from harness.prepare.folder_checks import FolderError, read_file, size_problem

    try:  # the one reader of a folder's files: inside it, a regular file, bounded before it is read
        raw = read_file(path, "config.json", MAX_CONFIG_BYTES, "the config file config.json", "a config takes")
    except FolderError as exc:
        raise SpecError(f"--model-path {path}: {exc}") from exc
    try:
        config = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or bytes that are not UTF-8
        raise SpecError(f"--model-path {path}: cannot read config.json ({exc})") from exc
    if not isinstance(config, dict):
        raise SpecError(f"--model-path {path}: config.json must hold a JSON object, got {type(config).__name__}")
    if problem := config_type_error(config):
        raise SpecError(f"--model-path {path}: config.json {problem}")
    if problem := size_problem(config, "config.json"):  # bounded before a model of those sizes is built
        raise SpecError(f"--model-path {path}: {problem}")
    model_type = config.get("model_type")
    template = next((s for s in load_specs().values() if s.model_type == model_type), None)
    if template is None:
        known = sorted({s.model_type for s in load_specs().values()})
        raise SpecError(
            f"--model-path {path}: model_type '{model_type}' has no spec to take inputs and outputs from; "
            f"known model types: {', '.join(known)} (or pass an .onnx file)"
        )
    return ModelSpec(
        name=path.name,
        family=family or template.family,
        variant="local",
        model_type=model_type,
        architecture=template.architecture,
        outputs=template.outputs,
        inputs=template.inputs,
        config={},
        local_path=path.resolve(),
        source=str(path),
    )


# The config.json keys that size a model, by the JSON type transformers needs: a wrong type ("hidden_size":
# "big") is refused before a run exists, instead of failing every case in the worker. Sub-configs
# (text_config, vision_config, …) are checked alike.
INTEGER_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                       "intermediate_size", "max_position_embeddings", "type_vocab_size", "head_dim", "n_embd",
                       "n_layer", "n_head", "n_positions", "n_ctx", "n_inner", "d_model", "d_ff", "d_kv",
                       "num_layers", "num_heads", "num_decoder_layers", "encoder_layers", "decoder_layers",
                       "num_channels", "projection_dim")  # fmt: skip
NUMBER_CONFIG_KEYS = ("layer_norm_eps", "rms_norm_eps", "initializer_range", "hidden_dropout_prob",
                      "attention_probs_dropout_prob", "rope_theta")  # fmt: skip
CONFIG_KEY_TYPES = dict.fromkeys(INTEGER_CONFIG_KEYS, (int,)) | dict.fromkeys(NUMBER_CONFIG_KEYS, (int, float))


def config_type_error(config: dict[str, Any], where: str = "") -> str | None:
    """What is wrong with the types of a config.json's sizing keys ("key 'hidden_size' must be …"), or None."""
    for key, value in config.items():
        expected = CONFIG_KEY_TYPES.get(key)
        if expected and not _sized_as(value, expected):
            kind = "an integer" if expected == (int,) else "a number"
            return f"key '{where}{key}' must be {kind}, got {type(value).__name__} {json.dumps(value)[:80]}"
        if key.endswith("_config") and isinstance(value, dict) and (problem := config_type_error(value, f"{key}.")):
            return problem
    return None


def _sized_as(value: Any, expected: tuple[type, ...]) -> bool:
    """null (the default), a number of the expected type (a bool is none), or a list of them (per-stage
    sizes, as CLAP's audio encoder has)."""
    values = value if isinstance(value, list) else [value]
    return value is None or all(isinstance(v, expected) and not isinstance(v, bool) for v in values)


def onnx_axes(path: Path) -> tuple[int | None, int | str | None]:
    """(batch, sequence) of an .onnx file's inputs, as ModelSpec.file_batch / file_seq hold them: the
    batch is fixed when every input's first axis is; the sequence follows any symbolic later axis
    (ASKED), else the length of a token-id input ([batch, seq] integers), else None (no such axis)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}
    inputs = [value.type.tensor_type for value in graph.input if value.name not in weights]
    shapes = [[d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] for t in inputs]
    firsts = [shape[0] for shape in shapes if shape]
    batch = firsts[0] if firsts and all(first is not None for first in firsts) else None
    if any(None in shape[1:] for shape in shapes):
        return batch, ASKED
    integer = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    ids = [shape for t, shape in zip(inputs, shapes, strict=True) if t.elem_type in integer and len(shape) == 2]
    return batch, ids[0][1] if ids else None


def check_onnx_file(path: Path) -> None:
    """Refuse a file that is not an ONNX model (truncated, empty, another format) before a run
    exists. onnx's checker reads the file itself (models over 2 GB, external data) and checks
    the graph's structure; operators it has no schema for (custom domains) are left to the engines."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, OSError) as exc:  # also raised for bytes that are not a protobuf
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if first.startswith("No Op registered for"):  # an ONNX Runtime operator (the genai builder's
            return  # SimplifiedLayerNormalization) in the default domain: the engines say whether they run it
        raise SpecError(f"--model-path {path} is not a valid ONNX model (onnx.checker: {first})") from exc


def check_families(families: list[str] | None) -> None:
    for family in families or []:
        if family not in FAMILIES:
            raise SpecError(f"unknown model family '{family}'; valid: {', '.join(FAMILIES)}")


def select_specs(names: list[str] | None, families: list[str] | None, small: bool) -> list[ModelSpec]:
    """Resolve --model / --model-families / --small-models into specs, or raise SpecError."""
    specs = load_specs()
    check_families(families)
    if names:
        unknown = [n for n in names if n not in specs]
        if unknown:
            raise SpecError(f"unknown model '{unknown[0]}'; valid: {', '.join(sorted(specs))}")
        chosen = [specs[n] for n in names]
    else:
        variant = "tiny" if small else "base"
        chosen = [s for s in specs.values() if s.variant == variant]
    if families:
        chosen = [s for s in chosen if s.family in families]
    return chosen
