"""A served device's ceilings (`web --serve`, with --ceilings-only or before its models): each calibration of each
setting a few jobs of the device's list, run by its own page loop (harness.browser.page_ceilings).

A device gets one job per calibration when it says hello: the probe of its smallest size. Each answer makes the
next one (the next probe's size, or the chosen size under the measuring stop rule), added to the device's list
(harness.web.device_server.DeviceServer.add_job) before the answer is acknowledged, so the device is never seen
done in between; the last answer's ceiling (or a reused one, or why there is none) is stored.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from harness.browser.page_ceilings import PageCalibration
from harness.browser.run import EpSetting, calibration_job, software_adapter
from harness.run.ceilings import CEILING_MAX_ITERATIONS, KEPT, Calibration, Prior

ANSWER_LIMIT_SAMPLES = CEILING_MAX_ITERATIONS  # a calibration job's most samples: its answer's bound


@dataclass
class _Calibrating:
    step: PageCalibration
    setting: EpSetting
    jobs: int = 1  # the jobs made for it so far: each one's key is its own


class ServedCeilings:
    """The calibration jobs of every device of a served run, and what their answers become (emitted Ceilings)."""

    def __init__(self, emit: Any) -> None:
        self.emit = emit
        self._jobs: dict[str, _Calibrating] = {}  # a job's key -> its calibration

    def jobs(self, files: Any, setting: EpSetting, calibrations: Sequence[Calibration],
             prior: Sequence[Prior]) -> list[Any]:  # fmt: skip
        """Each calibration's first job on the device's setting: the probe of its smallest size."""
        found = []
        for calibration in calibrations:
            step = PageCalibration(setting.target, calibration, prior, partial(software_adapter, setting=setting))
            calibrating = _Calibrating(step, setting)
            found.append(self._job(files, calibrating))
        return found

    def holds(self, job: Any) -> bool:
        return job.key in self._jobs

    def answered(self, files: Any, device: Any, job: Any, answer: dict[str, Any]) -> dict[str, Any]:
        found = self._jobs[job.key]
        if found.jobs == 1:  # its time counts from when the device took its first job
            found.step.started = job.taken
        found.step.answered(answer)
        return self._advance(files, device, found, answer, job)

    def unanswered(self, job: Any, status: str, why: str) -> dict[str, Any]:
        found = self._jobs[job.key]
        found.step.failed(f"{status}: {why}")
        return self._advance(None, None, found, {"status": status, "error": why}, job)

    def _advance(
        self, files: Any, device: Any, found: _Calibrating, answer: dict[str, Any], job: Any
    ) -> dict[str, Any]:
        """The ceiling stored once its calibration finished; else its next job added to the device's list, right
        after this one (the device runs its list in order: the same setting, its page not loaded again)."""
        step = found.step
        if step.finished:
            if step.ceiling is not None:
                self.emit(step.ceiling)
            return _summary(step, answer)
        found.jobs += 1
        following = self._job(files, found)
        files.add_job(device, following)
        device.jobs.remove(following)
        device.jobs.insert(device.jobs.index(job) + 1, following)
        return {"status": answer["status"], "error": None, "p50_ms": _median(answer), "max_abs_diff": None}

    def _job(self, files: Any, found: _Calibrating) -> Any:
        from harness.web.device_server import ServeJob, answer_limit

        step, setting = found.step, found.setting
        calibration = step.calibration
        page = calibration_job(files, setting, calibration, step.size, step.stop)
        what = "measure" if step.measuring else "check" if step.checking is not None else "probe"
        label = f"{calibration.kind} ceiling ({calibration.precision}) on {setting.provider}: {what} {step.size.name}"
        key = f"ceiling {setting.target.label} {calibration.kind} {calibration.precision} #{found.jobs}"
        job = ServeJob(key, setting.provider, label, page, answer_limit(4 * KEPT, ANSWER_LIMIT_SAMPLES))
        self._jobs[key] = found
        return job


def _median(answer: dict[str, Any]) -> float | None:
    return statistics.median(answer["samples_ms"]) if answer.get("samples_ms") else None


def _summary(step: PageCalibration, answer: dict[str, Any]) -> dict[str, Any]:
    """What the device's page shows of a finished calibration: its median run, or why there is none."""
    ceiling = step.ceiling
    if ceiling is not None and ceiling.error:
        return {"status": "error", "error": ceiling.error, "p50_ms": None, "max_abs_diff": None}
    return {"status": answer.get("status", "ok"), "error": None, "p50_ms": _median(answer), "max_abs_diff": None}
