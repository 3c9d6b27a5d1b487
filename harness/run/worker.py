"""The work a run hands to child processes: preparing a model (prepare_isolated), and one (model,
target) job that loads once per precision, then measures every case (run_job).

The child yields one Result per case as it completes; the parent (run_job) records every case
the child never reported with the outcome that stopped it (timeout, crash signal, oom).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core.failures import classify
from harness.core.faults import injected_faults
from harness.core.generation import encoder_figures
from harness.core.parity import compare
from harness.core.records import Case, Ceiling, Control, Result, Target, UnsupportedError
from harness.core.threads import split_threads
from harness.native import capabilities
from harness.prepare.cache import remove_stale_staging
from harness.prepare.graph_work import GraphWork, count_graph
from harness.prepare.perplexity import StepBudget, engine_quality
from harness.prepare.prepared import Phase, PreparedModel, PrepareJob, needs_torch, prepare_steps
from harness.prepare.seq2seq import audio_seconds
from harness.run.ceilings import Calibration, Prior, measure_ceilings, row_work
from harness.run.control import ControlProbe, control_positions
from harness.run.isolation import Outcome, run_isolated, start_method
from harness.run.measure import MeasureConfig, Measurement, measure, measure_generation, measure_training
from harness.run.memory import PeakRss, rss_mb
from harness.run.profiling import profiled_fields

if TYPE_CHECKING:  # predict's generation count: the worker that runs benchmarks never needs it
    from harness.prepare.graph_work import GenerationJob, GenerationWork


@dataclass(frozen=True)
class Job:
    prepared: PreparedModel
    target: Target
    cases: list[Case]
    measure: MeasureConfig
    calibrations: tuple[Calibration, ...] = ()  # the target's ceilings this job measures first (run.ceilings)
    prior: tuple[Prior, ...] = ()  # the target's earlier ceilings it may take instead (run.ceiling_reuse)


def _run_mode(job: Job, session: Any, case: Case, feeds: dict[str, np.ndarray], rss: PeakRss,
              eos: tuple[int, ...] = ()) -> Measurement:  # fmt: skip
    if case.mode == "inference":
        return measure(session, feeds, job.measure, rss)
    if case.mode == "generate" and hasattr(session, "generate"):
        return measure_generation(session, feeds, job.measure, case.new_tokens or 1, rss, eos, case.depth or 0)
    if case.mode == "training" and hasattr(session, "train_step"):
        return measure_training(session, feeds, job.measure, rss)
    engine, can = job.target.engine, capabilities(job.target.engine)
    if case.mode == "generate" and case.mode in can.modes and can.generate_needs_past_export:
        why = job.prepared.onnx_past_error or "only decoder-only models (GPT-2, LLaMA, Qwen2) have one"
        raise UnsupportedError(f"generate mode on {engine} needs the ONNX export with past key/values: {why}")
    runs = ", ".join(can.modes)
    raise UnsupportedError(f"{case.mode} mode: the {engine} session has no {case.mode} support ({engine} runs {runs})")


def _measure_case(job: Job, session: Any, case: Case, load_facts: dict, rss: PeakRss) -> Result:
    feeds, reference = job.prepared.load_case((case.batch_size, case.seq_len), case.audio_seconds,
                                              on_graph=_on_graph(job, case.mode))  # fmt: skip
    eos = job.prepared.eos if case.mode == "generate" else ()  # the ids --stop-at-eos stops at, or ()
    measured = _run_mode(job, session, case, feeds, rss, eos)
    items = (1 + measured.budget["warmup_run"] + len(measured.samples_ms)) * case.batch_size
    load = dict(load_facts)  # load_ms and memory_load_mb as fields, whose load they are in details
    details = dict(session.facts) | {
        "process_cpu_percent": measured.process_cpu_percent,
        "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
        "memory_method": rss.method,
        "nvml_used_mb": measured.nvml_used_mb,
        "energy_source": measured.energy_source,  # the sensor, or why there is none
        **measured.budget,  # max_time_s, warmup_run, budget_stopped
    }
    details |= load.pop("details")
    seconds = audio_seconds(feeds, case.audio_seconds) if case.mode == "generate" else None
    if measured.encoder_samples_ms or seconds:  # an encoder–decoder's encoder phase; speech's real-time factor
        figures = encoder_figures(measured.encoder_samples_ms, measured.samples_ms, seconds)
        details |= figures | {"encoder_samples_ms": measured.encoder_samples_ms or None, "audio_seconds": seconds}
    text: dict[str, Any] = {}
    if case.mode == "generate":  # speech has no prompt tokens (input_ids None), but its output is text
        text = job.prepared.text_fields(feeds.get("input_ids"), measured.generated_tokens, details)
        # untimed, after the timed loop: the passage's perplexity and the row beside fp32, on its own session
        budget = StepBudget(job.measure.max_time_s)
        details |= engine_quality(session, job.prepared, feeds, measured.generated_tokens, case.depth or 0,
                                  job.target.engine, budget)  # fmt: skip
    operators = []
    if job.measure.profile_iterations > 0:
        error = measured.profile_error or (None if case.mode == "inference" else "profiles cover inference only")
        # the file the session ran, else the export the engine's module matches (not the export with past's)
        model_file = getattr(session, "path", None) or (None if job.prepared.prefill_files else job.prepared.onnx_path)
        operators, profiled = profiled_fields(model_file, details["input_shapes"], measured.profile, error)
        details |= profiled
    model_file = _ran_file(job, session, case)
    work, counted = row_work(model_file, case, details["input_shapes"])
    details |= counted
    if model_file is not None and getattr(session, "path", None) is None and work:
        details["work_counted_on"] = "the model's fp32 ONNX export: the engine ran the same module in fp32 itself"
    status, error, parity_fields = "ok", None, {}
    if not reference:  # a file no reference engine could run: measured, not parity-checked
        details["parity"] = f"not checked: no reference ({job.prepared.reference})"
    elif case.mode == "inference":  # generated tokens and trained weights have no fixed reference
        parity = compare(measured.outputs, reference, session.precision, job.prepared.output_names)
        details |= parity.details
        status, error, parity_fields = parity.status, parity.error, parity.fields
    return job.prepared.result(
        job.target,
        case,
        status,
        error,
        precision=session.precision,
        samples_ms=measured.samples_ms,
        ttft_samples_ms=measured.ttft_samples_ms,
        tpot_samples_ms=measured.tpot_samples_ms,
        step_samples_ms=measured.step_samples_ms,
        generated_tokens=measured.generated_tokens,
        first_run_ms=measured.first_run_ms,
        memory_peak_mb=measured.memory_peak_mb,
        device_memory_peak_mb=measured.device_memory_peak_mb,
        load_avg_1m=measured.load_avg_1m,
        cpu_percent=measured.cpu_percent,
        # the meter spans first run + warmup + timed loop, so divide by every item in it
        energy_j_per_item=measured.energy_j / items if measured.energy_j is not None else None,
        # JIT engines compile per input shape in prepare(), outside the samples; read after measuring
        compile_ms=getattr(session, "compile_ms", None),
        details=details,
        operators=operators,
        **parity_fields,
        **load,
        **(text if case.mode == "generate" else {}),
        **work,
    )


def _on_graph(job: Job, mode: str) -> bool:
    """Whether the job's inference runs the model's ONNX graph (its case as that graph takes it: a prefill where
    it is the export with past), not a module the engine builds itself (torch, JAX: the module's own case)."""
    return mode == "inference" and capabilities(job.target.engine).needs_onnx


def _ran_file(job: Job, session: Any, case: Case) -> Any:
    """The ONNX file the session ran (its own path), else the model's fp32 export where the engine ran the model
    in fp32 (from that export, or its own module of the same weights: the same reads and FLOPs per token);
    None where no file says what ran (another precision, built by the engine itself)."""
    if (path := getattr(session, "path", None)) is not None:
        return path
    if session.precision != "fp32":
        return None
    if case.mode == "generate":
        return job.prepared.onnx_past_path
    # the export with past computes the last position's logits only: not what the module's inference computed
    return None if job.prepared.prefill_files else job.prepared.onnx_path


GRANDCHILD_MARK = "accelharness-fault-grandchild"  # in the grandchild fault's command line, for tests to find it


def injected_fault(job: Any) -> str | None:
    """The fault ACCELHARNESS_INJECT_FAULT asks of this job: the first KIND[:MODEL[:ENGINE]] of its
    comma-separated list whose model and engine (empty: any) are the job's."""
    for fault in injected_faults():
        kind, model, engine = ([*fault.split(":"), "", ""])[:3]
        if model in ("", job.prepared.spec.name) and engine in ("", job.target.engine):
            return kind
    return None


def inject_fault(job: Any) -> None:
    """Testing hook: ACCELHARNESS_INJECT_FAULT=KIND[:MODEL[:ENGINE]][,…] makes this worker fail for real.
    job: a Job, or an ab variant's job (harness.ab.worker): anything with .prepared and .target.

    KIND is segfault, abort, hang, oom (an address-space limit, then an allocation past it) or
    grandchild (start a sleeping child process, as an engine's helper might, then hang).
    The fault matrix tests use it to prove a crash, hang or OOM leaves a correct row and the run goes
    on; several faults in one list let one run prove them all side by side.
    """
    kind = injected_fault(job)
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()
    elif kind in ("hang", "grandchild"):
        if kind == "grandchild":
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", GRANDCHILD_MARK])
        while True:
            time.sleep(3600)
    elif kind == "oom":
        limit = 2 * 2**30
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        bytearray(limit)


def benchmark_job(job: Job) -> Iterator[Result | Control]:
    """Worker entry point: yields a Result per case, and the drift control (harness.run.control)
    measured on the job's target before its first case, after its middle one and after its last."""
    from harness.native import get_backend

    inject_fault(job)
    backend = get_backend(job.target.engine)
    probe = ControlProbe(backend, job.target, job.prepared.spec.name)
    positions = control_positions(len(job.cases))
    yield probe.measure(positions[-1])
    yield from measure_ceilings(backend, job.target, job.calibrations, job.prior)
    for index, result in enumerate(_case_results(job, backend)):
        yield result
        if index in positions:
            yield probe.measure(positions[index])


def _case_results(job: Job, backend: Any) -> Iterator[Result]:
    """A Result per case of the job, loading the model once per (precision, mode)."""
    from harness.native.base import LoadRequest, others_busy_cpus

    rss = PeakRss()
    # One load per (precision, mode): a training step changes the weights later cases would use.
    for (precision, mode), group in groupby(job.cases, key=lambda c: (c.precision, c.mode)):
        cases = list(group)
        first = cases[0]
        example, _ = job.prepared.load_case((first.batch_size, first.seq_len), on_graph=_on_graph(job, mode))
        past = job.prepared.onnx_past_path if mode == "generate" else None  # ONNX generation's graph
        target, threads = split_threads(job.target)  # the engine sees its own provider and the count apart
        # the machine's other load, for an engine that reads it: read before the load's timer, as it sleeps 0.2 s
        busy = others_busy_cpus() if capabilities(job.target.engine).reads_machine_load else None
        gguf = job.prepared.gguf_files.get(precision)  # the GGUF of the weights an engine that runs one loads
        request = LoadRequest(job.prepared.spec, job.prepared.onnx_path, precision, example, onnx_past_path=past,
                              threads=threads, others_busy_cpus=busy, gguf_path=Path(gguf) if gguf else None,
                              gguf_error=job.prepared.gguf_error)  # fmt: skip
        before_mb = rss_mb()
        started = time.perf_counter()
        try:
            session = backend.load(request, target)
        except Exception as exc:  # a load failure is that backend's outcome for every case
            status, message = classify(exc)
            for case in cases:
                yield job.prepared.result(job.target, case, status, message)
            continue
        children = getattr(session, "children_memory", None)  # a child the load started holds its memory too
        load_facts = {
            "load_ms": (time.perf_counter() - started) * 1000,
            "memory_load_mb": rss_mb() - before_mb + (children.rss_mb() if children is not None else 0.0),
            # one load serves every case of the group: each row carries its figures and says so
            "details": {"load_measured_with": first.key, "load_shared_by": len(cases)},
        }
        # An engine may read some facts lazily (ONNX Runtime's computed precision optimizes the graph once
        # more): read them here, after the load is timed and before a case's memory and CPU are observed.
        _ = session.facts
        for case in cases:
            try:
                yield _measure_case(job, session, case, load_facts, rss)
            except Exception as exc:  # one failing case does not stop the others
                status, message = classify(exc)
                yield job.prepared.result(job.target, case, status, message, **load_facts)


def run_job(job: Job, timeout_s: float, emit: Callable[[Result | Control], None]) -> None:
    """Run a job in a worker; emit every case's Result, including those the worker never reached,
    and the worker's drift-control measurements."""
    reported: set[str] = set()
    uses_torch = capabilities(job.target.engine).worker_needs_torch

    def on_result(result: Result | Control) -> None:
        if isinstance(result, Control | Ceiling):
            emit(result)
            return
        reported.add(result.case.key)
        result.details["worker_start"] = start_method(uses_torch)  # forked workers share torch's pages
        emit(result)

    outcome = run_isolated(benchmark_job, job, timeout_s, on_result, uses_torch=uses_torch)
    for case in job.cases:
        if case.key not in reported:
            status = "error" if outcome.status == "finished" else outcome.status
            emit(
                job.prepared.result(
                    job.target, case, status, outcome.message or "worker finished without reporting this case"
                )
            )


def count_isolated(job: PrepareJob, timeout_s: float) -> GraphWork:
    """A model's graph work per case (harness.prepare.graph_work), counted in a child process: the
    exporter runs there when the export is not cached. Raises RuntimeError saying why it failed."""
    found: list[GraphWork] = []
    outcome = run_isolated(count_graph, job, timeout_s, found.append, uses_torch=not job.spec.is_onnx_file)
    if not found:
        raise RuntimeError(f"counting {job.spec.name}'s graph failed ({outcome.status}): {outcome.message}")
    return found[0]


def count_generation_isolated(job: GenerationJob, timeout_s: float) -> GenerationWork:
    """A model's generation graph counted at each case (harness.prepare.graph_work.count_generation), in a
    child process as count_isolated counts. Raises RuntimeError saying why it failed."""
    from harness.prepare.graph_work import count_generation, generation_needs_torch

    found: list[GenerationWork] = []
    outcome = run_isolated(count_generation, job, timeout_s, found.append, uses_torch=generation_needs_torch(job.spec))
    if not found:
        raise RuntimeError(f"counting {job.spec.name}'s generation graph failed ({outcome.status}): {outcome.message}")
    return found[0]


# Who is shown a preparation's phases (the CLI's progress line): a list, as suites prepare from several threads.
_phase_listeners: list[Callable[[Phase], None]] = []


@contextlib.contextmanager
def phases_shown(listener: Callable[[Phase], None]) -> Iterator[None]:
    """Within the block, every preparing child's Phase (exporting, reference tokens, …) reaches `listener`."""
    _phase_listeners.append(listener)
    try:
        yield
    finally:
        _phase_listeners.remove(listener)


def prepare_isolated(job: PrepareJob, timeout_s: float) -> tuple[PreparedModel | None, Outcome]:
    """Prepare in a child process (torch and the exporters may crash or hang): the model, or None and why.
    Its own phase, bounded by --prepare-timeout per step (each Phase the child reports moves the deadline)."""
    found: list[PreparedModel] = []

    def on_item(item: Phase | PreparedModel) -> None:
        if isinstance(item, Phase):
            for listener in list(_phase_listeners):
                listener(item)
        else:
            found.append(item)

    uses_torch = not job.spec.is_gguf_file and _prepare_needs_torch(job)
    steps = prepare_steps
    if job.spec.is_gguf_file:  # llama.cpp is a GGUF's tokenizer and reference: prepared with it
        from harness.run.gguf_prepare import prepare_gguf_steps

        steps = prepare_gguf_steps
    try:
        outcome = run_isolated(steps, job, timeout_s, on_item, uses_torch=uses_torch, limit="--prepare-timeout")
    finally:  # a killed, crashed or interrupted export never ran its cleanup: its worker is gone now
        remove_stale_staging()
    return (found[0] if found else None), outcome


def _prepare_needs_torch(job: PrepareJob) -> bool:
    """Fork the prepare from the torch fork server only where it builds the module: a warm-cache
    prepare reads files, and a run without torch then starts no fork server at all."""
    try:
        return needs_torch(job)
    except Exception:  # an unreadable cache entry: the worker meets it, isolated, and says why
        return True
