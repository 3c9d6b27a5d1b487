"""A native benchmark request, checked before anything is written, and the plan it stands for:
model × target × case × mode, less what a resumed run already holds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.core.bounds import (
    MAX_AUDIO_SECONDS,
    MAX_BATCH,
    MAX_DEPTH,
    MAX_ITERATIONS,
    MAX_NEW_TOKENS,
    MAX_SEQUENCE,
    out_of_range,
)
from harness.core.generation import PAGE_MIN_WARMUP_S, PAGE_WARMUP_BUDGET_SHARE
from harness.core.options import (
    DEFAULT_OUTPUT_DIR,
    MAX_TIMEOUT_S,
    RequestError,
    Shared,
    check,
    declared,
    items,
    option,
    reuse,
    seconds_problem,
)
from harness.core.paths import unwritable_directory, unwritable_file
from harness.core.precision import INT4_PRECISIONS, PER_GRAPH_HELP, parse_precisions, per_graph
from harness.core.records import MODES, PRECISIONS, Case, Target, result_key
from harness.core.threads import threaded_target, threads_option
from harness.native import DEFAULT_ENGINES, ENGINES, capabilities
from harness.native.base import Availability
from harness.prepare.audio import AudioError, speech_window, wav_speech
from harness.prepare.folders import own_precision
from harness.prepare.greedy import generates_with_past
from harness.prepare.prepared import inference_on_past
from harness.prepare.prompts import PromptError, given_prompt, model_eos_ids
from harness.prepare.specs import FAMILIES, ModelSpec, SpecError, check_families, select_specs, spec_from_path
from harness.prepare.wer import TranscriptError, read_transcript
from harness.run.ceiling_reuse import CEILING_MODES, REUSE_AGE, CeilingBook
from harness.run.hardware import DEFAULT_NATIVE_PLATFORMS, NATIVE_PLATFORMS, native_targets
from harness.run.machine import machine_label
from harness.run.outputs import Outputs
from harness.store import DEFAULT_DB

DEFAULT_MAX_TIME_S = 10.0
PRECISION_HELP = (
    f"Comma-separated: {', '.join(PRECISIONS)}. fp32 is forced everywhere, int8 is dynamic quantization, "
    f"{' and '.join(INT4_PRECISIONS)} int4 weight-only MatMuls, auto the engine's default; the browser runs "
    "the converted ONNX files native ONNX Runtime runs (fp16 on webgpu needs shader-f16). Each row records "
    "the precision that ran. Default: a model folder's own precision where it holds one, else fp32. " + PER_GRAPH_HELP
)
MODE_HELP = (
    "Comma-separated: inference, generate (greedy decoding, TTFT/TPOT, pp and tg tokens/s: GPT-2, LLaMA, Qwen2, "
    "an .onnx with past inputs; in the browser with token parity against native ORT), training (torch)."
)
MAX_TIME_HELP = (
    "Seconds of warmup + timed iterations per case (0: no budget). Once spent, the loop stops after "
    "--min-iterations samples; the row records that the budget stopped it."
)
NO_REPORTS_HELP = (
    "Write no reports after the run, only the compatibility matrix in --output-dir (`accelharness report` "
    "writes them later, from the store)."
)
NO_CEILINGS_HELP = (
    "Measure no ceilings (each target's memory bandwidth and compute, a few seconds per target per run): the "
    "rows keep their bytes and FLOPs, with no fraction of a ceiling. ACCELHARNESS_NO_CEILINGS=1 makes this "
    "the default (the test suite's)."
)
CEILINGS_HELP = (
    f"{' or '.join(CEILING_MODES)}: reuse takes a target's ceilings measured on this machine with the same software "
    f"within {REUSE_AGE.total_seconds() / 3600:g} h (copied into the run, naming the run that measured them; a "
    "resumed run takes its own), fresh measures every one again."
)
CEILINGS_ONLY_HELP = (
    "Measure the targets' ceilings (--hardware, --threads: bandwidth, compute per precision class) and run no "
    "model: a machine known by its ceilings (`predict`)."
)
PROFILE_HELP = (
    "After each inference case's timed loop, a few profiled iterations: time per operator (node, op type, "
    "provider), stored with the result (`query --report ops`, the HTML report, `predict`)."
)
# A model's preparation is its own phase, bounded apart from --timeout: a cold export of a 135M-parameter
# Llama took 43 s + 35 s on a quiet 2-core machine and 191 s + 233 s under load (issue 32).
DEFAULT_PREPARE_TIMEOUT_S = 3600.0
PREPARE_TIMEOUT_HELP = (
    "Seconds a model's preparation may take (its ONNX exports on a cold cache, inputs, reference outputs), "
    "a phase of its own before any job: --timeout does not bound it."
)
NATIVE_THREADS_HELP = (
    "Comma-separated intra-op thread counts of the native engines (ONNX Runtime, onnxruntime-genai, OpenVINO, "
    "torch): one target per count (cpu/onnxruntime:CPUExecutionProvider:threads=2), to pair with the page's "
    "--threads. Default: each engine's own choice, read back. Every row records the count and whether its "
    "threads spin (docs/measurement.md)."
)
PROMPT_HELP = (
    "The prompt's text, tokenized with the model folder's tokenizer.json; its length is the sequence length "
    "(--sequence-lengths is then not used). Default: ids drawn from the model's regular tokens."
)
CHAT_HELP = "With --prompt: the text as one user message of the folder's chat template, with its generation prompt."
PROMPT_IDS_HELP = "The prompt as comma-separated token ids, each inside the model's vocabulary (instead of --prompt)."
STOP_AT_EOS_HELP = (
    "--mode generate: stop a sequence at the tokenizer's or config's EOS id (default: EOS ignored, exactly "
    "--new-tokens tokens for fixed-length timing). Each row states which policy ran."
)
AUDIO_HELP = (
    "A WAV file (PCM, mono or up to 8 channels, 8 to 192 kHz, at most 10 minutes) a speech model (Whisper) hears "
    "instead of espeak-ng's spoken passage: mixed to mono, resampled to 16 kHz, made log-mel features by the "
    "model's own feature extractor; the same features natively and in the page."
)
TRANSCRIPT_HELP = (
    "With --audio: a UTF-8 text file of the words the WAV speaks, each speech row's word error rate (WER) measured "
    "against it, normalized as Whisper's English normalizer does (default: the WER of espeak-ng's passage against "
    "the passage's own text; none for a --audio file without a transcript)."
)
AUDIO_SECONDS_HELP = (
    "--mode generate, speech models (Whisper): comma-separated seconds of audio, one case each (rows "
    f"`tg16 @ d0 @ 5 s audio`): the speech trimmed or padded with silence to that length, at most the model's "
    f"window ({MAX_AUDIO_SECONDS} s for Whisper, whose encoder always reads the whole window). The real-time factor "
    "divides it by the generation's time. Default: the whole window."
)
REFERENCE_MODEL_HELP = (
    "--mode generate with --model-path: a Hugging Face model folder (config.json and weights) of the same weights, "
    "whose fp32 export is the reference every generate row's top-1 agreement, KL, first divergence and perplexity "
    "ratio are held against, where the folder holds no fp32 graph (an onnxruntime-genai int4 folder). Without it such "
    "rows say: no fp32 reference at hand."
)
MACHINE_LABEL_HELP = (
    "Name this machine in reports across machines (default: ACCELHARNESS_MACHINE_LABEL); letters, "
    "digits, '.', '_', '-', at most 64."
)


@dataclass
class RunOptions:
    """What every benchmark request shares: the model selection, the cases, the stop rule and the store. Each
    field is its option's one definition (harness.core.options): flag, help, bound, choices, suite-config key."""

    models: list[str] | None = option(
        None, flag="--model", many=True, help="Comma-separated model names (`accelharness models`)."
    )
    model_families: list[str] | None = option(None, flag="--model-families", many=True, help=",".join(FAMILIES))
    small_models: bool = option(False, flag="--small-models", help="Use the tiny variant of each selected family.")
    model_path: Path | None = reuse(Shared, "model_path", default=None)
    # the fp32 reference of a --model-path folder that holds no fp32 graph (harness.prepare.quality)
    reference_model: Path | None = option(None, flag="--reference-model", help=REFERENCE_MODEL_HELP)
    batch_sizes: list[int] = option(
        factory=lambda: [1], flag="--batch-sizes", many=True, low=1, high=MAX_BATCH, help="Comma-separated batch sizes."
    )
    sequence_lengths: list[int] = option(
        factory=lambda: [32], flag="--sequence-lengths", many=True, low=1, high=MAX_SEQUENCE,
        help="Comma-separated sequence lengths (text inputs).",
    )  # fmt: skip
    # one precision, a list, or a comma-separated string
    precision: str | list[str] | None = option(
        None, flag="--precision", many=True, choices=PRECISIONS, noun="precision", help=PRECISION_HELP,
        parse=parse_precisions,
    )  # fmt: skip
    modes: list[str] = option(
        factory=lambda: ["inference"], flag="--mode", many=True, choices=MODES, noun="mode", help=MODE_HELP
    )
    # generate mode: tokens generated per sequence (min = max, unless --stop-at-eos)
    new_tokens: int = option(
        16, flag="--new-tokens", low=1, high=MAX_NEW_TOKENS,
        help="--mode generate only: tokens per sequence (exactly, EOS ignored, unless --stop-at-eos).",
    )  # fmt: skip
    # generate mode: each depth a case of its own (llama-bench's -d)
    depths: list[int] = option(
        factory=lambda: [0], flag="--depths", many=True, low=0, high=MAX_DEPTH,
        help="--mode generate only: comma-separated KV-cache depths; before each timed generation the cache is "
        "filled to that many tokens untimed, then the prompt and the decode steps are timed (rows `tg16 @ d512`).",
    )  # fmt: skip
    # the prompt every case of a model starts from (harness.prepare.prompts.given_prompt checks them together)
    prompt: str | None = option(None, flag="--prompt", help=PROMPT_HELP)
    chat: bool = option(False, flag="--chat", help=CHAT_HELP)
    prompt_ids: list[int] | None = option(None, flag="--prompt-ids", many=True, help=PROMPT_IDS_HELP)
    stop_at_eos: bool = option(False, flag="--stop-at-eos", help=STOP_AT_EOS_HELP)
    # speech (Whisper): the clip its input is cut from (None: espeak-ng's passage) and the lengths, an axis of cases
    audio: Path | None = option(None, flag="--audio", help=AUDIO_HELP)
    transcript: Path | None = option(None, flag="--transcript", help=TRANSCRIPT_HELP)
    audio_seconds: list[int] | None = option(
        None, flag="--audio-seconds", many=True, low=1, high=MAX_AUDIO_SECONDS, help=AUDIO_SECONDS_HELP
    )
    warmup: int = option(
        5, flag="--warmup", key="warmup_iterations", low=0, high=MAX_ITERATIONS,
        help="Untimed runs after the first run. A page's generation warms up on until its time stops falling, and "
        f"for at least {PAGE_MIN_WARMUP_S:g} s (at most {PAGE_WARMUP_BUDGET_SHARE:.0%} of --max-time: its wasm's "
        "optimizing tier); 0: neither.",
    )  # fmt: skip
    iterations: int = option(
        20, flag="--iterations", key="benchmark_iterations", low=1, high=MAX_ITERATIONS,
        help="Minimum timed iterations.",
    )  # fmt: skip
    min_duration_s: float = option(
        0.5, flag="--min-duration", seconds=(False, math.inf), help="Minimum seconds of timed iterations."
    )
    # at least --iterations: check_measuring checks it (its low bound is another option's value)
    max_iterations: int = option(10_000, flag="--max-iterations", help="Cap on timed iterations.")
    # The time budget of a case's warmup + timed loop (None: none); it never stops the loop below
    # min_iterations samples. The default keeps a 10 s/iteration software adapter to tens of seconds.
    max_time_s: float | None = option(
        DEFAULT_MAX_TIME_S, flag="--max-time", seconds=(True, MAX_TIMEOUT_S), zero_is_none=True, help=MAX_TIME_HELP
    )
    min_iterations: int = option(
        3, flag="--min-iterations", low=1, high=MAX_ITERATIONS,
        help="Timed iterations a case runs even when --max-time is spent.",
    )  # fmt: skip
    timeout_s: float = option(
        300.0, flag="--timeout", key="timeout", seconds=(True, MAX_TIMEOUT_S),
        help="Seconds a worker or page may go without finishing a case.",
    )  # fmt: skip
    prepare_timeout_s: float = option(
        DEFAULT_PREPARE_TIMEOUT_S, flag="--prepare-timeout", key="prepare_timeout", seconds=(True, MAX_TIMEOUT_S),
        help=PREPARE_TIMEOUT_HELP,
    )  # fmt: skip
    db_path: Path = reuse(Shared, "db_path", default=DEFAULT_DB)
    output_dir: Path | None = reuse(Shared, "output_dir", default=DEFAULT_OUTPUT_DIR)
    # --no-reports: a run read from the store only (a script's, a test's) skips drawing its plots (1.5 s a run)
    no_reports: bool = option(False, flag="--no-reports", help=NO_REPORTS_HELP)
    # --no-ceilings: no calibration before a target's first case (harness.run.ceilings.ceilings_asked)
    no_ceilings: bool = option(False, flag="--no-ceilings", help=NO_CEILINGS_HELP)
    # reuse: a target's ceilings measured earlier here with the same software (harness.run.ceiling_reuse)
    ceilings: str = option("reuse", flag="--ceilings", choices=CEILING_MODES, help=CEILINGS_HELP)
    ceilings_only: bool = option(False, flag="--ceilings-only", help=CEILINGS_ONLY_HELP)  # no model, no --model
    profile: bool = option(False, flag="--profile", help=PROFILE_HELP)  # profiled iterations after the timed loop
    # names this machine in reports across machines (harness.run.machine)
    machine_label: str | None = option(None, flag="--machine-label", help=MACHINE_LABEL_HELP)

    @property
    def outputs(self) -> Outputs | None:
        """The after-run step's reports and matrix, in output_dir (None: write none)."""
        return Outputs(Path(self.output_dir), reports=not self.no_reports) if self.output_dir is not None else None


def engines_option() -> Any:
    """The native engines a request runs (`native`, `run`, `ab`): one definition, a field of each request."""
    return option(
        None, flag="--engines", many=True, choices=ENGINES, noun="engine",
        help=f"{','.join(ENGINES)} (default: {','.join(DEFAULT_ENGINES)})",
    )  # fmt: skip


@dataclass
class BenchmarkRequest(RunOptions):
    # None: every available native platform
    hardware: list[str] | None = option(
        None, flag="--hardware", key="hardware_types", many=True, choices=NATIVE_PLATFORMS, noun="native hardware",
        help=f"Comma-separated native platforms: {','.join(NATIVE_PLATFORMS)} (default: every available but webgpu; "
        "ab: cpu, none with --web-hardware).",
    )  # fmt: skip
    engines: list[str] | None = engines_option()
    # None: each engine's own default, read back from the engine and recorded on every row
    native_threads: list[int] | None = threads_option(None, flag="--native-threads", help=NATIVE_THREADS_HELP)


@dataclass
class Plan:
    specs: list[ModelSpec]
    targets: list[tuple[Target, Availability]]
    request: BenchmarkRequest
    done: frozenset[str] = frozenset()  # result keys a resumed run already holds: never run twice
    ceilings: CeilingBook = field(default_factory=CeilingBook)  # earlier ceilings it may take (record_run loads)

    def cases(self, spec: ModelSpec, target: Target | None = None) -> list[Case]:
        """The cases of a spec on a target (all targets when None). Each mode is planned on the engines
        whose capabilities list it: on an engine whose generation runs the export with past key/values only
        for the models that have one (the decoder-only GPT-2, LLaMA, Qwen2; not T5, Whisper or LLaVA)."""
        if target is None:
            return plan_cases(self.request, spec, lambda mode, with_past: True)
        return plan_cases(self.request, spec, capabilities(target.engine).plans)

    def exports_past(self, spec: ModelSpec) -> bool:
        """Whether preparing the spec needs its export with past key/values: an available target generates
        with it, or loads an ONNX file for inference where that export serves inference (inference_on_past)."""
        on_past = inference_on_past(spec, self.request.modes)
        return any(
            (case.mode == "generate" and can.generate_needs_past_export)
            or (case.mode == "inference" and can.needs_onnx and on_past)
            for target, availability in self.targets
            if availability.ok and (can := capabilities(target.engine))
            for case in self.cases(spec, target)
        )

    def gguf_precisions(self, spec: ModelSpec) -> tuple[str, ...]:
        """The precisions the prepare worker writes a GGUF of the spec's weights at: those of the cases an available
        target that runs a GGUF (Capabilities.runs_gguf: llama.cpp) plans."""
        found = [
            case.precision
            for target, availability in self.targets
            if availability.ok and capabilities(target.engine).runs_gguf
            for case in self.cases(spec, target)
        ]
        return tuple(dict.fromkeys(found))

    def exports_plain(self, spec: ModelSpec) -> bool:
        """Whether preparing the spec needs its plain export: an available target loads the ONNX file for a
        case that does not generate from the export with past, which alone serves generation, and inference
        too where the run also generates on a decoder-only model (inference_on_past)."""
        if inference_on_past(spec, self.request.modes):
            return False
        for target, availability in self.targets:
            can = capabilities(target.engine)
            cases = self.cases(spec, target) if availability.ok and can.needs_onnx else []
            if any(c.mode != "generate" or not can.generate_needs_past_export for c in cases):
                return True
        return False

    def remaining(self, spec: ModelSpec, target: Target) -> list[Case]:
        """The cases still to run on a target: all of them, less what a resumed run already holds."""
        return [c for c in self.cases(spec, target) if result_key(spec.name, target, c) not in self.done]

    @property
    def total_results(self) -> int:
        return sum(len(self.remaining(spec, target)) for spec in self.specs for target, _ in self.targets)


def plan_cases(request: RunOptions, spec: ModelSpec, plans: Callable[[str, bool], bool]) -> list[Case]:
    """The one way a spec's cases are planned, natively and in the browser: every mode `plans` takes (given
    whether the model generates from a graph with past key/values), precision, batch size and (if it has one)
    sequence length (a fixed-shape file: its own shapes). Generation only for a generative architecture or a
    file whose graph takes past; combinations that don't apply are not planned rather than recorded."""
    shapes = spec.case_shapes(request.batch_sizes, request.sequence_lengths)
    with_past = generates_with_past(spec)  # a decoder's -past export, or a file whose graph takes past
    cases = []
    for mode in request.modes:
        if mode == "generate" and not (spec.is_generative or with_past):
            continue
        if not plans(mode, with_past):
            continue
        tokens = request.new_tokens if mode == "generate" else None
        depths = list(dict.fromkeys(items(request.depths))) if mode == "generate" else [None]
        audio = mode == "generate" and spec.takes_speech and request.audio_seconds is not None
        lengths = list(dict.fromkeys(items(request.audio_seconds or []))) if audio else [None]
        # grouped by precision: a worker loads once per precision
        cases += [Case(b, s, p, mode, tokens, d, a) for p in precisions(request) for b, s in shapes for d in depths
                  for a in lengths]  # fmt: skip
    return cases


def precisions(request: RunOptions) -> list[str]:
    """The requested precisions, in order, without duplicates (validate() rejects an empty list). None given:
    a model folder's own precision where it holds one (an onnxruntime-genai int4 folder runs q4), else fp32."""
    if request.precision is None:
        return [(request.model_path and own_precision(Path(request.model_path))) or "fp32"]
    return parse_precisions(items(request.precision))


def check_count(name: str, values: int | list[int], high: int, low: int = 1) -> None:
    """A count option, or a list of them, within low..high (the bounds of harness.core.bounds)."""
    if problem := out_of_range(name, values, low, high):
        raise RequestError(problem)


def check_shapes(request: RunOptions) -> None:
    """The batch sizes and sequence lengths every benchmark request takes."""
    check(request, declared(RunOptions), ("batch_sizes", "sequence_lengths"))


def validate(request: BenchmarkRequest) -> Plan:
    """Check every input before anything is written; raise RequestError naming the valid values."""
    check_shapes(request)
    check_measuring(request)
    check(request, declared(BenchmarkRequest), ("native_threads",))
    engines = check_engines(request.engines, request.hardware)
    specs = check_selection(request)
    if request.engines is None and all(spec.is_gguf_file for spec in specs):  # what a llama-bench user runs
        engines = [engine for engine in ENGINES if capabilities(engine).runs_gguf]
    check_generation(request, specs, request.modes)
    check_paths(request)
    targets = choose_targets(request.hardware, engines, named=request.engines is not None)
    if not targets:
        raise RequestError(f"no target serves hardware {request.hardware} with engines {engines}")
    return Plan(specs, per_thread_count(targets, request.native_threads), request)


def per_thread_count(
    targets: list[tuple[Target, Availability]], counts: list[int] | None
) -> list[tuple[Target, Availability]]:
    """One target per --native-threads count (its provider says the count, as the page's wasm provider
    does); None: the targets as they are, each engine choosing its own count."""
    if counts is None:
        return targets
    return [(threaded_target(t, n), a) for t, a in targets for n in dict.fromkeys(items(counts))]


def check_generation(request: RunOptions, specs: list[ModelSpec], modes: list[str]) -> None:
    """--new-tokens within its bound, and every prompt plus its new tokens within each generative model's
    context: refused here, before anything is prepared, rather than failing inside the model."""
    check(request, declared(RunOptions), ("new_tokens", "depths", "audio_seconds"))
    if "generate" in modes:
        check_context(specs, request.sequence_lengths, request.new_tokens, depths=items(request.depths))
        check_audio_seconds(specs, items(request.audio_seconds or []))
    if request.reference_model is not None:
        from harness.prepare.quality import ReferenceModelError, check_reference_model

        if request.model_path is None or "generate" not in modes:
            raise RequestError("--reference-model names the fp32 weights of a --model-path folder's generate rows")
        try:
            check_reference_model(Path(request.reference_model), specs[0])
        except ReferenceModelError as exc:
            raise RequestError(str(exc)) from None


def check_audio_seconds(specs: list[ModelSpec], lengths: list[int], name: str = "--audio-seconds") -> None:
    """Every audio length within each speech model's window (the seconds its encoder hears at once)."""
    for spec in specs:
        window = speech_window(spec) if spec.takes_speech else None
        if window is not None and lengths and max(lengths) > window:
            raise RequestError(f"{spec.name} hears at most {window:g} s (its encoder's window): {name} "
                               f"{max(lengths)} is longer; give 1 to {window:g}")  # fmt: skip


def check_context(
    specs: list[ModelSpec],
    prompts: list[int],
    tokens: int,
    names: tuple[str, str, str] = ("--sequence-lengths", "--new-tokens", "--depths"),
    depths: list[int] | None = None,
) -> None:
    """The deepest KV cache plus the longest prompt (a model's own prompt where it has one) plus its new tokens
    within each generative model's context; `names` are the prompt lengths', the new tokens' and the depths'
    option (or config key) names the message gives."""
    deepest = max(depths or [0])
    for spec in specs:
        longest = len(spec.prompt) if spec.prompt is not None else max(prompts)
        if spec.is_generative and spec.context_length and deepest + longest + tokens > spec.context_length:
            depth = f"a depth of {deepest} ({names[2]}) plus " if deepest else ""
            raise RequestError(
                f"{spec.name} takes {spec.context_length} positions: {depth}a prompt of {longest} ({names[0]}) "
                f"plus {names[1]} {tokens} is {deepest + longest + tokens}; lower one of them"
            )


def check_engines(engines: list[str] | None, hardware: list[str] | None) -> list[str]:
    """The engines a native request runs (None: the default ones; an opt-in engine runs when named),
    each engine and hardware name checked."""
    options = declared(BenchmarkRequest)
    check(BenchmarkRequest(engines=engines, hardware=hardware), options, ("engines", "hardware"))
    return engines or list(DEFAULT_ENGINES)


def choose_targets(hardware: list[str] | None, engines: list[str],
                   named: bool = False) -> list[tuple[Target, Availability]]:  # fmt: skip
    """The available targets of each platform; a platform asked for by name that nothing here serves keeps its
    unavailable targets, and so does an engine asked for by name (`named`: --engines given) that has no target
    left (llama-cpp-python not installed beside onnxruntime), so the run records them as `unsupported` with the
    reason instead of leaving the engine out without a word."""
    chosen, probed_all = [], []
    for platform in hardware or DEFAULT_NATIVE_PLATFORMS:
        probed = native_targets([platform], engines)
        probed_all += probed
        available = [(t, a) for t, a in probed if a.ok]
        chosen += available if available or not hardware else probed
    kept = {target.engine for target, _ in chosen}
    return chosen + [(t, a) for t, a in probed_all if named and t.engine not in kept and (t, a) not in chosen]


def check_selection(request: RunOptions) -> list[ModelSpec]:
    """The specs a request's --model / --model-families / --small-models / --model-path select (none for
    --ceilings-only, which check_ceilings refuses them with)."""
    if request.ceilings_only:
        return []
    try:
        check_families(request.model_families)
        if request.model_path is not None:
            _check_model_path_alone(request)
            families = request.model_families or [None]
            specs = [spec_from_path(Path(request.model_path), families[0])]
        else:
            if request.small_models and request.models:
                raise RequestError(
                    "--small-models picks the tiny variant of each family and does nothing with --model "
                    "(names are exact: e.g. bert-tiny); drop one of them"
                )
            specs = select_specs(request.models, request.model_families, request.small_models)
    except SpecError as exc:
        raise RequestError(str(exc)) from exc
    if not specs:
        raise RequestError("the model selection is empty: check --model / --model-families")
    check_graph_precisions(request, specs)
    check_gguf(request, specs)
    return [with_audio(request, with_prompt(request, spec)) for spec in specs]


def check_gguf(request: RunOptions, specs: list[ModelSpec]) -> None:
    """A GGUF given as the model generates, at the precision its weights hold, from ids (its own vocabulary's, or
    --prompt-ids): llama.cpp runs it, and the harness tokenizes no --prompt text with a GGUF's tokenizer."""
    gguf = next((spec for spec in specs if spec.is_gguf_file), None)
    if gguf is None:
        return
    if list(request.modes) != ["generate"]:
        raise RequestError(f"{gguf.name} is a GGUF: llama.cpp generates from it; give --mode generate alone")
    own = own_precision(Path(request.model_path)) if request.model_path else None
    if request.precision is not None and precisions(request) != [own]:
        raise RequestError(f"{gguf.name} is a GGUF whose weights are {own}: it runs at the precision it holds; "
                           f"drop --precision (or give {own})")  # fmt: skip
    if request.prompt is not None or request.chat:
        raise RequestError(f"{gguf.name} is a GGUF: its prompt is drawn from the harness's passage with llama.cpp's "
                           "own tokenizer, or given as --prompt-ids; --prompt text is not taken for a "
                           "GGUF")  # fmt: skip


def with_audio(request: RunOptions, spec: ModelSpec) -> ModelSpec:
    """The spec carrying the --audio file its speech is cut from, the file read and checked now (a WAV from
    elsewhere, bounded: harness.prepare.audio); unchanged when the run gives none."""
    if request.audio is None:
        if request.transcript is not None:
            raise RequestError("--transcript is the words a --audio file speaks: give the WAV with --audio too")
        return spec
    if not spec.takes_speech:
        raise RequestError(f"{spec.name} takes no speech (only Whisper-style speech models do); drop --audio")
    path = Path(request.audio)
    try:
        wav_speech(path)
    except AudioError as exc:
        raise RequestError(f"--audio {path.name}: {exc}; nothing was run") from None
    transcript = None if request.transcript is None else Path(request.transcript)
    if transcript is not None:
        try:
            read_transcript(transcript)
        except TranscriptError as exc:
            raise RequestError(f"--transcript {transcript.name}: {exc}; nothing was run") from None
    return replace(spec, audio=path.resolve(), transcript=None if transcript is None else transcript.resolve())


def check_graph_precisions(request: RunOptions, specs: list[ModelSpec]) -> None:
    """A per-graph precision (encoder=fp32,decoder=q4) only for encoder–decoders: another model has one graph."""
    if request.precision is None:  # checked already (check_measuring): it parses
        return
    named = next((p for p in precisions(request) if per_graph(p) is not None), None)
    others = [spec.name for spec in specs if not spec.is_encoder_decoder]
    if named is not None and others:
        raise RequestError(
            f"--precision {named} names an encoder–decoder's graphs apart, and {', '.join(others[:3])} is no "
            "encoder–decoder (T5, Whisper, or a folder with encoder_model.onnx and a decoder); give it a plain "
            f"precision ({', '.join(PRECISIONS)})"
        )


def with_prompt(request: RunOptions, spec: ModelSpec) -> ModelSpec:
    """The spec carrying the prompt the run gives it (--prompt, --chat, --prompt-ids), tokenized and checked
    for this model; unchanged when the run gives none."""
    try:
        prompt = given_prompt(spec, request.prompt, request.chat, request.prompt_ids)
        if request.stop_at_eos:
            model_eos_ids(spec)  # the folder's configs read now: one that cannot be is refused before the run
    except PromptError as exc:
        raise RequestError(f"{spec.name}: {exc}") from exc
    if prompt is not None and not spec.inputs.uses_sequence:  # it would be given and never read
        raise RequestError(f"{spec.name} takes no token ids ({spec.inputs.kind} inputs); drop the prompt")
    return spec if prompt is None else replace(spec, prompt=prompt)


def _check_model_path_alone(request: RunOptions) -> None:
    """--model-path benchmarks one model: options that select others would be silently ignored."""
    if request.models:
        raise RequestError("--model-path benchmarks that one model; drop --model (or --model-path)")
    if request.small_models:
        raise RequestError("--small-models does nothing with --model-path; drop it")
    if request.model_families and len(request.model_families) > 1:
        raise RequestError(
            f"with --model-path, --model-families is the one family to file the model under "
            f"(got {', '.join(request.model_families)})"
        )


def check_seconds(name: str, value: float, *, positive: bool, limit: float = math.inf) -> None:
    """A duration option that is no run option's field (--serve-timeout, --block-time), checked as theirs are."""
    if found := seconds_problem(name, value, positive=positive, limit=limit):
        raise RequestError(found)


def check_measuring(request: RunOptions) -> None:
    """Every run option's own check (its field's bound, choices or duration: harness.core.options), then
    what depends on another option: --max-iterations at least --iterations, and the machine label."""
    check(request, declared(RunOptions))
    check_count("--max-iterations", request.max_iterations, MAX_ITERATIONS, low=request.iterations)
    check_ceilings(request)
    try:
        machine_label(request.machine_label)
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def check_paths(request: RunOptions) -> None:
    """The store's file and the reports' directory can be written: found out now, not after the run."""
    if why := unwritable_file(Path(request.db_path)):
        raise RequestError(f"--db {request.db_path}: {why}; nothing was run")
    if request.output_dir is not None and (why := unwritable_directory(Path(request.output_dir))):
        raise RequestError(f"--output-dir {request.output_dir}: {why}; nothing was run")


def check_ceilings(request: RunOptions) -> None:
    """--ceilings-only, --ceilings and --no-ceilings together, and what --ceilings-only would leave unused."""
    if request.no_ceilings and (request.ceilings_only or request.ceilings == "fresh"):
        given = "--ceilings-only" if request.ceilings_only else "--ceilings fresh"
        raise RequestError(f"{given} measures ceilings and --no-ceilings measures none: drop one of them")
    if not request.ceilings_only:
        return
    named = [flag for flag, value in (("--model", request.models), ("--model-families", request.model_families),
             ("--small-models", request.small_models), ("--model-path", request.model_path),
             ("--profile", request.profile)) if value]  # fmt: skip
    if named:
        raise RequestError(f"--ceilings-only runs no model: drop {', '.join(named)}")
