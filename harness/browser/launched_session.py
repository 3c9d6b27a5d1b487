"""A browser launched outside Playwright (Firefox, Safari) as a page session: what `ab`'s browser half asks of
Chromium's BrowserSession (harness.web.driver) — ensure_started, run_job, facts, close — answered by the served
page. Each run_job hands the page one job through the device server, over the protocol `web --serve` and
`web --browser firefox` use, and waits for its answer; KeptBrowser (harness.browser.launched), the launcher and
watch `web` uses, keeps the browser up meanwhile: a browser that exits mid-job makes that job's answer `error`, a
job past --timeout answers `timeout`, and either way the browser is closed (its process group) and launched again,
fresh, for the next job. The answers pass the device server's checks (validate_page_result, the device's own user
agent), as a served device's do.

from harness.browser.launched_session import LaunchedSession
session = LaunchedSession(choice, timeout_s=60, headless=True, output_bytes=1 << 20, launches=3, describe={...})
await session.start(); answer = await session.run_job("", key, page_job, 60); await session.close()
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from harness.browser.launched import KeptBrowser, launched_details, served_host
from harness.web.device_server import DeviceServer, ServeJob, answer_limit
from harness.web.launched import LaunchedChoice, LaunchError
from harness.web.page_job import PageJob
from harness.web.webdriver import WebDriverError

SWEEP_S = 0.25  # how often the browser and the job's deadline are looked at while a job runs


def _failure(status: str, message: str) -> dict[str, Any]:
    return {"status": status, "error": message, "facts": {}}


class QueuedJobs:
    """The device server's JobSource for jobs handed one at a time: each job's answer settles its future."""

    def __init__(self, describe: dict[str, Any]) -> None:
        self.open = True  # jobs may still come: the page waits for them instead of stopping
        self.backlog: list[ServeJob] = []  # queued before the page said hello
        self.answers: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._describe = describe

    def describe(self) -> dict[str, Any]:
        return self._describe

    def jobs(self, _device: Any, _files: Any) -> list[ServeJob]:
        backlog, self.backlog = self.backlog, []
        return backlog

    def more(self, _device: Any) -> bool:
        return self.open

    def answered(self, _device: Any, job: ServeJob, answer: dict[str, Any], _page: Any) -> dict[str, Any]:
        return self._settle(job, answer)

    def unanswered(self, _device: Any, job: ServeJob, status: str, why: str) -> dict[str, Any]:
        return self._settle(job, _failure(status, why))

    def _settle(self, job: ServeJob, answer: dict[str, Any]) -> dict[str, Any]:
        future = self.answers.pop(job.id, None)
        if future is not None and not future.done():
            future.set_result(answer)
        samples = answer.get("samples_ms") or []
        return {  # what the page shows of it
            "status": answer["status"],
            "error": answer.get("error"),
            "p50_ms": statistics.median(samples) if samples else None,
            "max_abs_diff": None,
        }


class LaunchedSession:
    """One launched browser at a device server of its own, run job by job."""

    browser = None  # no Playwright browser: no adapter or platform probe from here; the page's own checks answer

    def __init__(self, choice: LaunchedChoice, *, timeout_s: float, headless: bool, output_bytes: int,
                 launches: int, describe: dict[str, Any]) -> None:  # fmt: skip
        self.kept = KeptBrowser(choice, headless, (), launches)
        self.source = QueuedJobs(describe)
        self.server = DeviceServer(self.source, timeout_s, served_host(choice), 0, None, self.kept.on_event,
                                   max_devices=1)  # fmt: skip
        self.output_bytes = output_bytes  # the largest outputs any job of the session answers with
        self.gave_up: str | None = None  # why the browser cannot be kept up: every later job's answer
        self._pages: dict[object, str] = {}  # each key's setting: a new key is a fresh page load, as in Chromium
        self._count = 0

    @property
    def files(self) -> DeviceServer:
        """Where the jobs' files are served: the device server (web.page_job's `files`)."""
        return self.server

    async def start(self) -> None:
        await self.server.start()

    async def close(self) -> None:
        self.source.open = False
        self.server.wake()
        await self.kept.close()
        self.server.record_disconnected()
        await self.server.stop()

    async def _keep(self) -> str | None:
        try:
            why = await self.kept.keep(self.server, self.source)
        except (LaunchError, WebDriverError) as exc:  # not found, or its driver refused
            why = str(exc)
        self.gave_up = self.gave_up or why
        return why

    async def ensure_started(self) -> str | None:
        """None when the browser is up (launched now if it was not), else why it cannot be."""
        return self.gave_up or await self._keep()

    def device_stall(self, _ep: str, _device_type: str | None) -> None:
        return None  # a WebGPU device that makes no progress is the page's own error here

    async def run_job(self, _url: str, key: object, job: PageJob, _timeout_s: float) -> dict[str, Any]:
        """The page's validated answer, or an `error` / `timeout` answer saying why there is none (the device
        server holds the session's --timeout: the same one every job of ab is given)."""
        if self.gave_up is not None:
            return _failure("error", self.gave_up)
        if key not in self._pages:  # the served page runs one setting per load: a new name reloads it
            self._pages[key] = f"{job.ep}:threads={job.threads}{f':{job.device_type}' if job.device_type else ''} " \
                               f"page {len(self._pages) + 1}"  # fmt: skip
        self._count += 1
        limit = answer_limit(self.output_bytes, job.stop.max_iterations)
        served = ServeJob(f"job-{self._count}", self._pages[key], f"{job.case} ({self._pages[key]})", job, limit)
        answer = asyncio.get_running_loop().create_future()
        self.source.answers[served.id] = answer
        device = next(iter(self.server.devices.values()), None)
        if device is None:  # the page has not said hello yet: it gets the job then
            self.source.backlog.append(served)
        else:
            self.server.add_job(device, served)
        while not answer.done():
            self.server.sweep()  # a job held past --timeout answers `timeout`
            if (why := await self._keep()) is not None:
                served.outcome = {"status": "error", "error": why}  # no page takes it now
                self.source.answers.pop(served.id, None)
                return _failure("error", why)
            await asyncio.wait({answer}, timeout=SWEEP_S)
        return answer.result()

    def facts(self) -> dict[str, Any]:
        """The browser a job ran in, as its page's user agent names it, and how it was launched."""
        device = next(iter(self.server.devices.values()), None)
        restarts = {"browser_restarts": max(0, self.kept.launches - 1), "page_transport": self.server.transport}
        if device is None:
            choice = self.kept.choice
            return {"browser": choice.kind, "browser_launched_as": choice.driver} | self.kept.launch_facts | restarts
        page = device.pages.get(device.holder or "") or next(reversed(device.pages.values()), None)
        return launched_details(self.kept, device, page, []) | restarts
