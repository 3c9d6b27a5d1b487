"""A browser the harness launches outside Playwright (--browser firefox, --browser safari) runs the run's jobs
through the served page: the protocol `web --serve` gives a phone (harness.web.device_server), with the browser
started, watched and killed here (harness.web.launched). Its rows are a `web` run's, the target's device naming
the browser (wasm/onnxruntime-web:wasm:threads=1 @ firefox), checked by the same validator and build_result. Every page
runtime runs there (runner.mjs loads its module as in Chromium), its row saying which runtime ran and what it loaded.

What the served protocol cannot see, KeptBrowser does: a browser that exits mid-job (crash, kill) gets that job
an `error` row at once, a job past --timeout a `timeout` row, and either way the browser is closed (its whole
process group) and launched again, fresh, for the jobs left, at most one launch per job and one more (max_launches).
Ctrl-C closes it too. `ab` keeps its launched browser with the same KeptBrowser (harness.browser.launched_session).

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
from dataclasses import replace
from typing import Any

from harness.browser.run import EpSetting, Prepared, WebPlan, case_model, not_runnable
from harness.browser.runtimes import runtime_details, runtime_model
from harness.browser.serve import ServedJobs, device_details
from harness.core.records import Case, Ceiling, Result, result_key
from harness.run.ceilings import new_ceiling
from harness.run.recording import Emit
from harness.web.launched import LaunchedChoice, Launcher, LaunchError, launcher
from harness.web.runtimes import OWN_RUNTIME
from harness.web.webdriver import WebDriverError

HELLO_TIMEOUT_S = 60.0  # from launch to the page's hello: Firefox starts in ~3 s here
SWEEP_S = 0.25
KILL_FAULT_DELAY_S = 1.0  # test-only: how long into a job the planted 'kill' fault waits (the page is mid-job)
USER_AGENT_VERSION = {"firefox": r"Firefox/([0-9.]+)", "safari": r"Version/([0-9.]+)"}


def max_launches(jobs: int) -> int:
    """A relaunch per failed job, and one to start: a browser that cannot stay up ends the run's browser part."""
    return jobs + 1


class LaunchedJobs(ServedJobs):
    """The served jobs of one launched browser: the run's own settings (its --threads, not the device's cores),
    rows that name the browser and how it was driven."""

    def __init__(self, plan: WebPlan, models: list[Prepared], emit: Emit, kept: KeptBrowser,
                 faults: Mapping[str, str]) -> None:  # fmt: skip
        super().__init__(plan, models, self._record)  # type: ignore[arg-type]  # a WebPlan serves as a ServePlan
        self.store = emit
        self.stored: set[str] = set()  # the keys this browser's part stored: never twice (never_opened)
        self.kept = kept
        self.choice = kept.choice
        self.faults = faults
        # every page runtime's settings: the served page loads each runtime's module (runner.mjs) as Chromium's does
        self.own = [s for s in plan.settings if s.device == self.choice.device]

    def _record(self, row: Any) -> None:
        if isinstance(row, Result):
            self.stored.add(result_key(row.model, row.target, row.case))
        if isinstance(row, Ceiling):
            self.stored.add(f"ceiling {row.target.label} {row.kind} {row.precision}")
        self.store(row)

    def settings(self, device: Any) -> list[EpSetting]:
        return self.own

    def details(self, device: Any, page: Any | None, lost: list[str]) -> dict[str, Any]:
        return launched_details(self.kept, device, page, lost)

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

    def _job(self, device: Any, files: Any, model: Prepared, setting: EpSetting, case: Case) -> Any:
        """The served job, its row saying which page runtime ran and the file it loaded, as a Chromium row does."""
        made = super()._job(device, files, model, setting, case)
        spec, prepared, _ = model
        if made is not None and setting.runtime != OWN_RUNTIME:
            assert prepared is not None
            found = self._jobs[result_key(spec.name, setting.target, case)]
            file = case_model(prepared, case)[0]
            assert file is not None  # the job exists: its file does
            ran = runtime_details(setting.runtime) | runtime_model(prepared, setting.runtime, case, file,
                                                                  setting.runtime_folder)  # fmt: skip
            found.conversion = found.conversion | ran  # a copy: case_model's dict is every runtime's of the case
        return made

    def never_opened(self, why: str) -> None:
        """Every job left gets this error row: the browser never asked for them."""
        for spec, prepared, reason, setting, case in self.pending():
            row = not_runnable(spec, prepared, reason, setting, case)
            if row is None:
                assert prepared is not None
                row = prepared.result(setting.target, case, "error", why)
            row.details |= {"browser": self.choice.kind} | self.kept.launch_facts
            self.emit(row)
        for setting in self.own:  # its ceilings too: each one holds why, and no value
            for calibration in self.calibrations():
                if f"ceiling {setting.target.label} {calibration.kind} {calibration.precision}" not in self.stored:
                    self.emit(replace(new_ceiling(setting.target, calibration), error=why[:500]))

    def give_up(self, server: Any, why: str) -> None:
        """The browser cannot be kept up: every job left gets this error row."""
        if not server.devices:  # it never said hello: no device holds the jobs
            self.never_opened(why)
            return
        for device in server.devices.values():
            for job in device.jobs:
                if job.outcome is None:
                    job.outcome = self.unanswered(device, job, "error", why)


def launched_details(kept: KeptBrowser, device: Any, page: Any | None, lost: list[str]) -> dict[str, Any]:
    """What a launched browser's row says of it: the served device's facts, how it was launched, and the browser
    and version its page's own user agent names (what ran, not what was asked for)."""
    facts = page.facts if page is not None else device.facts
    agent = str(facts.get("user_agent") or "")
    found = re.search(USER_AGENT_VERSION[kept.choice.kind], agent)
    return (
        device_details(device, page, lost)
        | kept.launch_facts
        | {
            "served_device": False,  # launched here: this machine's browser
            "browser": kept.choice.kind,
            "browser_version": found.group(1) if found else None,
            "browser_launched_as": kept.choice.driver,
        }
    )


def _held_jobs(server: Any) -> list[tuple[Any, Any]]:
    return [(d, j) for d in server.devices.values() for j in d.jobs if j.holder is not None and j.outcome is None]


def _fail_held(server: Any, source: Any, status: str, why: str) -> None:
    """The job the browser was running when it died gets its row now (a served device's would wait for a page)."""
    for device, job in _held_jobs(server):
        job.outcome = source.unanswered(device, job, status, why)
        job.holder = None
        device.holder = None


class KeptBrowser:
    """One launched browser kept at the served page (`web`'s and `ab`'s alike): launched, watched, and after a
    crash or a hung job closed (its whole process group) and launched again, fresh, at most `launches` times."""

    def __init__(self, choice: LaunchedChoice, headless: bool, args: tuple[str, ...], launches: int) -> None:
        self.choice, self.headless, self.args, self.max_launches = choice, headless, args, launches
        self.browser: Launcher | None = None
        self.opened = 0.0
        self.launches = 0
        self.stuck = False  # a job timed out in it: its page is still inside that job
        self.greeted = False  # a page of this launch took the device's lease (said hello, or asked for a job)
        self.kill_at: float | None = None  # test-only: when the planted 'kill' fault kills the browser
        self.launch_facts: dict[str, Any] = {}  # the current browser's (harness.web.launched.Launcher.facts)

    @property
    def label(self) -> str:
        return f"{self.choice.kind} ({self.choice.version or self.choice.driver})"

    def on_event(self, kind: str, _device: Any, job: Any) -> None:
        """The device server's events (harness.web.device_server.Event)."""
        if kind == "timeout":
            self.stuck = True
        if kind == "holding":
            self.greeted = True
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

    async def keep(self, server: Any, source: Any) -> str | None:
        """One look at the browser: a dead one's held job gets its `error` row (source.unanswered), a dead or stuck
        one is closed, and a new one is launched at the served page. Returns why the browser cannot be kept up (it
        never opened the page, or was launched too often), else None. Raises LaunchError or WebDriverError."""
        self.planted_kill()
        browser = self.browser
        if browser is not None and not browser.alive():
            _fail_held(server, source, "error", _ended(browser, self.label))
            await self._drop(server)
        elif browser is not None and self.stuck:  # the sweep stored the timeout; the page is still inside the job
            await self._drop(server)
        elif browser is not None and not self.greeted and time.monotonic() - self.opened > HELLO_TIMEOUT_S:
            return f"{self.label} did not open the served page within {HELLO_TIMEOUT_S:g} s"
        if self.browser is None:
            if self.launches >= self.max_launches:
                return f"{self.label} was launched {self.launches} times and did not stay up; the jobs left did not run"
            await self._launch(server.device_url)
        return None

    async def _drop(self, server: Any) -> None:
        """Close the browser; its pages are gone, so none of them holds a device (the next one need not wait for a
        lease to lapse)."""
        assert self.browser is not None
        await self.browser.close()
        self.browser = None
        for device in server.devices.values():
            device.holder = None

    async def _launch(self, url: str) -> None:
        self.browser, self.stuck, self.greeted = launcher(self.choice, self.headless, self.args), False, False
        self.launches += 1
        self.launch_facts = {}
        await self.browser.open(url)
        self.launch_facts = self.browser.facts()
        self.opened = time.monotonic()

    async def close(self) -> None:
        """Close the browser, and kill whatever of its process group is left: no browser outlives the run."""
        if self.browser is not None:
            with contextlib.suppress(Exception):
                await self.browser.close()
            self.browser.kill()
            self.browser = None


def _ended(browser: Launcher, label: str) -> str:
    code = getattr(browser, "exit_code", lambda: None)()  # a driver's browser: the driver lives on, no code
    tail = getattr(browser, "log_tail", lambda: "")()
    said = f"; it printed: {tail}" if tail else ""
    how = f" (exit code {code})" if code is not None else ""
    return f"{label} exited{how} while running this job{said}"


async def _serve(server: Any, jobs: LaunchedJobs, kept: KeptBrowser) -> None:
    """Keep the browser up until its device finished every job (or it cannot be kept up)."""
    while True:
        server.sweep()
        if server.finished_devices() >= 1:
            return
        if (why := await kept.keep(server, jobs)) is not None:
            jobs.give_up(server, why)
            return
        await asyncio.sleep(SWEEP_S)


async def run_launched(plan: WebPlan, choice: LaunchedChoice, models: list[Prepared], emit: Emit,
                       faults: Mapping[str, str]) -> None:  # fmt: skip
    """This browser's part of the run: serve its jobs on loopback and launch it at them."""
    from harness.web.device_server import DeviceServer

    kept = KeptBrowser(choice, not plan.request.headed, (), 1)
    jobs = LaunchedJobs(plan, models, emit, kept, faults)
    if not jobs.pending() and not plan.request.ceilings_only:  # a resumed run's browser part done
        return
    kept.max_launches = max_launches(len(jobs.pending()))
    server = DeviceServer(jobs, plan.request.timeout_s, served_host(choice), 0, None, kept.on_event, max_devices=1)
    await server.start()
    try:
        await _serve(server, jobs, kept)
    except (LaunchError, WebDriverError) as exc:  # not found, or its driver refused: every job left says why
        jobs.never_opened(str(exc))
    finally:
        await kept.close()
        server.record_disconnected()
        await server.stop()


def served_host(choice: LaunchedChoice) -> str:
    """Where the served page listens: loopback, unless a remote driver's browser must reach it."""
    return "0.0.0.0" if choice.webdriver_url else "127.0.0.1"
