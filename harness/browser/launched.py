"""A browser the harness launches outside Playwright (--browser firefox, --browser safari) runs the run's jobs
through the served page: the protocol `web --serve` gives a phone (harness.web.device_server), with the browser
started, watched and killed here (harness.web.launched). Its rows are a `web` run's, the target's device naming
the browser (wasm/onnxruntime-web:wasm:threads=1 @ firefox), checked by the same validator and build_result.

What the served protocol cannot see, the loop here does: a browser that exits mid-job (crash, kill) gets that job
an `error` row at once, a job past --timeout a `timeout` row, and either way the browser is closed (its whole
process group) and launched again, fresh, for the jobs left, at most MAX_LAUNCHES times. Ctrl-C closes it too.

from harness.browser.execute import run_web
from harness.browser.run import WebRequest
run_web(WebRequest(models=["bert-tiny"], hardware=["wasm"], threads=[1, 2], browsers=["firefox"]))
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Mapping
from typing import Any

from harness.browser.run import EpSetting, Prepared, WebPlan, not_runnable
from harness.browser.serve import ServedJobs, device_details
from harness.core.records import Result, result_key
from harness.run.recording import Emit
from harness.web.launched import LaunchedChoice, Launcher, LaunchError, launcher
from harness.web.runtimes import OWN_RUNTIME
from harness.web.webdriver import WebDriverError

HELLO_TIMEOUT_S = 60.0  # from launch to the page's hello: Firefox starts in ~3 s here
SWEEP_S = 0.25
KILL_FAULT_DELAY_S = 1.0  # test-only: how long into a job the planted 'kill' fault waits (the page is mid-job)
USER_AGENT_VERSION = {"firefox": r"Firefox/([0-9.]+)", "safari": r"Version/([0-9.]+)"}
OTHER_RUNTIME = (
    "the served page runs onnxruntime-web through the harness's own loop only; the other page runtimes run in "
    "a Chromium the harness drives (--browser chromium)"
)


def max_launches(jobs: int) -> int:
    """A relaunch per failed job, and one to start: a browser that cannot stay up ends the run's browser part."""
    return jobs + 1


class LaunchedJobs(ServedJobs):
    """The served jobs of one launched browser: the run's own settings (its --threads, not the device's cores),
    rows that name the browser and how it was driven."""

    def __init__(self, plan: WebPlan, models: list[Prepared], emit: Emit, choice: LaunchedChoice,
                 faults: Mapping[str, str]) -> None:  # fmt: skip
        super().__init__(plan, models, self._record)  # type: ignore[arg-type]  # a WebPlan serves as a ServePlan
        self.store = emit
        self.stored: set[str] = set()  # the keys this browser's part stored: never twice (never_opened)
        self.choice = choice
        self.faults = faults
        self.own = [s for s in plan.settings if s.device == choice.device and s.runtime == OWN_RUNTIME]
        self.launch_facts: dict[str, Any] = {}  # the current browser's (harness.web.launched.Launcher.facts)

    def _record(self, row: Any) -> None:
        if isinstance(row, Result):
            self.stored.add(result_key(row.model, row.target, row.case))
        self.store(row)

    def settings(self, device: Any) -> list[EpSetting]:
        return self.own

    def details(self, device: Any, page: Any | None, lost: list[str]) -> dict[str, Any]:
        facts = page.facts if page is not None else device.facts
        agent = str(facts.get("user_agent") or "")
        found = re.search(USER_AGENT_VERSION[self.choice.kind], agent)
        return (
            device_details(device, page, lost)
            | self.launch_facts
            | {
                "served_device": False,  # launched here: this machine's browser
                "browser": self.choice.kind,
                "browser_version": found.group(1) if found else None,  # the page's own user agent: what ran
                "browser_launched_as": self.choice.driver,
            }
        )

    def fault(self, setting: EpSetting) -> str | None:
        return self.faults.get(f"{self.choice.kind}/{setting.provider}")

    def pending(self) -> list[tuple[Any, ...]]:
        """(spec, prepared, why, setting, case) the run lacks, for this browser's own settings."""
        return [
            (spec, prepared, why, setting, case)
            for setting in self.own
            for spec, prepared, why in self.models
            for case in self.plan.cases(spec)
            if (key := result_key(spec.name, setting.target, case)) not in self.plan.done and key not in self.stored
        ]

    def refuse_other_runtimes(self) -> None:
        """Rows for the page runtimes the served page does not run in this browser."""
        others = [s for s in self.plan.settings if s.device == self.choice.device and s.runtime != OWN_RUNTIME]
        for setting in others:
            for spec, prepared, why in self.models:
                for case in self.plan.cases(spec):
                    if result_key(spec.name, setting.target, case) in self.plan.done:
                        continue
                    row = not_runnable(spec, prepared, why, setting, case)
                    if row is None:
                        assert prepared is not None
                        row = prepared.result(setting.target, case, "unsupported", OTHER_RUNTIME)
                    row.details |= {"browser": self.choice.kind}
                    self.emit(row)

    def never_opened(self, why: str) -> None:
        """Every job left gets this error row: the browser never asked for them."""
        for spec, prepared, reason, setting, case in self.pending():
            row = not_runnable(spec, prepared, reason, setting, case)
            if row is None:
                assert prepared is not None
                row = prepared.result(setting.target, case, "error", why)
            row.details |= {"browser": self.choice.kind} | self.launch_facts
            self.emit(row)


def _held_jobs(server: Any) -> list[tuple[Any, Any]]:
    return [(d, j) for d in server.devices.values() for j in d.jobs if j.holder is not None and j.outcome is None]


def _fail_held(server: Any, jobs: LaunchedJobs, status: str, why: str) -> None:
    """The job the browser was running when it died gets its row now (a served device's would wait for a page)."""
    for device, job in _held_jobs(server):
        job.outcome = jobs.unanswered(device, job, status, why)
        job.holder = None
        device.holder = None


def _unfinished(server: Any) -> int:
    return sum(job.outcome is None for device in server.devices.values() for job in device.jobs)


class _Watch:
    """The launched browser's life: when it opened, whether a job timed out in it (its page is then stuck)."""

    def __init__(self) -> None:
        self.browser: Launcher | None = None
        self.opened = 0.0
        self.launches = 0
        self.stuck = False
        self.kill_at: float | None = None  # test-only: when the planted 'kill' fault kills the browser

    def on_event(self, kind: str, _device: Any, job: Any) -> None:
        if kind == "timeout":
            self.stuck = True
        if kind == "leased" and job is not None and job.page_job.fault == "kill":
            self.kill_at = time.monotonic() + KILL_FAULT_DELAY_S

    def planted_kill(self) -> None:
        """SIGKILL the browser's main process alone, as a crash would end it: its children are left for close()."""
        if self.kill_at is None or time.monotonic() < self.kill_at or self.browser is None:
            return
        self.kill_at = None
        pid = getattr(self.browser, "pid", None)
        if pid is None:
            self.browser.kill()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _relaunch(watch: _Watch, server: Any, jobs: LaunchedJobs, choice: LaunchedChoice, headless: bool,
                    args: tuple[str, ...]) -> None:  # fmt: skip
    if watch.browser is not None:
        await watch.browser.close()
    watch.browser, watch.stuck = launcher(choice, headless, args), False
    watch.launches += 1
    jobs.launch_facts = {}
    await watch.browser.open(server.device_url)
    jobs.launch_facts = watch.browser.facts()
    watch.opened = time.monotonic()


def _ended(browser: Launcher, label: str) -> str:
    code = getattr(browser, "exit_code", lambda: None)()  # a driver's browser: the driver lives on, no code
    tail = getattr(browser, "log_tail", lambda: "")()
    said = f"; it printed: {tail}" if tail else ""
    how = f" (exit code {code})" if code is not None else ""
    return f"{label} exited{how} while running this job{said}"


async def _serve(server: Any, jobs: LaunchedJobs, choice: LaunchedChoice, watch: _Watch, request: Any) -> None:
    """Launch, watch and relaunch the browser until its device finished every job (or it cannot be kept up)."""
    label = f"{choice.kind} ({choice.version or choice.driver})"
    total = len(jobs.pending())
    headless, args = not request.headed, ()
    while True:
        server.sweep()
        if server.finished_devices() >= 1:
            return
        watch.planted_kill()
        browser = watch.browser
        if browser is not None and not browser.alive():
            _fail_held(server, jobs, "error", _ended(browser, label))
            await browser.close()
            watch.browser = None
        elif browser is not None and watch.stuck:  # sweep stored the timeout; the page is still inside the job
            await browser.close()
            watch.browser = None
        elif browser is not None and not server.devices and time.monotonic() - watch.opened > HELLO_TIMEOUT_S:
            jobs.never_opened(f"{label} did not open the served page within {HELLO_TIMEOUT_S:g} s")
            return
        if watch.browser is None:
            if watch.launches >= max_launches(total):
                why = f"{label} was launched {watch.launches} times and did not stay up; the jobs left were not run"
                for device in server.devices.values():
                    for job in device.jobs:
                        if job.outcome is None:
                            job.outcome = jobs.unanswered(device, job, "error", why)
                return
            await _relaunch(watch, server, jobs, choice, headless, args)
        await asyncio.sleep(SWEEP_S)


async def run_launched(plan: WebPlan, choice: LaunchedChoice, models: list[Prepared], emit: Emit,
                       faults: Mapping[str, str]) -> None:  # fmt: skip
    """This browser's part of the run: serve its jobs on loopback and launch it at them."""
    from harness.web.device_server import DeviceServer

    jobs = LaunchedJobs(plan, models, emit, choice, faults)
    jobs.refuse_other_runtimes()
    if not jobs.pending():
        return
    watch = _Watch()
    host = "0.0.0.0" if choice.webdriver_url else "127.0.0.1"  # a remote driver's browser must reach the page
    server = DeviceServer(jobs, plan.request.timeout_s, host, 0, None, watch.on_event, max_devices=1)
    await server.start()
    try:
        await _serve(server, jobs, choice, watch, plan.request)
    except (LaunchError, WebDriverError) as exc:  # not found, or its driver refused: every job left says why
        jobs.never_opened(str(exc))
    finally:
        if watch.browser is not None:
            with contextlib.suppress(Exception):
                await watch.browser.close()
            watch.browser.kill()
        server.record_disconnected()
        await server.stop()
