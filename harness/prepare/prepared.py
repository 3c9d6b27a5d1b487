"""Prepare a model once per run, in a worker: module → ONNX (cached) → inputs + reference outputs.

Each (batch, seq) case gets one .npz holding its inputs and the reference outputs, so every
backend — native or browser — runs on identical tensors and is checked against the same
reference: torch fp32 for spec models, ONNX Runtime CPU for plain .onnx files.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from harness.core.failures import classify
from harness.core.records import Case, Result, Target, UnsupportedError
from harness.prepare.specs import ModelSpec

if TYPE_CHECKING:  # harness.prepare.export imports torch: workers that only run ORT/OpenVINO never need it
    from harness.prepare.export import ExportOutcome
    from harness.prepare.greedy import Greedy
    from harness.prepare.perplexity import Passage
    from harness.prepare.weights import Weights
    from harness.prepare.wer import Reference

CaseShape = tuple[int, int | None]  # (batch, seq)
MODEL_FACTS = "model.json"  # in a case directory: the module's facts a warm-cache prepare needs
NOT_EXPORTED = "not exported: every case that loads an ONNX file generates from the export with past key/values"


@dataclass
class PreparedModel:
    spec: ModelSpec
    weights: str  # pretrained | random
    weights_source: str
    onnx_path: Path | None
    onnx_error: str | None
    reference: str  # what produced the reference outputs
    parameters: int | None
    export: dict[str, Any] = field(default_factory=dict)
    case_files: dict[CaseShape, Path] = field(default_factory=dict)
    skipped: dict[CaseShape, str] = field(default_factory=dict)  # case → why it cannot run
    # case → (status, why) when its inputs or reference outputs could not be made: that case fails alone
    failed: dict[CaseShape, tuple[str, str]] = field(default_factory=dict)
    onnx_past_path: Path | None = None  # the export with past key/values, for ONNX generation
    onnx_past_error: str | None = None  # why there is none when it was asked for
    output_names: tuple[str, ...] = ()  # the reference outputs' names, in order (parity messages name them)
    # inference on the export with past (onnx_path is it; inference_on_past): each case's inputs as that graph
    # takes them (a past of length 0) and torch's outputs for them, beside case_files (the module's own case)
    prefill_files: dict[CaseShape, Path] = field(default_factory=dict)
    # generate in the browser: native ORT's greedy generation per (case, new tokens, depth), the tokens checked against
    generation_files: dict[tuple[CaseShape, int, int], Path] = field(default_factory=dict)
    eos: tuple[int, ...] = ()  # the ids generation stops at (--stop-at-eos and the model states some), else ()
    eos_asked: bool = False  # --stop-at-eos
    # speech (Whisper): what its audio is cut from, that audio's own seconds and the encoder's window in seconds
    # (harness.prepare.audio), and each (case, --audio-seconds) length's input_features, cut from it
    speech: tuple[str, float, float] | None = None
    # the text that speech speaks, a row's WER is measured against (harness.prepare.wer: the passage, a transcript)
    speech_reference: Reference | None = None
    audio_files: dict[tuple[CaseShape, int], Path] = field(default_factory=dict)
    # GGUFs of the weights (PrepareJob.gguf_precisions: llama.cpp runs them): harness precision → absolute path,
    # each one's writer facts (harness.prepare.gguf_export), and why some asked for are missing (None: all written)
    gguf_files: dict[str, str] = field(default_factory=dict)
    gguf_facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    gguf_error: str | None = None
    # the passage every generate row's perplexity is measured on, with the fp32 reference over it (harness.prepare.
    # perplexity): made where the model generates on an ONNX graph with past; None where it was not made
    passage: Passage | None = None
    # the fp32 graph every generate row's quality is held against: its own, or --reference-model's export; None: none
    fp32_reference: Path | None = None
    # what every row says of a model file from elsewhere: a GGUF's name, SHA-256 and header (harness.prepare.gguf_model)
    facts: dict[str, Any] = field(default_factory=dict)

    def text_fields(self, input_ids: np.ndarray | None, generated: list[list[int]] | None,
                    details: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        """A generate row's prompt ids, decoded output text and EOS policy (harness.prepare.prompts). Speech
        (`input_ids` None: Whisper hears input_features) has no prompt ids, but its tokens are text all the same:
        skipping the decode for it stored a NULL output_text beside the folder's tokenizer."""
        from harness.prepare.prompts import text_fields

        prompt = np.zeros((0, 0), dtype=np.int64) if input_ids is None else input_ids
        fields = text_fields(self.spec, prompt, generated, self.eos, self.eos_asked, details)
        if self.speech_reference is not None:  # speech: its word error rate, on every engine's row alike
            from harness.prepare.prompts import tokenizer_folder
            from harness.prepare.wer import wer_fields

            details |= wer_fields(fields["output_texts"], self.speech_reference, tokenizer_folder(self.spec.local_path))
        return fields | ({"prompt_ids": None} if input_ids is None else {})

    def result(self, target: Target, case: Case, status: str, error: str | None = None, **fields: Any) -> Result:
        """A Result carrying this model's facts, native or browser; measured fields come in **fields."""
        details = {
            "weights_source": self.weights_source,
            "reference": self.reference,
            "export": self.export,
            "parameters": self.parameters,
            **self.facts,
        } | dict(fields.pop("details", {}))
        if self.speech is not None:  # what a speech model heard, for every row of it
            details["audio_input"] = self.audio_input(case)
        return Result(
            model=self.spec.name,
            family=self.spec.family,
            weights=self.weights,
            target=target,
            case=case,
            status=status,
            error=error,
            details=details,
            **fields,
        )

    def unprepared(self, case: Case) -> tuple[str, str] | None:
        """(status, why) for a case this model has no inputs for: a sequence past its positions
        (`unsupported`), or its inputs or reference failed to build (`oom`, `error`); None when it has them."""
        shape = (case.batch_size, case.seq_len)
        if shape in self.skipped:
            return "unsupported", self.skipped[shape]
        return self.failed.get(shape)

    def audio_input(self, case: Case) -> str:
        """What a speech case's audio is: its source and the length it was fitted to."""
        from harness.prepare.audio import describe

        assert self.speech is not None
        source, seconds, window = self.speech
        return describe(source, seconds, window if case.audio_seconds is None else case.audio_seconds)

    def load_case(self, shape: CaseShape, audio_seconds: int | None = None,
                  on_graph: bool = False) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:  # fmt: skip
        """A case's inputs and reference outputs: the module's (torch, JAX and the prompt of a generation), or with
        on_graph the inference case as onnx_path takes it (its prefill case where that is the export with past); a
        speech generation's at an --audio-seconds length has that length's input_features (its reference outputs
        are the window's: a generation never reads them)."""
        path = self.prefill_files.get(shape) if on_graph else None
        with np.load(path or self.case_files[shape]) as data:
            feeds = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
            count = sum(k.startswith("ref:") for k in data.files)
            reference = [data[f"ref:{i}"] for i in range(count)]
        if audio_seconds is not None:
            with np.load(self.audio_files[(shape, audio_seconds)]) as data:
                feeds["input_features"] = data["in:input_features"]
        return feeds, reference

    def load_generation(self, shape: CaseShape, new_tokens: int, depth: int = 0) -> Greedy | None:
        """The reference generation of a case at a KV-cache depth (None when none was made: no graph with past)."""
        path = self.generation_files.get((shape, new_tokens, depth))
        if path is None:
            return None
        from harness.prepare.greedy import Greedy

        with np.load(path) as data:
            return Greedy(data["tokens"], data["margins"], data["prefill_logits"])


@dataclass(frozen=True)
class PrepareJob:
    spec: ModelSpec
    shapes: list[CaseShape]
    # Export the graph with past key/values too: only when the plan generates on ONNX Runtime,
    # since it is a second export of the whole model.
    with_past: bool = False
    # > 0: also native ORT's greedy generation of this many tokens per case (browser token parity)
    reference_tokens: int = 0
    reference_depths: tuple[int, ...] = (0,)  # the KV-cache depths each reference generation is made at
    # The plain export: False where every case that loads an ONNX file generates from the export with past,
    # which then serves alone (a first run of a real model exported it twice, inside the job's timeout)
    plain: bool = True
    stop_at_eos: bool = False  # --stop-at-eos: generations (and the reference's) stop at the model's EOS id
    audio_seconds: tuple[int, ...] = ()  # speech: the --audio-seconds lengths its generations are fed
    # Inference runs on the export with past (inference_on_past): each case's prefill inputs and torch's
    # reference for them are made, and the plain export is made only if the export with past fails
    prefill: bool = False
    # a GGUF of the weights at each of these precisions (a llama-family decoder's; harness.prepare.gguf_export), for
    # the engines that run one (Capabilities.runs_gguf)
    gguf_precisions: tuple[str, ...] = ()
    # --reference-model: a Hugging Face folder of the same weights whose fp32 export is the reference of a model
    # whose own fp32 graph is not at hand (an onnxruntime-genai int4 folder)
    reference_model: Path | None = None


def inference_on_past(spec: ModelSpec, modes: list[str] | tuple[str, ...]) -> bool:
    """Whether a model's inference cases run on its export with past key/values, fed a past of length 0 (the
    generation's first step: the prompt's last-position logits and its presents), rather than on the plain
    export: a decoder-only model (spec.has_past_export) in a run that also generates, so one export serves both
    modes (a first run of a 135M model exported it twice). The one rule native and browser plans both follow,
    so a run's inference rows ran one graph on every side. Encoders, vision models and encoder–decoders keep
    the plain export."""
    decoder_only = spec.has_past_export and not spec.is_seq2seq  # an encoder–decoder's layout has no such step
    return decoder_only and "inference" in modes and "generate" in modes


@dataclass(frozen=True)
class Phase:
    """What a preparing child is doing now, sent to the parent before each long step (the CLI shows it)."""

    model: str
    step: str  # e.g. "exporting ONNX with past key/values"


def unprepared_result(
    spec: ModelSpec, target: Target, case: Case, status: str, error: str, details: dict[str, Any] | None = None
) -> Result:
    """The row for a case whose model was never prepared: its weights are unknown."""
    return Result(spec.name, spec.family, "unknown", target, case, status, error, details=details or {})


def write_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write `path` through a uniquely named temp file beside it, renamed into place: two preparers
    of one model (two device groups) never share a temp file, none reads half a file, and an
    interrupted write leaves no temp file behind."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
        os.replace(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)


def _save_case(path: Path, feeds: dict[str, np.ndarray], reference: list[np.ndarray]) -> None:
    arrays = {f"in:{k}": v for k, v in feeds.items()} | {f"ref:{i}": r for i, r in enumerate(reference)}
    write_atomically(path, lambda file: np.savez(file, **arrays))


def _build_cases(
    case_files: dict[CaseShape, Path], build: Callable[[int, int | None], tuple[dict[str, np.ndarray], list]]
) -> dict[CaseShape, tuple[str, str]]:
    """Each missing case's inputs and reference outputs, built and saved; a case whose build fails (an
    allocation past memory, a graph that refuses the shape) is taken out of case_files and returned
    with its status and reason: it fails alone, the model's other cases run."""
    failed = {}
    for (batch, seq), path in list(case_files.items()):
        if path.exists():
            continue
        try:
            _save_case(path, *build(batch, seq))
        except Exception as exc:  # that case's outcome, not the model's
            status, message = classify(exc)
            failed[(batch, seq)] = (status, f"preparing the inputs and reference outputs failed: {message}")
            del case_files[(batch, seq)]
    return failed


def _spec_case_dir(spec: ModelSpec) -> tuple[Weights, Path]:
    """The spec's weights and its cache directory (its export's key), both torch-free."""
    from harness.prepare.export import export_key
    from harness.prepare.weights import find_weights

    weights, _ = find_weights(spec)
    return weights, _case_dir(export_key(spec, weights))


def _prepare_spec_model(job: PrepareJob) -> Iterator[Phase | PreparedModel]:
    weights, case_dir = _spec_case_dir(job.spec)
    cached = _prepare_from_cache(job, weights, case_dir)
    if cached is not None:
        yield cached
        return
    lock = _open_prepare_lock(case_dir)
    try:  # one process builds a model's cache at a time; one that waited for it reads what it left
        waited = yield from _take_prepare_lock(lock, job.spec.name)
        cached = _prepare_from_cache(job, weights, case_dir) if waited else None
        if cached is not None:
            yield cached
        else:
            yield from _build_and_prepare(job, case_dir)
    finally:
        os.close(lock)  # and with it the lock (as the kernel does for a process that dies holding it)


# How often a prepare waiting for another process's build of the same model looks, and reports that it waits
# (each report moves its --prepare-timeout deadline: a wait on a live export is never a timeout).
PREPARE_LOCK_POLL_S = 0.25
PREPARE_WAIT_REPORT_S = 10.0


def _open_prepare_lock(case_dir: Path) -> int:
    """The lock file of a model's cache entry (beside it: the entry itself appears only once built)."""
    locks = case_dir.parent / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    return os.open(locks / f"{case_dir.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)


def _take_prepare_lock(lock: int, model: str) -> Generator[Phase, None, bool]:
    """Take the model's lock: two runs (or a parallel suite's device groups) preparing one model export it once.
    Returns whether another process held it (its export and case files may now be in the cache). Where there is
    no fcntl (Windows), no lock: each process builds, and the renames into place keep the cache whole."""
    import time

    try:
        import fcntl
    except ImportError:
        return False
    waited, reported = False, 0.0
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return waited
        except BlockingIOError:
            if time.monotonic() - reported >= PREPARE_WAIT_REPORT_S:
                yield Phase(model, "waiting for another process that is preparing this model")
                reported = time.monotonic()
            waited = True
            time.sleep(PREPARE_LOCK_POLL_S)


def needs_torch(job: PrepareJob) -> bool:
    """Whether preparing builds the torch module: a spec model whose export, facts and case files an
    earlier run did not all leave in the cache. A warm-cache prepare reads files only, so its worker
    need not fork from the torch fork server (whose start cost a cached ORT-only run ~2 s)."""
    if job.spec.is_onnx_file:
        return False
    weights, case_dir = _spec_case_dir(job.spec)
    return _prepare_from_cache(job, weights, case_dir) is None


def _case_paths(job: PrepareJob, case_dir: Path, limit: int | None) -> tuple[dict[CaseShape, Path], dict]:
    """Each case's .npz path, and the cases the model cannot take (a sequence past its positions)."""
    case_files, skipped = {}, {}
    for batch, seq in job.shapes:
        if limit is not None and seq is not None and seq > limit:
            skipped[(batch, seq)] = f"sequence length {seq} exceeds the model's maximum of {limit} positions"
        else:
            case_files[(batch, seq)] = case_dir / case_file_name(job.spec, batch, seq)
    return case_files, skipped


# The rule drawn prompts follow (harness.prepare.prompts); a new rule gets a new tag, so no case file an
# earlier rule drew is reused.
DRAWN_PROMPTS = "drawn2"


def case_file_name(spec: ModelSpec, batch: int, seq: int | None) -> str:
    """A case's .npz name: its shape, its prompt (the given ids' digest, or the drawing rule) and, for speech,
    its audio's (harness.prepare.audio: a new clip or passage, new files)."""
    speech = ""
    if spec.takes_speech:
        from harness.prepare.audio import speech_input

        speech = f"_{speech_input(spec.audio).digest}"
    if spec.prompt is None:
        return f"b{batch}_s{seq}_{DRAWN_PROMPTS}{speech}.npz"
    digest = hashlib.sha256(json.dumps(list(spec.prompt)).encode()).hexdigest()[:16]
    return f"b{batch}_s{seq}_p{digest}{speech}.npz"


def _prepare_from_cache(job: PrepareJob, weights: Weights, case_dir: Path) -> PreparedModel | None:
    """Everything from the cache when an earlier run left all of it: no module is built (seconds of
    random initialisation for a base model). None when anything is missing."""
    from harness.prepare.export import ExportOutcome, cached_export, export_dir

    facts_path = case_dir / MODEL_FACTS
    past = _cached_past(job.spec, case_dir.name) if job.with_past else None
    if job.prefill:  # the export with past serves inference: an earlier plain export is not what runs
        onnx = past
    else:  # an earlier run's plain export serves even when not needed
        onnx = cached_export(export_dir(case_dir.name))
        if onnx is None and not job.plain:
            onnx = ExportOutcome(None, None, False, None, NOT_EXPORTED, None)
    if not facts_path.exists() or onnx is None or (job.with_past and past is None):
        return None
    facts = json.loads(facts_path.read_text())
    case_files, skipped = _case_paths(job, case_dir, facts["max_sequence_length"])
    prefills = _prefill_paths(case_files) if job.prefill else {}
    if not all(path.exists() for path in [*case_files.values(), *prefills.values()]):
        return None
    if not _cached_ggufs(job, case_dir.name):
        return None
    prepared = _prepared(job, weights, onnx, facts["parameters"], case_files, skipped)
    prepared.prefill_files = prefills
    _add_ggufs(prepared, job, case_dir.name)
    if past is not None:
        prepared.onnx_past_path, prepared.export["past"] = past.path, _export_facts(past)
    if job.prefill:
        prepared.export["inference_graph"] = INFERENCE_ON_PAST
    return prepared


INFERENCE_ON_PAST = "the export with past key/values, fed a past of length 0: the prompt's last-position logits"


def _prefill_paths(case_files: dict[CaseShape, Path]) -> dict[CaseShape, Path]:
    """Each case's prefill file (the inference case on the export with past), beside the module's case file."""
    return {shape: path.with_name(f"{path.stem}_prefill.npz") for shape, path in case_files.items()}


def _build_and_prepare(job: PrepareJob, case_dir: Path) -> Iterator[Phase | PreparedModel]:
    import torch

    from harness.prepare.workload import build_module, make_inputs, max_sequence_length

    spec = job.spec
    yield Phase(spec.name, "building the model and its reference outputs")
    module, weights = build_module(spec)
    config = module.model.config
    parameters = sum(p.numel() for p in module.parameters())
    limit = max_sequence_length(config) if spec.inputs.uses_sequence else None
    case_files, skipped = _case_paths(job, case_dir, limit)

    def build(batch: int, seq: int | None) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        feeds = make_inputs(spec, config, batch, seq)
        with torch.inference_mode():
            outputs = module(*(torch.from_numpy(feeds[n]) for n in module.input_names))
        return feeds, [o.float().numpy() for o in outputs]

    failed = _build_cases(case_files, build)  # references first: exporting traces the module and may change it
    prefills = _prefill_paths(case_files) if job.prefill else {}
    failed |= _build_prefills(module.model, case_files, prefills)
    if _gguf_paths(job, case_dir.name)[0]:  # before the exports, which trace the module and may change it
        yield Phase(spec.name, "writing GGUF")
        _write_ggufs(job, case_dir.name, module.model)
    # the exports' example: a drawn prompt of its own length (a given prompt is one case's length)
    example = make_inputs(replace(spec, prompt=None), config, 2, 16 if spec.inputs.uses_sequence else None)
    outcome, past = yield from _exports(job, module, weights, example, bool(prefills))
    prepared = _prepared(job, weights, outcome, parameters, case_files, skipped)
    prepared.failed = failed
    if outcome is past:  # one export serves both modes
        prepared.prefill_files, prepared.export["inference_graph"] = prefills, INFERENCE_ON_PAST
    if past is not None:
        prepared.onnx_past_path, prepared.onnx_past_error = past.path, past.error
        prepared.export["past"] = _export_facts(past)
    if job.gguf_precisions:
        _add_ggufs(prepared, job, case_dir.name)
    facts = {"parameters": parameters, "max_sequence_length": limit}
    write_atomically(case_dir / MODEL_FACTS, lambda file: file.write(json.dumps(facts).encode()))  # for the next run
    yield prepared


def _build_prefills(model: Any, case_files: dict[CaseShape, Path], prefills: dict[CaseShape, Path]) -> dict:
    """Each missing prefill file: the module's case as the export with past takes it, and torch's outputs for it
    (harness.prepare.export_past.prefill_case); a case whose prefill fails is returned as _build_cases does."""
    if not prefills:
        return {}
    from harness.prepare.export_past import prefill_case

    def build(batch: int, seq: int | None) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        with np.load(case_files[(batch, seq)]) as data:
            return prefill_case(model, {k[3:]: data[k] for k in data.files if k.startswith("in:")})

    return _build_cases(prefills, build)


def _exports(
    job: PrepareJob, module: Any, weights: Weights, example: dict[str, np.ndarray], on_past: bool
) -> Generator[Phase, None, tuple[ExportOutcome, ExportOutcome | None]]:
    """The exports a job asks for, a Phase before each, returning (the graph inference runs, the export with
    past or None). on_past: inference runs the export with past, so the plain export is made only if that one
    failed (one export serves both modes)."""
    from harness.prepare.export import ExportOutcome, export_onnx

    spec = job.spec
    outcome = ExportOutcome(None, None, False, None, NOT_EXPORTED, None)
    if job.plain:
        yield Phase(spec.name, "exporting ONNX")
        outcome = export_onnx(spec, module, weights, example)
    past = None
    if job.with_past:
        layout = "encoder and decoders" if spec.is_seq2seq else "with past key/values"
        yield Phase(spec.name, f"exporting ONNX {layout}")
        past = _export_past(spec, module.model, weights, example)
    if on_past and past is not None and past.path is not None:
        return past, past
    if on_past and outcome.path is None:  # the export with past failed: inference runs the plain export
        yield Phase(spec.name, "exporting ONNX")
        outcome = export_onnx(spec, module, weights, example)
    return outcome, past


def _gguf_paths(job: PrepareJob, key: str) -> tuple[dict[str, Path], list[str]]:
    """The GGUF each asked precision would be (beside the exports, keyed like them: the weights' fingerprint), and
    why the others cannot be written (torch-free: the spec's model type decides)."""
    from harness.prepare.export import export_dir
    from harness.prepare.gguf_export import gguf_file, gguf_precision, why_not

    paths, why = {}, []
    for precision in dict.fromkeys(gguf_precision(p) for p in job.gguf_precisions):
        if reason := why_not(job.spec.model_type, precision):
            why.append(f"{precision}: {reason}")
        else:
            paths[precision] = gguf_file(export_dir(f"{key}-gguf"), precision)
    return paths, why


def _cached_ggufs(job: PrepareJob, key: str) -> bool:
    """Whether an earlier run left every GGUF the job asks for (or its failure's reason)."""
    from harness.prepare.gguf_export import read_cached

    return all(read_cached(path) is not None for path in _gguf_paths(job, key)[0].values())


def _write_ggufs(job: PrepareJob, key: str, model: Any) -> None:
    """Each missing GGUF, written from the module's weights; a failure is kept beside it as its reason."""
    from harness.prepare.gguf_export import read_cached, write_cached
    from harness.prepare.weights import find_weights

    folder = find_weights(job.spec)[1]  # a pretrained model's files: its tokenizer.json gives the vocabulary
    for precision, path in _gguf_paths(job, key)[0].items():
        # a failure is kept as the facts file's error: that precision's GGUF is missing, the others stand
        with contextlib.suppress(Exception):
            if read_cached(path) is None:
                write_cached(model, model.config, path, precision, folder)


def _add_ggufs(prepared: PreparedModel, job: PrepareJob, key: str) -> None:
    """The job's GGUFs on the prepared model: their paths and facts, and why any is missing."""
    from harness.prepare.gguf_export import gguf_precision, read_cached

    paths, why = _gguf_paths(job, key)
    for precision, path in paths.items():
        facts = read_cached(path) or {"error": "not written"}
        if "error" in facts:
            why.append(f"{precision}: {facts['error']}")
        else:
            prepared.gguf_files[precision], prepared.gguf_facts[precision] = str(path.resolve()), facts
    for asked in job.gguf_precisions:  # `auto` runs the fp32 file: found under the run's own label too
        if (precision := gguf_precision(asked)) in prepared.gguf_files:
            prepared.gguf_files[asked] = prepared.gguf_files[precision]
    prepared.gguf_error = "; ".join(why) or None


def _cached_past(spec: ModelSpec, key: str) -> ExportOutcome | None:
    """An earlier run's export for generation: the graph with past, or an encoder–decoder's layout folder
    (its first decoder step's file is the path, the encoder and later steps' decoder beside it)."""
    from harness.prepare.export import cached_export, export_dir

    if not spec.is_seq2seq:
        return cached_export(export_dir(f"{key}-past"))
    from harness.prepare.export_seq2seq import DECODER_FILE

    decoder = cached_export(export_dir(f"{key}-{DECODER_FILE.removesuffix('.onnx').replace('_', '-')}"))
    layout = export_dir(f"{key}-seq2seq") / DECODER_FILE
    return replace(decoder, path=layout) if decoder is not None and layout.exists() else None


def _export_past(spec: ModelSpec, model: Any, weights: Weights, feeds: dict[str, np.ndarray]) -> ExportOutcome:
    """The export generation runs: the graph with past (decoder-only) or the encoder–decoder layout, whose
    first decoder step's file stands for it (harness.prepare.seq2seq finds the rest beside it)."""
    if not spec.is_seq2seq:
        from harness.prepare.export_past import export_with_past

        return export_with_past(spec, model, weights)
    from harness.prepare.export import ExportOutcome
    from harness.prepare.export_seq2seq import DECODER_FILE, export_seq2seq

    made = export_seq2seq(spec, model, weights, feeds)
    if made.folder is None:
        return ExportOutcome(None, None, False, None, made.error, None)
    return replace(made.outcomes[DECODER_FILE], path=made.folder / DECODER_FILE)


def _prepared(
    job: PrepareJob,
    weights: Weights,
    outcome: ExportOutcome,
    parameters: int,
    case_files: dict[CaseShape, Path],
    skipped: dict[CaseShape, str],
) -> PreparedModel:
    return PreparedModel(
        spec=job.spec,
        weights=weights.kind,
        weights_source=weights.source,
        onnx_path=outcome.path,
        onnx_error=outcome.error,
        reference="torch-fp32",
        parameters=parameters,
        export=_export_facts(outcome),
        case_files=case_files,
        skipped=skipped,
        output_names=job.spec.outputs,
    )


def _export_facts(outcome: ExportOutcome) -> dict[str, Any]:
    return {
        "exporter": outcome.exporter,
        "cache_hit": outcome.cache_hit,
        "export_s": outcome.export_s,
        "dynamo_error": outcome.dynamo_error,
    }


def _prepare_onnx_file(job: PrepareJob) -> PreparedModel:
    import onnxruntime as ort

    from harness.prepare.external import content_key
    from harness.prepare.folder_layouts import seq2seq_decoder
    from harness.prepare.folders import file_precision, past_shape
    from harness.prepare.graph_tables import index_tables
    from harness.prepare.greedy import prefill_feeds, takes_past
    from harness.prepare.inputs import make_signature_inputs, onnx_file_signature
    from harness.prepare.prompts import tokenizer_folder, vocabulary

    spec = job.spec
    assert spec.local_path is not None
    try:
        session = ort.InferenceSession(str(spec.local_path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # e.g. an operator ORT lacks: other engines may still run the file
        session, reference = None, f"none: onnxruntime CPU cannot run this file ({_first_line(exc)})"
        signature = onnx_file_signature(spec.local_path)
    else:
        reference = f"onnxruntime-cpu-{file_precision(spec.local_path)}"  # the file as it is: an int4 one is q4
        signature = [(i.name, list(i.shape), i.type) for i in session.get_inputs()]
    digest = content_key(spec.local_path)  # its external data too: other weights, other reference outputs
    prepared = PreparedModel(
        spec=spec,
        weights="pretrained",
        weights_source=str(spec.local_path),
        onnx_path=spec.local_path,
        onnx_error=None,
        reference=reference,
        parameters=None,
        export={"exporter": "file"},
        output_names=tuple(o.name for o in session.get_outputs()) if session is not None else (),
    )
    case_dir = _case_dir(digest)
    prepared.case_files = {(b, s): case_dir / case_file_name(spec, b, s) for b, s in job.shapes}
    tables = index_tables(spec.local_path)  # integer inputs stay inside the tables they index
    rows = tables.get("input_ids") or _logits_width(session)
    vocab = vocabulary(tokenizer_folder(spec.local_path), rows) if rows else None
    past = session is not None and takes_past([i.name for i in session.get_inputs()], prepared.output_names)
    if past:
        prepared.onnx_past_path = spec.local_path  # a graph with past key/values: it generates
    else:  # a folder's encoder–decoder: the file is its encoder, generation runs the decoder beside it
        prepared.onnx_past_path = seq2seq_decoder(spec.local_path)

    def build(batch: int, seq: int | None) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        feeds = make_signature_inputs(signature, spec.name, batch, seq, tables, vocab, spec.prompt)
        if spec.takes_speech:  # a folder's Whisper encoder: the window of speech, as a spec model's (inputs.py)
            from harness.prepare.audio import speech_features, speech_input

            feeds["input_features"] = speech_features(speech_input(spec.audio), feeds["input_features"].shape)
        if past:  # the prompt with an empty past (a prefill)
            feeds = prefill_feeds(session, feeds, past_shape(spec.local_path))
        return feeds, list(session.run(None, feeds)) if session is not None else []

    prepared.failed = _build_cases(prepared.case_files, build)
    return prepared


def _logits_width(session: Any) -> int | None:
    """The vocabulary a graph's first output spans where it fixes its last dimension (a graph whose input_ids
    index no table the proto shows)."""
    if session is None:
        return None
    last = (session.get_outputs()[0].shape or [None])[-1]
    return last if isinstance(last, int) and last > 0 else None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


def _case_dir(key: str) -> Path:
    from harness.prepare.cache import cache_root

    directory = cache_root() / "cases" / key
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def prepare_steps(job: PrepareJob) -> Iterator[Phase | PreparedModel]:
    """Worker entry point (a generator, as harness.run.isolation expects): a Phase before each long step,
    then the PreparedModel."""
    if job.spec.is_gguf_file:  # llama.cpp is its tokenizer and reference: prepared by harness.run.gguf_prepare
        from harness.prepare.gguf_file import NO_ONNX

        raise UnsupportedError(f"{NO_ONNX}; it is prepared with llama.cpp (harness.run.gguf_prepare)")
    if job.spec.is_onnx_file:
        prepared = _prepare_onnx_file(job)
        if job.gguf_precisions:
            prepared.gguf_error = "an .onnx file: no module's weights to write a GGUF of"
    else:
        for step in _prepare_spec_model(job):
            if isinstance(step, Phase):
                yield step
            else:
                prepared = step
    if job.stop_at_eos:  # its files were read once already, when the run was checked (harness.run.plan)
        from harness.prepare.prompts import model_eos_ids

        prepared.eos, prepared.eos_asked = model_eos_ids(job.spec), True
    if job.spec.takes_speech:
        _speech_cases(prepared, job.audio_seconds)
    if job.reference_tokens and prepared.onnx_past_path is not None:
        yield Phase(job.spec.name, "native ONNX Runtime's reference tokens")
        _reference_generations(prepared, job.reference_tokens, job.reference_depths)
    if prepared.onnx_past_path is not None and (job.with_past or job.reference_tokens):  # it generates on a graph
        yield Phase(job.spec.name, "the fp32 reference over the perplexity passage")
        prepared.fp32_reference = _fp32_reference(prepared.onnx_past_path, job.reference_model)
        prepared.passage = _passage(prepared)
    yield prepared


def _fp32_reference(source: Path, reference_model: Path | None) -> Path | None:
    """The fp32 graph a decoder-only model's rows are held against: its own (harness.prepare.quality.fp32_graph),
    else --reference-model's export with past (prepared as any model is, cached); None where neither is at hand."""
    from harness.prepare.quality import fp32_graph
    from harness.prepare.specs import spec_from_path

    own = fp32_graph(source)
    if own is not None or reference_model is None:
        return own if isinstance(own, Path) else None
    job = PrepareJob(spec_from_path(Path(reference_model), None), [], with_past=True, plain=False)
    return next(prepare_model(job)).onnx_past_path


def _passage(prepared: PreparedModel) -> Passage:
    """The passage's ids and the fp32 reference's log-probabilities over them (harness.prepare.perplexity); an
    encoder–decoder's rows are scored by their task (speech: WER), not on the passage."""
    from harness.prepare.perplexity import Passage, passage_ids, with_reference
    from harness.prepare.seq2seq import seq2seq_files

    assert prepared.onnx_past_path is not None
    if seq2seq_files(prepared.onnx_past_path) is not None:
        return Passage((), "not measured: an encoder–decoder's decoder writes from its encoder's input (speech rows "
                           "are scored by their WER), not a free-running passage")  # fmt: skip
    from harness.prepare.quality import GIVEN_REFERENCE, fp32_graph

    given = prepared.fp32_reference is not None and fp32_graph(prepared.onnx_past_path) is None
    return with_reference(passage_ids(prepared.spec), prepared.fp32_reference, f", {GIVEN_REFERENCE}" if given else "")


def prepare_model(job: PrepareJob) -> Iterator[PreparedModel]:
    """prepare_steps without its phases: the PreparedModel alone."""
    yield from (step for step in prepare_steps(job) if isinstance(step, PreparedModel))


def audio_lengths(cases: list[Case]) -> tuple[int, ...]:
    """The --audio-seconds lengths a model's cases are fed (PrepareJob.audio_seconds)."""
    return tuple(sorted({c.audio_seconds for c in cases if c.audio_seconds is not None}))


def _speech_cases(prepared: PreparedModel, lengths: tuple[int, ...]) -> None:
    """A speech model's source, and each case's input_features at every --audio-seconds length (cached beside the
    case's inputs, from the same speech and extractor): what native engines and the page are both fed."""
    from harness.prepare.audio import speech_features, speech_input, window_seconds
    from harness.prepare.wer import speech_reference

    speech = speech_input(prepared.spec.audio)
    prepared.speech_reference = speech_reference(speech.kind, prepared.spec.audio, prepared.spec.transcript)
    for shape, case_file in prepared.case_files.items():
        window = prepared.load_case(shape)[0]["input_features"].shape
        prepared.speech = (speech.source, speech.seconds, window_seconds(window[-1]))
        for seconds in lengths:
            path = case_file.with_name(f"{case_file.stem}_a{seconds}.npz")
            if not path.exists():
                arrays = {"in:input_features": speech_features(speech, window, seconds)}
                write_atomically(path, lambda file, arrays=arrays: np.savez(file, **arrays))
            prepared.audio_files[(shape, seconds)] = path


def _reference_generations(prepared: PreparedModel, new_tokens: int, depths: tuple[int, ...]) -> None:
    """Native ORT's greedy generation of every case (cached beside the case's inputs): the tokens, the
    top-1/top-2 margin at each step and the prefill logits the browser's generation is checked against."""
    from harness.prepare.greedy import reference_generation
    from harness.prepare.seq2seq import reference_seq2seq, seq2seq_files

    assert prepared.onnx_past_path is not None
    layout = seq2seq_files(prepared.onnx_past_path)  # an encoder-decoder's graphs, or None
    for (shape, case_file), depth in itertools.product(prepared.case_files.items(), depths):
        stop = "_eos" + "-".join(map(str, prepared.eos)) if prepared.eos else ""  # where the reference stopped
        deep = f"_d{depth}" if depth else ""
        path = case_file.with_name(f"{case_file.stem}_gen{new_tokens}{stop}{deep}.npz")
        if not path.exists():
            feeds, _ = prepared.load_case(shape)
            if layout is not None:  # an encoder-decoder: no depth, no EOS stop (both refused where it runs)
                made = reference_seq2seq(layout, feeds, new_tokens)
            else:
                prompt = {name: feeds[name] for name in ("input_ids", "attention_mask")}
                made = reference_generation(prepared.onnx_past_path, prompt, new_tokens, prepared.eos, depth)
            arrays = {"tokens": made.tokens, "margins": made.margins, "prefill_logits": made.prefill_logits}
            write_atomically(path, lambda file, arrays=arrays: np.savez(file, **arrays))
        prepared.generation_files[(shape, new_tokens, depth)] = path
