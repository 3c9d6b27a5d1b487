"""A target's ceilings in the page (harness.run.ceilings' graphs, timed by the page's own loop), sized by time.

Each calibration is a few page jobs, one after another: probes (one warm run of a size: the page's first run, one
warm-up, one timed run), then the size harness.run.ceilings.Sizing chose, measured under the native stop rule.
The first probe's answer names what measured it (ORT-web's version, the browser's user agent, the WebGPU adapter):
an earlier ceiling of the target measured with the same (harness.run.ceiling_reuse) is checked there, one more
probe job at its own size (harness.run.ceiling_check), and taken instead where it stands. A
launched or remote browser runs the jobs in a loop (calibrate_in_page); a served device takes them from its job list
one at a time (harness.browser.serve), through the same PageCalibration.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.core.adapters import adapter_name
from harness.core.records import Ceiling, Target
from harness.run.ceiling_check import Check, checked, now
from harness.run.ceilings import (
    CALIBRATION_VERSION,
    CEILING_ITERATIONS,
    CEILING_MAX_ITERATIONS,
    CEILING_MAX_TIME_S,
    CEILING_MIN_DURATION_S,
    CEILING_MIN_ITERATIONS,
    CEILING_WARMUP,
    PROBE_RUNS,
    Calibration,
    Prior,
    Size,
    Sizing,
    check_size,
    new_ceiling,
    reusable,
    seen_rate,
)
from harness.web.page_job import StopRule

# a calibration's stop rule (harness.run.ceilings): the native one, in every page
CEILING_STOP = StopRule(
    warmup=CEILING_WARMUP,
    iterations=CEILING_ITERATIONS,
    min_duration_ms=CEILING_MIN_DURATION_S * 1000,
    max_iterations=CEILING_MAX_ITERATIONS,
    min_iterations=CEILING_MIN_ITERATIONS,
    max_time_ms=CEILING_MAX_TIME_S * 1000,
)
# a probe: the page's first run and one warm-up untimed, then PROBE_RUNS timed (native: harness.run.ceilings._probe)
PROBE_STOP = StopRule(
    warmup=1, iterations=PROBE_RUNS, min_duration_ms=0.0, max_iterations=PROBE_RUNS, min_iterations=1,
    max_time_ms=CEILING_MAX_TIME_S * 1000,
)  # fmt: skip
RunPage = Callable[[Calibration, Size, StopRule], Awaitable[dict[str, Any]]]  # a page job's validated answer
Adapter = Callable[[dict[str, Any]], bool]  # whether the answer's WebGPU adapter is a software one


def page_software(facts: dict[str, Any]) -> str:
    """What measured a page's ceiling, from its own answer: the calibrations' version, ORT-web's, the browser's user
    agent (its version and platform) and the WebGPU adapter where one ran. The target holds the EP and threads."""
    parts = [f"calibration {CALIBRATION_VERSION}", f"onnxruntime-web {facts.get('ort_web_version')}",
             f"user agent {facts.get('user_agent')}"]  # fmt: skip
    adapter = facts.get("adapter") or (facts.get("device_probe") or {}).get("adapter")
    if isinstance(adapter, dict) and adapter:
        parts.append(f"adapter {adapter_name(adapter)}")
    return "; ".join(parts)[:500]


@dataclass
class PageCalibration:
    """One calibration of a target in a page: the size and stop rule of its next page job, until `finished`; its
    ceiling then (None where the run holds it already: its own, resumed)."""

    target: Target
    calibration: Calibration
    prior: Sequence[Prior]
    adapter: Adapter
    seen: tuple[float, str] | None = None  # the target's bandwidth ceiling's rate, just measured (seen_rate)
    sizing: Sizing = field(init=False)
    software: str | None = None  # known already where the page measured another ceiling of the target
    measuring: bool = False
    finished: bool = False
    ceiling: Ceiling | None = None
    started: float = field(default_factory=time.monotonic)
    # the prior of another run being checked (harness.run.ceiling_check), the first probe's ms kept meanwhile, and
    # when the check's job was asked for; a check that left the prior behind (the fresh ceiling states it); decided:
    # whether the first answer came (a prior is chosen then)
    decided: bool = False
    checking: Ceiling | None = None
    first_ms: float = 0.0
    check_from: float = 0.0
    check: Check | None = None

    def __post_init__(self) -> None:
        self.sizing = Sizing(self.calibration)
        known = self.software is not None and reusable(self.prior, self.calibration, self.software) is None
        if self.calibration.least and self.seen is not None and known:  # bandwidth_large: sized by the bandwidth
            self.sizing.take(*self.seen)  # graph's rate, no probe job (a prior to reuse is probed and checked)
            if self.sizing.skipped:  # its one size would not fit the time rules: the ceiling says why, no value
                self._finish(self._skipped())
            self.measuring = not self.finished

    @property
    def size(self) -> Size:
        return self.sizing.size if self.checking is None else check_size(self.calibration, self.checking)

    @property
    def stop(self) -> StopRule:
        return replace(CEILING_STOP, iterations=self.calibration.iterations) if self.measuring else PROBE_STOP

    def answered(self, answer: dict[str, Any]) -> None:
        """Take the answer of the job `size` and `stop` described: the next job, or the ceiling."""
        if answer["status"] != "ok" or not answer.get("samples_ms"):
            return self._finish(self._failed(answer.get("error") or "the page gave no sample"))
        if self.measuring:
            return self._finish(self._measured(answer))
        ms = float(min(answer["samples_ms"]))
        if not self.decided:  # the first answer: whether a prior is checked (the software may be known already)
            self.decided, self.software = True, self.software or page_software(answer.get("facts", {}))
            if (earlier := reusable(self.prior, self.calibration, self.software)) is not None:
                self.finished = earlier.own  # this run's own is stored already; another run's is checked first
                self.checking = None if earlier.own else earlier.ceiling
                self.first_ms, self.check_from = ms, time.monotonic()
                return None
        elif self.checking is not None and (ms := self._checked(self.checking, ms)) is None:
            return None
        self.sizing.observe(ms)
        if self.sizing.skipped:  # its one size would not fit the time rules: the ceiling says why, with no value
            return self._finish(self._skipped())
        self.measuring = self.sizing.done
        return None

    def _checked(self, prior: Ceiling, ms: float) -> float | None:
        """Take the check's answer (`ms`, its faster run): the prior copied where it stands (None), else the first
        probe's ms, to size the fresh measurement from."""
        check = Check(prior, ms, time.monotonic() - self.check_from, now())
        self.checking = None
        if check.stands:
            self.ceiling, self.finished = checked(check), True
            return None
        self.check = check
        return self.first_ms

    def failed(self, why: str) -> None:
        """A job that got no answer (timeout, a device gone): the ceiling holds why."""
        self._finish(self._failed(why))

    def _measured(self, answer: dict[str, Any]) -> Ceiling:
        ceiling = self.sizing.stated(new_ceiling(self.target, self.calibration))
        ceiling.samples_ms, ceiling.load_avg_1m = list(answer["samples_ms"]), os.getloadavg()[0]
        ceiling.software, ceiling.software_adapter = self.software, self.adapter(answer.get("facts", {}))
        return ceiling

    def _failed(self, why: str) -> Ceiling:
        ceiling = new_ceiling(self.target, self.calibration)
        ceiling.error, ceiling.software = str(why)[:500], self.software
        return ceiling

    def _skipped(self) -> Ceiling:
        return replace(self.sizing.unmeasured(new_ceiling(self.target, self.calibration)), software=self.software)

    def _finish(self, ceiling: Ceiling) -> None:
        ceiling = ceiling if self.check is None else checked(self.check, ceiling)
        ceiling.calibration_s = time.monotonic() - self.started
        self.ceiling, self.finished = ceiling, True


async def calibrate_in_page(run_page: RunPage, target: Target, calibrations: Sequence[Calibration],
                            prior: Sequence[Prior], adapter: Adapter) -> list[Ceiling]:  # fmt: skip
    """The target's ceilings, each calibration's jobs run in turn by `run_page` (a launched or remote browser's)."""
    found: list[Ceiling] = []
    software: str | None = None  # the page's, from the first calibration's answer
    for calibration in calibrations:
        step = PageCalibration(target, calibration, prior, adapter, seen_rate(found), software=software)
        while not step.finished:
            step.answered(await run_page(calibration, step.size, step.stop))
        software = step.software or software
        if step.ceiling is not None:
            found.append(step.ceiling)
    return found
