"""One (model, target) job: load once per precision, then measure every case, in a worker process.

The child yields one Result per case as it completes; the parent (run_job) records every case
the child never reported with the outcome that stopped it (timeout, crash signal, oom).
"""

from __future__ import annotations

import ctypes
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby

from harness.isolation import classify, run_isolated
from harness.measure import MeasureConfig, measure
from harness.memory import PeakRss, rss_mb
from harness.parity import compare
from harness.prepare import PreparedModel
from harness.result import Case, Result, Target


@dataclass(frozen=True)
class Job:
    prepared: PreparedModel
    target: Target
    cases: list[Case]
    measure: MeasureConfig


def result_for(job: Job, case: Case, status: str, error: str | None = None, **fields: object) -> Result:
    """A Result carrying the job's model facts; measured fields come in **fields."""
    prepared = job.prepared
    details = {
        "weights_source": prepared.weights_source,
        "reference": prepared.reference,
        "export": prepared.export,
        "parameters": prepared.parameters,
    } | dict(fields.pop("details", {}))  # type: ignore[arg-type]
    return Result(
        model=prepared.spec.name,
        family=prepared.spec.family,
        weights=prepared.weights,
        target=job.target,
        case=case,
        status=status,
        error=error,
        details=details,
        **fields,  # type: ignore[arg-type]
    )


def _measure_case(job: Job, session: object, case: Case, load_facts: dict, rss: PeakRss) -> Result:
    feeds, reference = job.prepared.load_case((case.batch_size, case.seq_len))
    measured = measure(session, feeds, job.measure, rss)  # type: ignore[arg-type]
    parity = compare(measured.outputs, reference, session.precision)  # type: ignore[attr-defined]
    details = dict(session.facts) | {  # type: ignore[attr-defined]
        "parity_tolerance": parity.tolerance,
        "process_cpu_percent": measured.process_cpu_percent,
        "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
        "memory_method": rss.method,
        "nvml_used_mb": measured.nvml_used_mb,
    }
    return result_for(
        job,
        case,
        "ok" if parity.matches else "mismatch",
        None if parity.matches else f"max_abs_diff {parity.max_abs_diff:.3g} exceeds tolerance {parity.tolerance:.3g}",
        precision=session.precision,  # type: ignore[attr-defined]
        samples_ms=measured.samples_ms,
        first_run_ms=measured.first_run_ms,
        memory_peak_mb=measured.memory_peak_mb,
        device_memory_peak_mb=measured.device_memory_peak_mb,
        max_abs_diff=parity.max_abs_diff,
        max_rel_diff=parity.max_rel_diff,
        load_avg_1m=measured.load_avg_1m,
        cpu_percent=measured.cpu_percent,
        details=details,
        **load_facts,
    )


FAULT_ENV = "ACCELHARNESS_INJECT_FAULT"


def inject_fault(job: Job) -> None:
    """Testing hook: ACCELHARNESS_INJECT_FAULT=KIND[:MODEL[:ENGINE]] makes this worker fail for real.

    KIND is segfault, abort, hang or oom (an address-space limit, then an allocation past it).
    The fault matrix tests use it to prove a crash, hang or OOM leaves a correct row and the run goes on.
    """
    kind, model, engine = ([*os.environ.get(FAULT_ENV, "").split(":"), "", ""])[:3]
    if not kind or model not in ("", job.prepared.spec.name) or engine not in ("", job.target.engine):
        return
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "oom":
        limit = 2 * 2**30
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        bytearray(limit)


def benchmark_job(job: Job) -> Iterator[Result]:
    """Worker entry point: yields a Result per case."""
    from harness.native import get_backend
    from harness.native.base import LoadRequest

    inject_fault(job)
    backend = get_backend(job.target.engine)
    rss = PeakRss()
    for precision, group in groupby(job.cases, key=lambda c: c.precision):
        cases = list(group)
        first = cases[0]
        example, _ = job.prepared.load_case((first.batch_size, first.seq_len))
        request = LoadRequest(job.prepared.spec, job.prepared.onnx_path, precision, example)
        before_mb = rss_mb()
        started = time.perf_counter()
        try:
            session = backend.load(request, job.target)
        except Exception as exc:  # a load failure is that backend's outcome for every case
            status, message = classify(exc)
            for case in cases:
                yield result_for(job, case, status, message)
            continue
        load_facts = {"load_ms": (time.perf_counter() - started) * 1000, "memory_load_mb": rss_mb() - before_mb}
        for case in cases:
            try:
                yield _measure_case(job, session, case, load_facts, rss)
            except Exception as exc:  # one failing case does not stop the others
                status, message = classify(exc)
                yield result_for(job, case, status, message, **load_facts)


def run_job(job: Job, timeout_s: float, emit: Callable[[Result], None]) -> None:
    """Run a job in a worker; emit every case's Result, including those the worker never reached."""
    reported: set[str] = set()

    def on_result(result: Result) -> None:
        reported.add(result.case.key)
        emit(result)

    outcome = run_isolated(benchmark_job, job, timeout_s, on_result)
    for case in job.cases:
        if case.key not in reported:
            status = "error" if outcome.status == "finished" else outcome.status
            emit(result_for(job, case, status, outcome.message or "worker finished without reporting this case"))
