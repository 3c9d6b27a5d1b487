"""A target's ceilings in the page (harness.run.ceilings' graphs, timed by the page's own loop), sized by time.

Each calibration is a few page jobs, one after another: probes (one warm run of a size: the page's first run, one
warm-up, one timed run), then the size harness.run.ceilings.Sizing chose, measured under the native stop rule.
The first probe's answer names what measured it (ORT-web's version, the browser's user agent, the WebGPU adapter):
an earlier ceiling of the target measured with the same (harness.run.ceiling_reuse) is taken there instead. A
launched or remote browser runs the jobs in a loop (calibrate_in_page); a served device takes them from its job list
one at a time (harness.browser.serve), through the same PageCalibration.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.adapters import adapter_name
from harness.core.records import Ceiling, Target
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
    new_ceiling,
    reusable,
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
    sizing: Sizing = field(init=False)
    software: str | None = None
    measuring: bool = False
    finished: bool = False
    ceiling: Ceiling | None = None
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.sizing = Sizing(self.calibration)

    @property
    def size(self) -> Size:
        return self.sizing.size

    @property
    def stop(self) -> StopRule:
        return CEILING_STOP if self.measuring else PROBE_STOP

    def answered(self, answer: dict[str, Any]) -> None:
        """Take the answer of the job `size` and `stop` described: the next job, or the ceiling."""
        if answer["status"] != "ok" or not answer.get("samples_ms"):
            return self._finish(self._failed(answer.get("error") or "the page gave no sample"))
        if self.measuring:
            return self._finish(self._measured(answer))
        if self.software is None:
            self.software = page_software(answer.get("facts", {}))
            if (earlier := reusable(self.prior, self.calibration, self.software)) is not None:
                self.finished = True  # this run's own is stored already; another run's is copied
                self.ceiling = None if earlier.own else earlier.ceiling
                return None
        self.sizing.observe(float(min(answer["samples_ms"])))
        self.measuring = self.sizing.done
        return None

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

    def _finish(self, ceiling: Ceiling) -> None:
        ceiling.calibration_s = time.monotonic() - self.started
        self.ceiling, self.finished = ceiling, True


async def calibrate_in_page(run_page: RunPage, target: Target, calibrations: Sequence[Calibration],
                            prior: Sequence[Prior], adapter: Adapter) -> list[Ceiling]:  # fmt: skip
    """The target's ceilings, each calibration's jobs run in turn by `run_page` (a launched or remote browser's)."""
    found = []
    for calibration in calibrations:
        step = PageCalibration(target, calibration, prior, adapter)
        while not step.finished:
            step.answered(await run_page(calibration, step.size, step.stop))
        if step.ceiling is not None:
            found.append(step.ceiling)
    return found
