"""The browsers the browser half of `accelharness ab` runs its pairs in (harness.ab.web), each opened on first use
and closed after the last pair that needs it: a Chromium through Playwright, one browser per EP as `web` launches
it (harness.web.driver.BrowserSession), and a Firefox or Safari launched at its served page
(harness.browser.launched_session.LaunchedSession). Both offer one session interface: ensure_started, run_job,
facts, close. With --a-browser/--b-browser two are open at once, one per side."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from harness.browser.run import EpSetting, WebPlan, platform_seen
from harness.run.recording import Emit


@dataclass(frozen=True)
class Place:
    """Where a side's page jobs run: the server of their files, the browser's session, the EP setting (its target)."""

    files: Any
    session: Any
    setting: EpSetting


def session_key(setting: EpSetting) -> tuple[str, str | None]:
    """Which session runs a setting: a Chromium's per EP (its flags are the EP's), a launched browser's per browser."""
    return ("chromium", setting.ep) if setting.device is None else ("launched", setting.device)


class Browsers:
    """The open sessions, by session_key; the Chromium's page server and Playwright, started with the first one."""

    def __init__(self, plan: WebPlan, request: Any, output_bytes: int, describe: dict[str, Any]) -> None:
        self.plan, self.request = plan, request
        self.output_bytes, self.describe = output_bytes, describe  # what a launched session's page is told
        self.open: dict[tuple[str, str | None], Any] = {}
        self.seen: set[str] = set()  # EPs whose platform a Chromium's page reported (stored once)
        self._stack = AsyncExitStack()
        self._files: Any = None  # the Chromium's page server
        self._playwright: Any = None

    async def place(self, setting: EpSetting) -> Place:
        key = session_key(setting)
        if key not in self.open:
            self.open[key] = await (self._chromium(setting.ep) if setting.device is None else self._launched(setting))
        session = self.open[key]
        return Place(self._files if setting.device is None else session.files, session, setting)

    async def _chromium(self, ep: str) -> Any:
        from playwright.async_api import async_playwright

        from harness.web.driver import BrowserSession
        from harness.web.server import PageServer

        if self._files is None:
            self._files = PageServer(isolate=True)
            await self._files.start()
            self._stack.push_async_callback(self._files.stop)
            self._playwright = await self._stack.enter_async_context(async_playwright())
        return BrowserSession(self._playwright, self.plan.browser_source(ep), self._files)

    async def _launched(self, setting: EpSetting) -> Any:
        from harness.browser.launched_session import LaunchedSession

        choice = next(c for c in self.plan.launched if c.device == setting.device)
        jobs = len(self.describe["cases"]) * sum(s.device == setting.device for s in self.plan.settings)
        session = LaunchedSession(
            choice, timeout_s=self.request.timeout_s, headless=not self.plan.request.headed,
            output_bytes=self.output_bytes, launches=jobs + 1, describe=self.describe,
        )  # fmt: skip  # a relaunch per case at most, and one to start
        await session.start()
        return session

    async def platform_seen(self, place: Place, emit: Emit) -> None:
        """A Chromium's own view of the EP's platform (the hardware table), stored once per EP."""
        setting, session = place.setting, place.session
        asked = setting.device is None and setting.ep not in self.seen and session.browser is not None
        if asked and await platform_seen(session, setting, emit):
            self.seen.add(setting.ep)

    async def close_after(self, number: int, pairs: list[dict[str, EpSetting]]) -> None:
        """Close the sessions no pair after pairs[number] runs in."""
        later = {session_key(s) for pair in pairs[number + 1 :] for s in pair.values()}
        for key in [key for key in self.open if key not in later]:
            await self.open.pop(key).close()

    async def close(self) -> None:
        """Every session, then the Chromium's Playwright and page server."""
        try:
            for key in list(self.open):
                await self.open.pop(key).close()
        finally:
            await self._stack.aclose()
