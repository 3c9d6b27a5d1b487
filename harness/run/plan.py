"""A native benchmark request, checked before anything is written, and the plan it stands for:
model × target × case × mode, less what a resumed run already holds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.bounds import MAX_BATCH, MAX_ITERATIONS, MAX_NEW_TOKENS, MAX_SEQUENCE, out_of_range
from harness.core.paths import unwritable_directory, unwritable_file
from harness.core.records import MODES, PRECISIONS, Case, Target, result_key
from harness.native import DEFAULT_ENGINES, ENGINES, capabilities
from harness.native.base import Availability
from harness.prepare.folders import own_precision
from harness.prepare.greedy import generates_with_past
from harness.prepare.specs import ModelSpec, SpecError, check_families, select_specs, spec_from_path
from harness.run.hardware import NATIVE_PLATFORMS, native_targets
from harness.run.machine import machine_label
from harness.run.outputs import Outputs
from harness.store import DEFAULT_DB

DEFAULT_MAX_TIME_S = 10.0


class RequestError(ValueError):
    """Invalid user input: the message names what was wrong and what is valid."""


@dataclass
class RunOptions:
    """What every benchmark request shares: the model selection, the cases, the stop rule and the store."""

    models: list[str] | None = None
    model_families: list[str] | None = None
    small_models: bool = False
    model_path: Path | None = None
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    sequence_lengths: list[int] = field(default_factory=lambda: [32])
    warmup: int = 5
    iterations: int = 20
    min_duration_s: float = 0.5
    max_iterations: int = 10_000
    # The time budget of a case's warmup + timed loop (None: none); it never stops the loop below
    # min_iterations samples. The default keeps a 10 s/iteration software adapter to tens of seconds.
    max_time_s: float | None = DEFAULT_MAX_TIME_S
    min_iterations: int = 3
    timeout_s: float = 300.0
    db_path: Path = DEFAULT_DB
    output_dir: Path | None = Path("accelharness-results")
    profile: bool = False  # a few profiled iterations per inference case after its timed loop
    modes: list[str] = field(default_factory=lambda: ["inference"])
    new_tokens: int = 16  # generate mode: tokens generated per sequence (min = max)
    machine_label: str | None = None  # names this machine in reports across machines (harness.run.machine)

    @property
    def outputs(self) -> Outputs | None:
        """The after-run step's reports and matrix, in output_dir (None: write none)."""
        return Outputs(Path(self.output_dir)) if self.output_dir is not None else None


@dataclass
class BenchmarkRequest(RunOptions):
    hardware: list[str] | None = None  # None: every available native platform
    engines: list[str] | None = None
    precision: str | list[str] | None = None  # one, a list, or a comma-separated string; None: see precisions()


@dataclass
class Plan:
    specs: list[ModelSpec]
    targets: list[tuple[Target, Availability]]
    request: BenchmarkRequest
    done: frozenset[str] = frozenset()  # result keys a resumed run already holds: never run twice

    def cases(self, spec: ModelSpec, target: Target | None = None) -> list[Case]:
        """The cases of a spec on a target (all targets when None). Each mode is planned on the engines
        whose capabilities list it: generation for generative architectures only, and on an engine whose
        generation runs the export with past key/values only for the models that have one (the
        decoder-only GPT-2, LLaMA, Qwen2; not T5, Whisper or LLaVA). Combinations that don't apply are
        not planned rather than recorded."""
        shapes = spec.case_shapes(self.request.batch_sizes, self.request.sequence_lengths)
        cases = []
        with_past = generates_with_past(spec)  # a decoder's -past export, or a file whose graph takes past
        for mode in self.request.modes:
            if mode == "generate" and not (spec.is_generative or with_past):
                continue
            if target is not None and not capabilities(target.engine).plans(mode, with_past):
                continue
            tokens = self.request.new_tokens if mode == "generate" else None
            cases += [
                Case(b, s, p, mode, tokens)
                for p in precisions(self.request)  # grouped by precision: the worker loads once per precision
                for b, s in shapes
            ]
        return cases

    def exports_past(self, spec: ModelSpec) -> bool:
        """Whether preparing the spec needs its export with past key/values: an available target
        generates with it."""
        return any(
            case.mode == "generate"
            for target, availability in self.targets
            if capabilities(target.engine).generate_needs_past_export and availability.ok
            for case in self.cases(spec, target)
        )

    def remaining(self, spec: ModelSpec, target: Target) -> list[Case]:
        """The cases still to run on a target: all of them, less what a resumed run already holds."""
        return [c for c in self.cases(spec, target) if result_key(spec.name, target, c) not in self.done]

    @property
    def total_results(self) -> int:
        return sum(len(self.remaining(spec, target)) for spec in self.specs for target, _ in self.targets)


def precisions(request: BenchmarkRequest) -> list[str]:
    """The requested precisions, in order, without duplicates (validate() rejects an empty list). None given:
    a model folder's own precision where it holds one (an onnxruntime-genai int4 folder runs q4), else fp32."""
    if request.precision is None:
        return [(request.model_path and own_precision(Path(request.model_path))) or "fp32"]
    given = request.precision.split(",") if isinstance(request.precision, str) else request.precision
    return list(dict.fromkeys(p.strip() for p in given if p.strip()))


def check_count(name: str, values: int | list[int], high: int, low: int = 1) -> None:
    """A count option, or a list of them, within low..high (the bounds of harness.core.bounds)."""
    if problem := out_of_range(name, values, low, high):
        raise RequestError(problem)


def check_shapes(request: RunOptions) -> None:
    """The batch sizes and sequence lengths every benchmark request takes."""
    check_count("--batch-sizes", request.batch_sizes, MAX_BATCH)
    check_count("--sequence-lengths", request.sequence_lengths, MAX_SEQUENCE)


def validate(request: BenchmarkRequest) -> Plan:
    """Check every input before anything is written; raise RequestError naming the valid values."""
    check_shapes(request)
    if not precisions(request):
        raise RequestError(f"--precision needs at least one of: {', '.join(PRECISIONS)}")
    for precision in precisions(request):
        if precision not in PRECISIONS:
            raise RequestError(f"unknown precision '{precision}'; valid: {', '.join(PRECISIONS)}")
    for mode in request.modes:
        if mode not in MODES:
            raise RequestError(f"unknown mode '{mode}'; valid: {', '.join(MODES)}")
    check_measuring(request)
    engines = check_engines(request.engines, request.hardware)
    specs = check_selection(request)
    check_generation(request, specs, request.modes)
    check_paths(request)
    targets = choose_targets(request.hardware, engines)
    if not targets:
        raise RequestError(f"no target serves hardware {request.hardware} with engines {engines}")
    return Plan(specs, targets, request)


def check_generation(request: RunOptions, specs: list[ModelSpec], modes: list[str]) -> None:
    """--new-tokens within its bound, and every prompt plus its new tokens within each generative model's
    context: refused here, before anything is prepared, rather than failing inside the model."""
    check_count("--new-tokens", request.new_tokens, MAX_NEW_TOKENS)
    if "generate" in modes:
        check_context(specs, request.sequence_lengths, request.new_tokens)


def check_context(
    specs: list[ModelSpec],
    prompts: list[int],
    tokens: int,
    names: tuple[str, str] = ("--sequence-lengths", "--new-tokens"),
) -> None:
    """The longest prompt plus its new tokens within each generative model's context; `names` are the
    prompt lengths' and the new tokens' option (or config key) names the message gives."""
    longest = max(prompts)
    for spec in specs:
        if spec.is_generative and spec.context_length and longest + tokens > spec.context_length:
            raise RequestError(
                f"{spec.name} takes {spec.context_length} positions: a prompt of {longest} ({names[0]}) "
                f"plus {names[1]} {tokens} is {longest + tokens}; lower one of them"
            )


def check_engines(engines: list[str] | None, hardware: list[str] | None) -> list[str]:
    """The engines a native request runs (None: the default ones; an opt-in engine runs when named),
    each engine and hardware name checked."""
    chosen = engines or list(DEFAULT_ENGINES)
    for engine in chosen:
        if engine not in ENGINES:
            raise RequestError(f"unknown engine '{engine}'; valid: {', '.join(ENGINES)}")
    for hw in hardware or []:
        if hw not in NATIVE_PLATFORMS:
            raise RequestError(f"unknown native hardware '{hw}'; valid: {', '.join(NATIVE_PLATFORMS)}")
    return chosen


def choose_targets(hardware: list[str] | None, engines: list[str]) -> list[tuple[Target, Availability]]:
    """The available targets of each platform; a platform asked for by name that nothing here
    serves keeps its unavailable targets, so the run records them as `unsupported` with the reason."""
    chosen = []
    for platform in hardware or NATIVE_PLATFORMS:
        probed = native_targets([platform], engines)
        available = [(t, a) for t, a in probed if a.ok]
        chosen += available if available or not hardware else probed
    return chosen


def check_selection(request: RunOptions) -> list[ModelSpec]:
    """The specs a request's --model / --model-families / --small-models / --model-path select."""
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
    return specs


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


# The longest --timeout: beyond it a case is a hang, and asyncio/JS timers stop being exact.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def check_seconds(name: str, value: float, *, positive: bool, limit: float = math.inf) -> None:
    """A duration option: a finite number of seconds, > 0 (positive) or >= 0, and at most `limit`."""
    low_ok = value > 0 if positive else value >= 0
    if not (math.isfinite(value) and low_ok and value <= limit):
        bounds = f"{'> 0' if positive else '>= 0'}" + (f" and <= {limit:g}" if math.isfinite(limit) else "")
        raise RequestError(f"{name} takes a finite number of seconds {bounds} (got {value:g})")


def check_measuring(request: RunOptions) -> None:
    """The stop-rule and time-limit options every request shares."""
    check_count("--warmup", request.warmup, MAX_ITERATIONS, low=0)
    check_count("--iterations", request.iterations, MAX_ITERATIONS)
    check_count("--max-iterations", request.max_iterations, MAX_ITERATIONS, low=request.iterations)
    check_count("--min-iterations", request.min_iterations, MAX_ITERATIONS)
    check_seconds("--min-duration", request.min_duration_s, positive=False)
    if request.max_time_s is not None:
        check_seconds("--max-time", request.max_time_s, positive=True, limit=MAX_TIMEOUT_S)
    check_seconds("--timeout", request.timeout_s, positive=True, limit=MAX_TIMEOUT_S)
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
