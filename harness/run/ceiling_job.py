"""`--ceilings-only` natively: each target's ceilings (harness.run.ceilings) in a worker of its own, no model.

A run's other targets measure theirs in the first model job's worker (harness.run.worker.benchmark_job); here the
worker loads only the calibration graphs. A target that is not available, or whose worker dies, stores each of its
ceilings with the reason and no value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from harness.core.options import items
from harness.core.precision import MEANINGS, parse_precisions
from harness.core.records import Ceiling, Target
from harness.native import capabilities
from harness.run.ceilings import Calibration, Prior, measure_ceilings, new_ceiling, wanted
from harness.run.isolation import run_isolated


@dataclass(frozen=True)
class CeilingJob:
    target: Target
    calibrations: tuple[Calibration, ...]
    prior: tuple[Prior, ...] = ()  # the target's earlier ceilings it may take (harness.run.ceiling_reuse)


def calibrate(job: CeilingJob) -> Iterator[Ceiling]:
    """Worker entry point: the job's ceilings, one at a time."""
    from harness.native import get_backend

    yield from measure_ceilings(get_backend(job.target.engine), job.target, job.calibrations, job.prior)


def only_calibrations(precision: list[str] | str | None) -> tuple[Calibration, ...]:
    """What --ceilings-only measures: the bandwidth, and the compute ceiling of each --precision's class (of every
    class the precision table has, without one)."""
    given = None if precision is None else parse_precisions(items(precision))
    return tuple(wanted(given or MEANINGS, set()))


def measure_targets(plan: Any, emit: Callable[[Ceiling], None]) -> None:
    """--ceilings-only's native part: every planned target's ceilings (a harness.run.plan.Plan)."""
    calibrations = only_calibrations(plan.request.precision)
    for target, availability in plan.targets:
        if not availability.ok:
            for calibration in calibrations:
                emit(_failed(target, calibration, availability.reason or "not available"))
            continue
        prior = plan.ceilings.for_target(target, plan.request.ceilings)
        run_calibration(CeilingJob(target, calibrations, prior), plan.request.timeout_s, emit)


def run_calibration(job: CeilingJob, timeout_s: float, emit: Callable[[Ceiling], None]) -> None:
    """The job in a worker; each ceiling it never reported (a crash, a hang past timeout_s) stored with the reason."""
    reported: set[tuple[str, str]] = set()

    def on_item(ceiling: Ceiling) -> None:
        reported.add((ceiling.kind, ceiling.precision))
        emit(ceiling)

    uses_torch = capabilities(job.target.engine).worker_needs_torch
    outcome = run_isolated(calibrate, job, timeout_s, on_item, uses_torch=uses_torch)
    if outcome.status == "finished":
        return  # a calibration it took from this run itself reports nothing: stored already
    for calibration in job.calibrations:
        if (calibration.kind, calibration.precision) not in reported:
            emit(_failed(job.target, calibration, f"{outcome.status}: {outcome.message or 'the worker stopped'}"))


def _failed(target: Target, calibration: Calibration, why: str) -> Ceiling:
    ceiling = new_ceiling(target, calibration)
    ceiling.error = why[:500]
    return ceiling
