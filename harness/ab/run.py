"""`accelharness ab`: two variants measured interleaved in one run, for a verdict that survives a
noisy machine.

Two runs measured one after the other differ by the machine's drift between them (other load,
clocks, caches), often by more than the change a user looks for. Here both variants are measured at
the same time instead: each is loaded once, in its own worker process (harness.ab.worker), for
the whole run; for every case the two workers take turns in rounds, each round a block of
iterations from A and one from B, in ABBA order (which one starts is drawn afresh per case), so
whatever the machine does hits both alike. The rows of both variants go into the store as one run,
each sample tagged with its round; harness.analysis.paired turns the per-round ratios into a verdict.

A variant is a model (a spec name, an HF model directory or an .onnx file), with optionally its own
precision or its own Python environment (another onnxruntime release, say: that environment needs
accelharness installed). Cases and targets are the same for both.

from harness import AbRequest, run_ab, compare_pair
summary = run_ab(AbRequest(a="bert-tiny", b="bert-tiny", b_precision="int8", hardware=["cpu"]))
print(compare_pair(summary.db_path, summary.run_id))
"""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.ab.rounds import CaseFailure, WorkerFailure, schedule
from harness.ab.web_plan import check_browser_half, web_pairs, web_plan
from harness.ab.worker import VariantJob
from harness.browser.run import ALL_BROWSERS, EpSetting, WebPlan, WebRequest
from harness.core.bounds import MAX_ITERATIONS, MAX_ROUNDS
from harness.core.options import check, declared, items, option, reuse
from harness.core.records import PRECISIONS, VARIANTS, Case, Result, Target
from harness.core.stats import MIN_PAIRED_ROUNDS
from harness.native import capabilities
from harness.native.base import Availability
from harness.prepare.prepared import PreparedModel, PrepareJob, unprepared_result
from harness.prepare.specs import ModelSpec, SpecError, select_specs, spec_from_path
from harness.run.isolation import describe_exit, oom_kill_count
from harness.run.plan import (
    BenchmarkRequest,
    RequestError,
    RunOptions,
    check_engines,
    check_measuring,
    check_paths,
    check_shapes,
    choose_targets,
    engines_option,
)
from harness.run.recording import Emit, RunSummary, record_run
from harness.run.worker import prepare_isolated

PROBE_OK = "accelharness ab worker importable"
EXIT_GRACE_S = 5.0  # how long a worker whose stdin closed may take to exit before it is killed


VARIANT_HELP = "A spec name (`accelharness models`), an HF model directory or an .onnx file."
PYTHON_HELP = "Another environment's python for variant {side} (with accelharness installed), e.g. another onnxruntime."
BLOCK_TIME_LIMIT_S = 3600.0  # seconds per variant and round: a block longer than an hour is no round


@dataclass
class AbRequest(RunOptions):
    # variant A's model: a spec name, an HF model directory or an .onnx file
    a: str = option("", flag="--a", help=f"Variant A (the baseline). {VARIANT_HELP}")
    b: str = option("", flag="--b", help=f"Variant B (the change). {VARIANT_HELP}")
    hardware: list[str] | None = reuse(BenchmarkRequest, "hardware", default=None)  # None: cpu, unless web_hardware
    # browser EPs (wasm, webgpu, webnn): both variants in one page; None: no browser half
    web_hardware: list[str] | None = reuse(WebRequest, "hardware", prefix="web", default=None)
    threads: list[int] = reuse(WebRequest, "threads", factory=lambda: [1])  # wasm threads, as `web --threads`
    # the browsers the browser half runs in, as `web --browser` (each its own pairs: harness.ab.web)
    browsers: list[str] = reuse(WebRequest, "browsers", factory=lambda: ["chromium"])
    browser_path: Path | None = reuse(WebRequest, "browser_path", default=None)
    driver: str = reuse(WebRequest, "driver", default="process")
    webdriver_url: str | None = reuse(WebRequest, "webdriver_url", default=None)
    # A in one browser, B in another, interleaved (harness.ab.web_plan): the verdict is the browsers'
    a_browser: str | None = option(
        None, flag="--a-browser", choices=ALL_BROWSERS, noun="browser",
        help=f"The browser half: variant A's browser ({', '.join(ALL_BROWSERS)}), with --b-browser B's, instead of "
        "--browser (both in each): the browsers compared, interleaved.",
    )  # fmt: skip
    b_browser: str | None = option(
        None, flag="--b-browser", choices=ALL_BROWSERS, noun="browser",
        help=f"The browser half: variant B's browser ({', '.join(ALL_BROWSERS)}), with --a-browser A's.",
    )  # fmt: skip
    engines: list[str] | None = engines_option()  # None: the default engines
    # precision (RunOptions'): both variants', unless a_precision / b_precision say otherwise
    a_precision: str | None = option(
        None, flag="--a-precision", choices=PRECISIONS, noun="precision",
        help=f"Variant A's precision instead of --precision: one of {', '.join(PRECISIONS)}.",
    )  # fmt: skip
    b_precision: str | None = option(
        None, flag="--b-precision", choices=PRECISIONS, noun="precision",
        help=f"Variant B's precision instead: one of {', '.join(PRECISIONS)}.",
    )  # fmt: skip
    # the interpreter of variant A's environment (None: this one)
    a_python: Path | None = option(None, flag="--a-python", help=PYTHON_HELP.format(side="A"))
    b_python: Path | None = option(None, flag="--b-python", help=PYTHON_HELP.format(side="B"))
    # Many short rounds rather than a few long ones: a burst of load on a shared machine spoils the
    # rounds it falls in, and the signed-rank test shrugs off a few spoiled rounds out of 20 (two
    # spoiled out of 10 already cost it p < 0.05).
    rounds: int = option(
        20, flag="--rounds", low=MIN_PAIRED_ROUNDS, high=MAX_ROUNDS,
        help="Rounds per case: a block of A and one of B each.",
    )  # fmt: skip
    # at least this many iterations per variant and round…
    block: int = option(3, flag="--block", low=1, high=MAX_ITERATIONS, help="Fewest iterations per variant and round.")
    block_time_s: float = option(  # …and at least this long
        0.05, flag="--block-time", seconds=(False, BLOCK_TIME_LIMIT_S), help="Fewest seconds per variant and round."
    )


@dataclass(frozen=True)
class Variant:
    side: str  # a | b
    spec: ModelSpec
    precision: str
    python: str  # the interpreter its worker runs in


@dataclass
class AbPlan:
    variants: list[Variant]
    targets: list[tuple[Target, Availability]]
    request: AbRequest
    web: WebPlan | None = None  # the browser half's EP settings and launch (--web-hardware)

    def cases(self, variant: Variant) -> list[Case]:
        shapes = variant.spec.case_shapes(self.request.batch_sizes, self.request.sequence_lengths)
        return [Case(b, s, variant.precision) for b, s in shapes]

    @property
    def web_pairs(self) -> list[dict[str, EpSetting]]:
        """The browser half's pairs of EP settings, a side's each (harness.ab.web_plan)."""
        return web_pairs(self.request, self.web) if self.web else []

    @property
    def total_results(self) -> int:
        return sum(len(self.cases(v)) for v in self.variants) * (len(self.targets) + len(self.web_pairs))


# --- the request -----------------------------------------------------------------------------------
def _spec(option: str, text: str) -> ModelSpec:
    try:
        if Path(text).exists():
            spec = spec_from_path(Path(text), None)
            if spec.is_gguf_file:  # ab's variants run on ONNX Runtime and torch; a GGUF has no graph for them
                raise SpecError("a GGUF runs on llama.cpp, with `run` or `web --model-path`, not in ab")
            return spec
        (spec,) = select_specs([text], None, False)
        return spec
    except SpecError as exc:
        raise RequestError(
            f"{option} {text}: {exc} (a variant is a model name, an HF model directory or an .onnx file)"
        ) from None


def _python(option: str, path: Path | None) -> str:
    """The variant's interpreter, checked to import the harness (its worker runs there)."""
    if path is None:
        return sys.executable
    if not (Path(path).is_file() and os.access(path, os.X_OK)):
        raise RequestError(f"{option} {path}: not an executable file (give the environment's bin/python)")
    probe = subprocess.run(
        [str(path), "-c", f"import harness.ab.worker; print('{PROBE_OK}')"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    if probe.returncode != 0 or PROBE_OK not in probe.stdout:  # an executable that is not that Python prints nothing
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise RequestError(
            f"{option} {path} cannot import accelharness ({last}): install it into that environment "
            f"(`{path} -m pip install accelharness`, or -e with this checkout)"
        )
    return str(path)


def validate_ab(request: AbRequest) -> AbPlan:
    """Check every input before anything is written; raise RequestError naming the valid values."""
    if not request.a or not request.b:
        raise RequestError("ab needs both variants: --a MODEL and --b MODEL (a name, an HF directory or an .onnx file)")
    check_shapes(request)
    check_measuring(request)
    if request.ceilings_only:
        raise RequestError("--ceilings-only: ab compares two models; a machine's ceilings: `run` or `native`")
    if request.modes != ["inference"]:
        raise RequestError(f"ab compares inference only (got modes {', '.join(request.modes)})")
    if request.prompt is not None or request.prompt_ids is not None or request.chat or request.stop_at_eos:
        raise RequestError("ab draws each case's inputs: it takes no prompt (prompt, prompt_ids, chat) or stop_at_eos")
    if request.rounds < MIN_PAIRED_ROUNDS:
        raise RequestError(
            f"--rounds must be >= {MIN_PAIRED_ROUNDS} (got {request.rounds}): with fewer paired rounds the "
            "signed-rank test can never show a change"
        )
    check(request, declared(AbRequest), ("rounds", "block", "block_time_s", "threads", "web_hardware", "a_browser",
                                         "b_browser"))  # fmt: skip
    if request.rounds * request.block > MAX_ITERATIONS:  # a variant's iterations per case, as --max-iterations
        raise RequestError(
            f"--rounds × --block: at most {MAX_ITERATIONS:,} iterations per variant and case "
            f"(got {request.rounds} × {request.block})"
        )
    _check_precisions(request)
    engines = check_engines(request.engines, request.hardware)
    check_paths(request)
    specs = {side: _spec(f"--{side}", getattr(request, side)) for side in VARIANTS}
    if specs["a"].inputs.uses_sequence != specs["b"].inputs.uses_sequence:
        raise RequestError(f"--a {specs['a'].name} and --b {specs['b'].name} take different inputs: no case fits both")
    variants = [
        Variant(side, specs[side], getattr(request, f"{side}_precision") or request.precision or "fp32",
                _python(f"--{side}-python", getattr(request, f"{side}_python")))
        for side in VARIANTS
    ]  # fmt: skip
    check_browser_half(request)
    web = web_plan(request) if request.web_hardware else None
    if any(v.python != sys.executable for v in variants) and web is not None:
        raise RequestError("--a-python/--b-python choose a native worker's environment; the browser half has none")
    hardware = request.hardware or ([] if web else ["cpu"])
    targets = choose_targets(hardware, engines) if hardware else []
    if hardware and not targets:
        raise RequestError(f"no target serves hardware {request.hardware} with engines {engines}")
    return AbPlan(variants, targets, request, web)


def _check_precisions(request: AbRequest) -> None:
    """--precision, --a-precision, --b-precision: one precision each, each checked by its option."""
    options = declared(AbRequest)
    for name in ("precision", "a_precision", "b_precision"):
        opt, value = options[name], getattr(request, name)
        if value is not None and len(items(value)) != 1:
            raise RequestError(
                f"{opt.flag} {value}: a variant runs one precision; valid: {', '.join(opt.choices or ())}"
            )
        check(request, options, (name,))


# --- a variant's worker ----------------------------------------------------------------------------
class VariantWorker:
    """The parent's end of one variant's worker process (harness.ab.worker)."""

    def __init__(self, variant: Variant, job: VariantJob, timeout_s: float, scratch: Path) -> None:
        self.variant, self.timeout_s = variant, timeout_s
        job_file = scratch / f"{variant.side}.job"
        job_file.write_bytes(pickle.dumps(job))
        self.log_path = scratch / f"{variant.side}.log"
        self.log: IO[bytes] = self.log_path.open("wb")
        self.oom_before = oom_kill_count()
        self.process = subprocess.Popen(
            [variant.python, "-m", "harness.ab.worker", str(job_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,  # its own process group: whatever the engine starts dies with it
        )

    def ask(self, **command: Any) -> dict[str, Any]:
        """Send one command and wait for its answer; raise WorkerFailure when the worker dies or hangs,
        CaseFailure when the command failed inside it."""
        assert self.process.stdin is not None and self.process.stdout is not None
        name = f"variant {self.variant.side.upper()}'s worker"
        try:
            self.process.stdin.write((json.dumps(command) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            raise self._died(name) from None
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout_s)
        if not ready:
            self.kill()
            raise WorkerFailure(self.variant.side, "timeout", f"{name} did not answer '{command['op']}' within "
                                f"{self.timeout_s:g} s")  # fmt: skip
        line = self.process.stdout.readline()
        if not line:
            raise self._died(name)
        answer = json.loads(line)
        if "failed" in answer:
            raise CaseFailure(self.variant.side, answer["failed"], answer["error"])
        return answer

    def _died(self, name: str) -> WorkerFailure:
        outcome = describe_exit(self.process.wait(), self.log_path, self.oom_before)
        return WorkerFailure(self.variant.side, outcome.status, f"{name}: {outcome.message}")

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """End the worker: its stdin closed, it exits; one that does not (a hang) is killed with its group."""
        with suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
        self.log.close()


@contextmanager
def variant_workers(
    jobs: dict[str, tuple[Variant, VariantJob]], timeout_s: float
) -> Iterator[dict[str, VariantWorker]]:
    with tempfile.TemporaryDirectory(prefix="accelharness-ab-") as scratch, ExitStack() as stack:
        workers = {}
        for side, (variant, job) in jobs.items():
            workers[side] = VariantWorker(variant, job, timeout_s, Path(scratch))
            stack.callback(workers[side].stop)
        yield workers


# --- measuring -------------------------------------------------------------------------------------
@dataclass
class SideRecord:
    """What one variant measured of one case, round by round."""

    samples_ms: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    load_avgs: list[float] = field(default_factory=list)
    cpu_percents: list[float] = field(default_factory=list)
    memory_peak_mb: float | None = None
    first_run_ms: float | None = None
    parity: dict[str, Any] | None = None

    def add(self, number: int, block: dict[str, Any]) -> None:
        self.samples_ms += block["samples_ms"]
        self.rounds += [number] * len(block["samples_ms"])
        self.load_avgs.append(block["load_avg_1m"])
        self.cpu_percents.append(block["cpu_percent"])
        self.memory_peak_mb = max(self.memory_peak_mb or 0.0, block["memory_peak_mb"])
        if "parity" in block:
            self.parity = block["parity"]


def measure_case(workers: dict[str, VariantWorker], index: int, case_key: str, target: Target,
                 request: AbRequest) -> dict[str, SideRecord]:  # fmt: skip
    records = {side: SideRecord() for side in VARIANTS}
    for side in VARIANTS:
        records[side].first_run_ms = workers[side].ask(op="warmup", case=index, iterations=request.warmup)[
            "first_run_ms"
        ]
    for number, order in enumerate(schedule(request.rounds, target, case_key)):
        for side in order:
            block = workers[side].ask(
                op="block", case=index, iterations=request.block, seconds=request.block_time_s, parity=number == 0
            )
            records[side].add(number, block)
    return records


# --- rows ------------------------------------------------------------------------------------------
@dataclass
class Side:
    """A variant on one target: its prepared model, its cases and what its load told."""

    variant: Variant
    prepared: PreparedModel
    cases: list[Case]
    loaded: dict[str, Any] = field(default_factory=dict)

    def row(self, target: Target, case: Case, status: str, error: str | None, **fields: Any) -> Result:
        details = {"ab": {"side": self.variant.side, "python": self.variant.python}} | fields.pop("details", {})
        return self.prepared.result(target, case, status, error, variant=self.variant.side, details=details, **fields)

    def measured_row(self, target: Target, case: Case, record: SideRecord, request: AbRequest) -> Result:
        parity = record.parity or {"status": "ok", "error": None, "fields": {}, "details": {}}
        ab = {"side": self.variant.side, "python": self.variant.python, "rounds": request.rounds,
              "block": request.block, "block_time_s": request.block_time_s}  # fmt: skip
        return self.prepared.result(
            target,
            case,
            parity["status"],
            parity["error"],
            variant=self.variant.side,
            precision=self.loaded["precision"],
            samples_ms=record.samples_ms,
            sample_rounds=record.rounds,
            load_ms=self.loaded["load_ms"],
            first_run_ms=record.first_run_ms,
            memory_peak_mb=record.memory_peak_mb,
            load_avg_1m=max(record.load_avgs),
            cpu_percent=sum(record.cpu_percents) / len(record.cpu_percents),
            details=self.loaded["facts"] | parity["details"] | {"ab": ab},
            **parity["fields"],
        )


def _fail_cases(sides: dict[str, Side], target: Target, indices: range, failure: CaseFailure, emit: Emit) -> None:
    """The cases at `indices`: the failed side's outcome, and the other side not measured (a lone
    side's samples have nothing to be paired with)."""
    for index in indices:
        for side, each in sides.items():
            case = each.cases[index]
            if side == failure.side:
                emit(each.row(target, case, failure.status, failure.message))
            else:
                why = f"not measured: variant {failure.side.upper()} failed ({failure.message[:300]})"
                emit(each.row(target, case, "error", why))


def run_target(sides: dict[str, Side], target: Target, request: AbRequest, emit: Emit) -> None:
    """Both variants' workers on one target, every case measured interleaved; two rows per case."""
    jobs = {s: (side.variant, VariantJob(side.prepared, target, side.variant.precision, side.cases))
            for s, side in sides.items()}  # fmt: skip
    count = len(sides["a"].cases)
    with variant_workers(jobs, request.timeout_s) as workers:
        try:
            for side in VARIANTS:
                sides[side].loaded = workers[side].ask(op="load")
        except CaseFailure as exc:  # a load failure is that side's outcome for every case
            _fail_cases(sides, target, range(count), exc, emit)
            return
        for index in range(count):
            try:
                records = measure_case(workers, index, sides["a"].cases[index].key, target, request)
            except WorkerFailure as exc:
                _fail_cases(sides, target, range(index, count), exc, emit)
                return
            except CaseFailure as exc:
                _fail_cases(sides, target, range(index, index + 1), exc, emit)
                continue
            for side in VARIANTS:
                emit(sides[side].measured_row(target, sides[side].cases[index], records[side], request))


# --- the run ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """A variant's prepared model, or the status and reason it has none."""

    variant: Variant
    model: PreparedModel | None
    status: str = "ok"
    why: str = ""

    def row(self, target: Target, case: Case, status: str, error: str) -> Result:
        """A row for a case this side did not measure."""
        if self.model is not None:
            return self.model.result(target, case, status, error, variant=self.variant.side)
        row = unprepared_result(self.variant.spec, target, case, status, error)
        row.variant = self.variant.side
        return row


def _prepare(variant: Variant, plan: AbPlan) -> Prepared:
    shapes = sorted({(c.batch_size, c.seq_len) for c in plan.cases(variant)}, key=str)
    # its own phase, bounded by --prepare-timeout (a cold export may take far longer than a case)
    model, outcome = prepare_isolated(PrepareJob(variant.spec, shapes), plan.request.prepare_timeout_s)
    if model is not None:
        return Prepared(variant, model)
    status = "error" if outcome.status == "finished" else outcome.status
    return Prepared(variant, None, status, f"model preparation failed: {outcome.message or 'no reason given'}")


def _blocked(prepared: dict[str, Prepared], target: Target | None, availability: Availability | None) -> dict | None:
    """Per side, the (status, reason) its cases get when the pair cannot run on the target at all (a
    side that could run is not measured alone); None when both can. availability None: a browser EP."""
    reasons = {}
    for side, each in prepared.items():
        can = capabilities(target.engine) if target is not None and availability is not None else None
        if availability is not None and not availability.ok:
            reasons[side] = ("unsupported", availability.reason)
        elif each.model is None:
            reasons[side] = (each.status, each.why)
        elif can is not None and each.variant.spec.is_onnx_file and not can.runs_onnx_files:
            reasons[side] = ("unsupported", "not applicable: the model is an .onnx file")
        elif (can is None or can.needs_onnx) and each.model.onnx_path is None:
            reasons[side] = ("unsupported", f"ONNX export failed: {each.model.onnx_error}")
    if not reasons:
        return None
    failed, (_, why) = next(iter(reasons.items()))
    for side in prepared:
        reasons.setdefault(side, ("error", f"not measured: variant {failed.upper()} cannot run ({why[:300]})"))
    return reasons


def _unpaired(plan: AbPlan, prepared: dict[str, Prepared]) -> dict[int, dict[str, tuple[str, str]]]:
    """The cases (by index) that a side could not prepare (harness.prepare.prepared: a case fails
    alone), with each side's (status, reason): the other side is not measured alone."""
    cases = {side: plan.cases(each.variant) for side, each in prepared.items()}
    unpaired = {}
    for index in range(len(cases["a"])):
        outcomes = {side: each.model.unprepared(cases[side][index]) if each.model else None
                    for side, each in prepared.items()}  # fmt: skip
        failing = [(side, outcome) for side, outcome in outcomes.items() if outcome]
        if failing:
            side, (_, reason) = failing[0]
            why = f"not measured: variant {side.upper()} cannot run this case ({reason[:300]})"
            unpaired[index] = {side: outcome or ("error", why) for side, outcome in outcomes.items()}
    return unpaired


def _paired_cases(plan: AbPlan, prepared: dict[str, Prepared], unpaired: dict, targets: dict[str, Target],
                  emit: Emit) -> dict:  # fmt: skip
    """Each side's cases both sides prepared; the others get their rows on the side's target here."""
    paired: dict[str, list[Case]] = {}
    for side, each in prepared.items():
        cases = plan.cases(each.variant)
        for index in unpaired:
            emit(each.row(targets[side], cases[index], *unpaired[index][side]))
        paired[side] = [case for index, case in enumerate(cases) if index not in unpaired]
    return paired


def execute_ab(plan: AbPlan) -> Callable[[Emit], None]:
    """The ab run as a body for harness.run.recording.record_run."""

    def body(emit: Emit) -> None:
        prepared = {v.side: _prepare(v, plan) for v in plan.variants}
        unpaired = _unpaired(plan, prepared)
        for target, availability in plan.targets:
            if reasons := _blocked(prepared, target, availability):
                _emit_blocked(plan, prepared, dict.fromkeys(VARIANTS, target), reasons, emit)
                continue
            cases = _paired_cases(plan, prepared, unpaired, dict.fromkeys(VARIANTS, target), emit)
            sides = {side: Side(each.variant, each.model, cases[side]) for side, each in prepared.items()}
            if cases["a"]:
                run_target(sides, target, plan.request, emit)  # type: ignore[arg-type]
        if plan.web is not None:
            _run_web(plan, plan.web, prepared, unpaired, emit)

    return body


def _emit_blocked(plan: AbPlan, prepared: dict[str, Prepared], targets: dict[str, Target], reasons: dict,
                  emit: Emit) -> None:  # fmt: skip
    for side, each in prepared.items():
        for case in plan.cases(each.variant):
            emit(each.row(targets[side], case, *reasons[side]))


def _run_web(plan: AbPlan, web: WebPlan, prepared: dict[str, Prepared], unpaired: dict, emit: Emit) -> None:
    """The browser half: both variants interleaved per pair of EP settings (harness.ab.web)."""
    from harness.ab.web import WebSide, run_web_pairs
    from harness.web.driver import run_sync

    pairs = plan.web_pairs
    targets = [{side: setting.target for side, setting in pair.items()} for pair in pairs]
    if reasons := _blocked(prepared, None, None):  # a browser EP blocks a pair for its model alone
        for each in targets:
            _emit_blocked(plan, prepared, each, reasons, emit)
        return
    cases = [_paired_cases(plan, prepared, unpaired, each, emit) for each in targets]
    paired = cases[0]  # the same cases on every pair
    sides = {side: WebSide(side, each.model, each.variant.precision, paired[side])
             for side, each in prepared.items()}  # type: ignore[arg-type]  # fmt: skip
    if paired["a"]:
        run_sync(run_web_pairs(web, plan.request, sides, pairs, emit))


def run_ab(request: AbRequest, on_result: Callable[[Result, str], None] | None = None,
           plan: AbPlan | None = None) -> RunSummary:  # fmt: skip
    """Measure the two variants interleaved; every pair of rows is committed as its case completes.
    Ctrl-C marks the run 'interrupted' and re-raises; finished cases stay in the store."""
    plan = plan or validate_ab(request)
    arguments = asdict(request)
    return record_run(
        request.db_path,
        "ab",
        arguments,
        [execute_ab(plan)],
        on_result,
        request.outputs,
        machine_label=request.machine_label,
    )
