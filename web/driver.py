"""Find or reach the browser, open it through Playwright, and run page jobs under a time limit.

A browser is either launched here (LocalBrowser: the binary, the GPU profile's flags, headless or
headed) or reached at --browser-endpoint (RemoteBrowser: a Playwright browser server over ws://,
or a Chromium with remote debugging over http://). The page times everything itself; this module
only hands it a job and reads the answer. A page that does not answer within the timeout, or a
browser that crashes or disconnects, becomes a `timeout`/`error` answer and the browser is
restarted (or reconnected), so one bad job never ends the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import re
import shutil
import signal
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psutil

from harness.web.adapter import adapter_name, classify_adapter
from harness.web.answers import PageResultError, validate_page_result
from harness.web.browser_memory import LoopMemory
from harness.web.device_probe import probes_device, prove_device
from harness.web.eps import WEB_HARDWARE
from harness.web.flags import BROWSERS, GpuProfile, VirtualDisplay, gpu_profile, launch_flags, needs_virtual_display
from harness.web.page_job import PageJob
from harness.web.server import PageFiles, RoutedPages, SetupError

CANDIDATES: dict[str, tuple[str, ...]] = {
    "chrome": ("google-chrome", "google-chrome-stable", "/opt/google/chrome/chrome"),
    "chromium": ("chromium", "chromium-browser", "/usr/bin/chromium"),
    "edge": ("microsoft-edge", "microsoft-edge-stable", "/opt/microsoft/msedge/msedge"),
}
# A headless launch of Chromium takes its headless shell where one is installed, as Playwright's own headless
# launches do: the same Blink, V8 and Dawn without the browser UI, whose WebUI renderers (one per page, plus the
# top chrome's) cost ~4 s of CPU per launch on a 2-core machine. --headed, or --browser-path, runs the full browser.
HEADLESS_SHELLS: dict[str, tuple[str, ...]] = {
    "chromium": ("chromium-headless-shell", "/usr/lib/chromium/chromium-headless-shell"),
}
HEADLESS_SHELL_BINARIES = {Path(name).name for names in HEADLESS_SHELLS.values() for name in names}
# Distribution launchers are shell scripts that add their own flags (Debian's /etc/chromium.d adds
# --enable-gpu-rasterization, extensions...); the binary they exec is launched instead, so the flag
# list recorded with each row is the one the browser got.
REAL_BINARIES = (
    "chrome",
    "msedge",
    "chromium",
    "/usr/lib/chromium/chromium",
    "/usr/lib/chromium-browser/chromium",
    "/usr/lib/chromium/chromium-headless-shell",
)
ENDPOINT_SCHEMES = {"ws": "connect", "wss": "connect", "http": "connect_over_cdp", "https": "connect_over_cdp"}
PAGE_READY_MS = 30_000
CONNECT_TIMEOUT_MS = 30_000
CLOSE_TIMEOUT_S = 10.0
KILL_FAULT_DELAY_S = 1.0
DEATH_GRACE_S = 2.0  # how long a crashed/killed browser may take to finish dying
PROBE_TIMEOUT_S = 60.0
LOOP_MARK = "accelharnessLoopMark"  # the binding the page calls at its timed loop's start and end

T = TypeVar("T")

Verdict = tuple[str, bool, str, str | None]  # a browser platform: (platform, available, reason, device)


class BrowserNotFound(RuntimeError):
    """No usable browser binary; the message names every name and path looked for."""


@dataclass(frozen=True)
class BrowserChoice:
    requested: str  # chrome | chromium | edge
    kind: str  # what is actually launched: chrome | chromium | edge | path
    found: str  # the name or path that resolved
    binary: Path  # the executable launched
    fallback: str | None  # why it is not the requested browser, if it is not
    headless_shell: bool = False  # Chromium's headless shell (headless only), not the full browser


def _is_script(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def real_binary(path: Path) -> Path:
    """The browser executable behind a launcher script (or the path itself)."""
    path = path.resolve()
    if not _is_script(path):
        return path
    own_name = [name for name in REAL_BINARIES if Path(name).name == path.name]  # the launcher's own binary first
    for name in [*own_name, *REAL_BINARIES]:
        candidate = Path(name) if name.startswith("/") else path.parent / name
        if candidate.is_file() and os.access(candidate, os.X_OK) and not _is_script(candidate):
            return candidate
    return path


def _lookup(name: str) -> Path | None:
    if name.startswith("/"):
        return Path(name) if Path(name).is_file() and os.access(name, os.X_OK) else None
    found = shutil.which(name)
    return Path(found) if found else None


def resolve_browser(browser: str, browser_path: Path | str | None = None, headless: bool = False) -> BrowserChoice:
    """The binary for --browser/--browser-path; chrome and edge fall back to Chromium. `headless`: Chromium's
    headless shell where one is installed (HEADLESS_SHELLS)."""
    if browser not in BROWSERS:
        raise BrowserNotFound(f"unknown browser '{browser}'; valid: {', '.join(BROWSERS)}")
    if browser_path is not None:
        path = Path(browser_path)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrowserNotFound(f"--browser-path {path}: no executable file there (looked only at that path)")
        binary = real_binary(path)
        return BrowserChoice(browser, "path", str(path), binary, None, binary.name in HEADLESS_SHELL_BINARIES)
    order = [(browser, CANDIDATES[browser])]
    if browser != "chromium":
        order.append(("chromium", CANDIDATES["chromium"]))
    for kind, names in order:
        shells = HEADLESS_SHELLS.get(kind, ()) if headless else ()
        for name in (*shells, *names):
            path = _lookup(name)
            if path is not None:
                fallback = None
                if kind != browser:
                    fallback = f"{browser} not found (looked for {', '.join(CANDIDATES[browser])}); used {path}"
                return BrowserChoice(browser, kind, name, real_binary(path), fallback, name in shells)
    looked = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in order)
    raise BrowserNotFound(f"no {browser} browser found (looked for {looked}); pass --browser-path")


def _browser_processes() -> dict[int, list[str]]:
    """Our descendant browser main processes (Playwright talks to them over a pipe)."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if "--remote-debugging-pipe" in cmdline and not any(a.startswith("--type=") for a in cmdline):
                found[child.pid] = cmdline
    return found


class LocalBrowser:
    """A browser this harness launches: the binary, its flags (GPU profile, EPs, --browser-arg), headless
    or headed (on a virtual display when the host has none)."""

    def __init__(
        self,
        choice: BrowserChoice,
        flags: list[str],
        profile: GpuProfile | None = None,
        headed: bool = False,
        browser_args: tuple[str, ...] = (),
    ) -> None:
        self.choice = choice
        self.flags = flags
        self.profile = profile or gpu_profile("off")
        self.headed = headed
        self.browser_args = browser_args
        self.pid: int | None = None
        self.command_line: list[str] = []
        self._display: VirtualDisplay | None = None

    @property
    def memory_pid(self) -> int | None:
        return self.pid

    async def open(self, playwright: Any) -> Any:
        env = None
        if self.headed and needs_virtual_display():
            self._display = VirtualDisplay()
            env = {**os.environ, "DISPLAY": self._display.start()}
        before = set(_browser_processes())
        browser = await playwright.chromium.launch(
            executable_path=str(self.choice.binary), headless=not self.headed, args=self.flags, env=env
        )
        new = {pid: cmd for pid, cmd in _browser_processes().items() if pid not in before}
        self.pid, self.command_line = next(iter(new.items()), (None, []))
        return browser

    async def close(self, browser: Any) -> None:
        try:
            await asyncio.wait_for(browser.close(), CLOSE_TIMEOUT_S)
        except Exception:  # a wedged browser: make sure the process is gone
            self.kill()
        if self._display is not None:
            self._display.stop()
            self._display = None

    def kill(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def alive(self, _browser: Any) -> bool:
        try:
            return self.pid is not None and psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def start_failure(self, exc: BaseException) -> str:
        return f"the browser failed to start: {_first_line(exc)}"

    def lost(self) -> str:
        return f"browser process {self.pid} is gone (crashed or killed); "

    restarting = "browser restarted"

    def facts(self) -> dict[str, Any]:
        display = self._display.display if self._display else os.environ.get("DISPLAY")
        return {
            "browser": self.choice.kind,
            "browser_requested": self.choice.requested,
            "browser_binary": str(self.choice.binary),
            "browser_found_as": self.choice.found,
            "browser_headless_shell": self.choice.headless_shell,
            "browser_fallback": self.choice.fallback,
            "flags": self.flags,
            "browser_args": list(self.browser_args),
            "browser_command_line": self.command_line,
            "gpu_profile": self.profile.name,
            "gpu_profile_requested": self.profile.requested,
            "gpu_profile_reason": self.profile.reason,
            "headed": self.headed,
            "display": (f"Xvfb {display} (virtual, no GPU)" if self._display else display) if self.headed else None,
        }


async def _reported_command_line(browser: Any) -> tuple[list[str] | None, str]:
    """The command line a browser reports about itself, and where it came from (or why there is none)."""
    try:
        cdp = await browser.new_browser_cdp_session()
        try:
            answer = await cdp.send("Browser.getBrowserCommandLine")
            return list(answer["arguments"]), "CDP Browser.getBrowserCommandLine"
        finally:
            await cdp.detach()
    except Exception as exc:  # e.g. "--enable-automation not set": read chrome://version instead
        cdp_error = _first_line(exc)
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.goto("chrome://version")
        text = (await page.inner_text("#command_line")).strip()
        return re.split(r"\s+(?=--)", text), f"chrome://version (CDP said: {cdp_error})"
    except Exception as exc:
        return None, f"not reported: CDP said {cdp_error}; chrome://version: {_first_line(exc)}"
    finally:
        await context.close()


class RemoteBrowser:
    """A browser somewhere else (a lab machine, a device farm): ws:// is a Playwright browser server
    (BrowserType.connect), http:// a Chromium with remote debugging (connect_over_cdp). Its flags are its
    own: the rows record the command line it reports."""

    memory_pid = None  # its processes are not on this machine

    def __init__(self, endpoint: str) -> None:
        parts = urlsplit(endpoint)
        self.endpoint = endpoint
        self.method = ENDPOINT_SCHEMES[parts.scheme]
        self.host = parts.hostname or "?"
        # scheme://host:port only: a device farm's endpoint path or query may carry an access key
        self.shown = f"{parts.scheme}://{self.host}" + (f":{parts.port}" if parts.port else "")
        self.command_line: list[str] | None = None
        self.command_line_source = "not asked yet"

    async def open(self, playwright: Any) -> Any:
        connect = getattr(playwright.chromium, self.method)
        browser = await connect(self.endpoint, timeout=CONNECT_TIMEOUT_MS)
        self.command_line, self.command_line_source = await _reported_command_line(browser)
        return browser

    async def close(self, browser: Any) -> None:
        """Disconnect (the contexts this harness made are closed); the remote browser keeps running."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(browser.close(), CLOSE_TIMEOUT_S)

    def kill(self) -> None:
        """A remote browser is not ours to kill."""

    def alive(self, browser: Any) -> bool:
        return browser is not None and browser.is_connected()

    def start_failure(self, exc: BaseException) -> str:
        return f"cannot connect to the remote browser at {self.shown}: {_first_line(exc)}"

    def lost(self) -> str:
        return f"the remote browser at {self.shown} disconnected; "

    restarting = "reconnecting for the next job"

    def facts(self) -> dict[str, Any]:
        return {
            "browser": "remote",
            "browser_endpoint": self.shown,
            "browser_endpoint_host": self.host,
            "browser_connection": f"Playwright {self.method}",
            "browser_command_line": self.command_line,
            "browser_command_line_source": self.command_line_source,
            "flags": None,  # not ours: see browser_command_line
            "gpu_profile": None,
            "gpu_profile_reason": "a remote browser runs with the flags it was started with (browser_command_line)",
        }


BrowserSource = LocalBrowser | RemoteBrowser


class BrowserSession:
    """One browser (launched or remote), the context its pages load from, and the current setting's page."""

    def __init__(self, playwright: Any, source: BrowserSource, files: PageFiles) -> None:
        self.playwright = playwright
        self.source = source
        self.files = files
        self.browser: Any = None
        self.context: Any = None
        self.version = ""
        self.restarts = 0
        self._page: Any = None
        self._page_key: object = None
        self._adapter: dict[str, Any] | None = None
        self._memory: LoopMemory | None = None
        self._memory_result: dict[str, Any] | None = None
        self._proven: Any = None  # the page whose WebGPU device answered its trivial dispatch
        # (ep, device type) -> the `unsupported` answer of a device that made no progress; kept across
        # restarts, so every later job of that setting gets it at once
        self._stalls: dict[tuple[str, str | None], dict[str, Any]] = {}

    async def start(self) -> None:
        self.browser = await self.source.open(self.playwright)
        self.version = self.browser.version
        self.context = await self.browser.new_context()
        await self.files.attach(self.context)

    async def close(self) -> None:
        self._page, self._page_key, self._adapter, self.context = None, None, None, None
        self._stop_memory()
        if self.browser is not None:
            await self.source.close(self.browser)
            self.browser = None

    async def alive_after_failure(self) -> bool:
        """Whether the browser survived a failed call. Playwright sees the pipe close while the kernel is still
        tearing a killed process down, so give it a moment to turn into a zombie before believing it lives."""
        deadline = asyncio.get_running_loop().time() + DEATH_GRACE_S
        while self.source.alive(self.browser) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return self.source.alive(self.browser)

    async def restart(self) -> None:
        """Close this browser; the next job starts (or connects to) a fresh one (ensure_started)."""
        await self.close()
        self.restarts += 1

    async def ensure_started(self) -> str | None:
        """None when the browser is up, else why it could not be started (recorded on the job's row)."""
        if self.browser is not None and self.browser.is_connected():
            return None
        await self.close()
        try:
            await self.start()
        except Exception as exc:
            if self.browser is not None:
                await self.source.close(self.browser)
            self.browser = None
            return self.source.start_failure(exc)
        return None

    async def page(self, url: str, key: object) -> Any:
        """The page for this setting; a fresh one whenever the setting changes or the old one died."""
        if self._page is not None and self._page_key == key and not self._page.is_closed():
            return self._page
        if self._page is not None:
            with contextlib.suppress(Exception):
                await self._page.close()
        self._page = await self.context.new_page()
        if self.source.memory_pid is not None:  # a browser launched here: its memory during the timed loop
            await self._page.expose_function(LOOP_MARK, self._loop_mark)
        await self._page.goto(url)
        await self._page.wait_for_function("window.accelharnessReady === true", timeout=PAGE_READY_MS)
        self._page_key = key
        return self._page

    def _loop_mark(self, mark: str) -> None:
        """The page's timed loop starts ('start') or ends ('end'): outside the timed region."""
        if mark == "start" and self.source.memory_pid is not None:
            self._stop_memory()
            self._memory = LoopMemory(self.source.memory_pid)
            self._memory.start()
        elif mark == "end" and self._memory is not None:
            self._memory_result = self._memory.stop()
            self._memory = None

    def _stop_memory(self) -> None:
        if self._memory is not None:
            self._memory.stop()
            self._memory = None

    async def platform_verdict(self, platform: str, device_type: str | None) -> Verdict:
        """`platform` as this browser's own page sees it (the probe page in this context): what a run stores
        for the browser that ran, not for another one launched to ask."""
        page = self._loaded_page() or await self.page(self.files.page_url, "platform-probe")
        probing = page.evaluate("d => window.accelharness.probe(d)", device_type or "gpu")
        facts = await asyncio.wait_for(probing, PROBE_TIMEOUT_S)
        return next(v for v in verdicts_from(facts | self.facts()) if v[0] == platform)

    def _loaded_page(self) -> Any:
        """The page a job last ran in, while it is open: every page is the same benchmark page, so a probe asked
        there answers as a fresh one would, without another renderer and another load of the page's scripts."""
        return self._page if self._page is not None and not self._page.is_closed() else None

    async def webgpu_adapter(self, key: object = "adapter-probe") -> dict[str, Any]:
        """The page's adapterReport() (adapter.info, features, limits), once per browser start; asked in the
        page of `key` (the job about to run there, which then finds its page loaded)."""
        if self._adapter is None:
            try:
                page = await self.page(self.files.page_url, key)
                report = page.evaluate("() => window.accelharness.adapterReport()")
                self._adapter = await asyncio.wait_for(report, PROBE_TIMEOUT_S)
            except Exception as exc:  # the job itself will fail and say why
                return {"available": False, "error": f"adapter probe failed: {_first_line(exc)}"}
        return self._adapter

    async def run_job(self, url: str, key: object, job: PageJob, timeout_s: float) -> dict[str, Any]:
        """The page's validated answer (with `browser_memory`, the launched browser's peak during the timed
        loop), or a synthesized timeout/error answer (the browser is then restarted). A WebGPU page's device
        is proved first (harness.web.device_probe); one that made no progress answers for its setting."""
        stall = self.device_stall(job.ep, job.device_type)
        if stall is not None:
            return stall
        problem = await self.ensure_started()
        if problem is not None:
            return _failure("error", problem)
        killer = None
        stage = "loading the benchmark page"
        self._memory_result = None
        try:
            page = await asyncio.wait_for(self.page(url, key), timeout_s)
            stage = "proving the WebGPU device"
            stall = await self._prove(page, job)
            if stall is not None:
                return stall
            stage = "running the job"
            if job.fault == "kill":  # test-only: SIGKILL the browser while the page is mid-job
                killer = asyncio.get_running_loop().call_later(KILL_FAULT_DELAY_S, self.source.kill)
            run = page.evaluate("job => window.accelharness.runJob(job)", job.page_json())
            raw = await asyncio.wait_for(run, timeout_s)
        except TimeoutError:
            await self.restart()
            why = f"no answer within --timeout {timeout_s:g}s while {stage}; {self.source.restarting}"
            return _failure("timeout", why)
        except Exception as exc:  # Playwright's TargetClosedError, 'Target crashed', a page that never loads...
            survived = await self.alive_after_failure()
            gone = "" if survived else self.source.lost()
            await self.restart()
            return _failure(
                "error", f"the browser failed while {stage}: {gone}{_first_line(exc)}; {self.source.restarting}"
            )
        finally:
            if killer is not None:
                killer.cancel()
            self._stop_memory()  # a loop that never reached its end mark
        try:
            answer = validate_page_result(raw, job, timeout_s)
        except PageResultError as exc:
            return _failure("error", f"the page's answer failed validation: {exc}")
        answer["browser_memory"] = self._memory_result
        return answer

    def device_stall(self, ep: str, device_type: str | None) -> dict[str, Any] | None:
        """The answer of this setting's device that made no progress (a fresh copy), or None."""
        stall = self._stalls.get((ep, device_type))
        return None if stall is None else copy.deepcopy(stall)

    async def _prove(self, page: Any, job: PageJob) -> dict[str, Any] | None:
        """None once the page's device answered (or when the EP has none); else the stall's answer."""
        if page is self._proven or not probes_device(job.ep):
            return None
        stall = await prove_device(page, job.ep, job.fault)
        if stall is None:
            self._proven = page
            return None
        self._stalls[(job.ep, job.device_type)] = stall.answer
        if stall.page_stuck:
            await self.restart()
        return self.device_stall(job.ep, job.device_type)

    def facts(self) -> dict[str, Any]:
        return self.source.facts() | {
            "browser_version": self.version,
            "browser_restarts": self.restarts,
            "page_transport": self.files.transport,
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _failure(status: str, message: str) -> dict[str, Any]:
    return {"status": status, "error": message, "facts": {}}


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, also from code that is already inside an event loop (then in a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _probe(choice: BrowserChoice, device_type: str) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    files = RoutedPages()  # no port: the probe page arrives through Playwright's routing
    async with async_playwright() as playwright:
        profile = gpu_profile("auto")  # what a run with default options launches
        source = LocalBrowser(choice, launch_flags(WEB_HARDWARE, profile), profile)
        session = BrowserSession(playwright, source, files)
        try:
            await session.start()
            page = await session.page(files.page_url, "probe")
            probing = page.evaluate("d => window.accelharness.probe(d)", device_type)
            facts = await asyncio.wait_for(probing, PROBE_TIMEOUT_S)
            return facts | session.facts()
        finally:
            await session.close()


@cache
def probe_browser(browser: str = "chromium", device_type: str = "gpu") -> dict[str, Any]:
    """One browser launch: what the page sees of WebAssembly, WebGPU and WebNN (cached per process)."""
    try:
        choice = resolve_browser(browser, headless=True)
        return {"ok": True} | run_sync(_probe(choice, device_type))
    except (BrowserNotFound, SetupError) as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # the browser failed to start or the page did not load
        return {"ok": False, "error": f"browser probe failed: {type(exc).__name__}: {exc}"}


def _webgpu_verdict(facts: dict[str, Any]) -> tuple[bool, str, str | None]:
    webgpu = facts.get("webgpu") or {}
    if not webgpu.get("available"):
        return False, webgpu.get("error") or "no WebGPU adapter", None
    verdict = classify_adapter(webgpu.get("info"))
    name = adapter_name(webgpu.get("info") or {})
    if verdict is not None and verdict.software:
        why = f"a software (fallback) adapter: {verdict.why}"
        return True, f"adapter '{name}' is {why}; correctness only, not GPU speed", name
    return True, f"adapter '{name}' (hardware)", name


def platform_verdicts(browser: str = "chromium") -> list[Verdict]:
    """(platform, available, reason, device) for wasm, webgpu and webnn, from one probe page."""
    facts = probe_browser(browser)
    if not facts.get("ok"):
        return [(p, False, facts["error"], None) for p in ("webnn", "webgpu", "wasm")]
    return verdicts_from(facts)


def _where(facts: dict[str, Any]) -> str:
    """Which browser answered: its kind and version, its binary or (a remote one) its endpoint, its GPU profile."""
    origin = facts.get("browser_binary") or facts.get("browser_endpoint") or "?"
    profile = f", --gpu {facts['gpu_profile']}" if facts.get("gpu_profile") else ""
    return f"{facts.get('browser')} {facts.get('browser_version')} ({origin}{profile})"


def verdicts_from(facts: dict[str, Any]) -> list[Verdict]:
    """The verdicts of one probe page's facts (window.accelharness.probe) with its browser's facts."""
    where = _where(facts)
    isolated = facts.get("cross_origin_isolated")
    wasm_reason = f"{where}: WebAssembly, crossOriginIsolated={str(isolated).lower()}" + (
        ", threads available" if isolated and facts.get("shared_array_buffer") else ", single thread only"
    )
    webgpu_ok, webgpu_reason, device = _webgpu_verdict(facts)
    webnn = facts.get("webnn") or {}
    webnn_found = f"MLContext ({webnn.get('device_type')})" if webnn.get("available") else webnn.get("error", "?")
    return [
        ("webnn", bool(webnn.get("available")), f"{where}: {webnn_found}", None),
        ("webgpu", webgpu_ok, f"{where}: {webgpu_reason}", device),
        ("wasm", bool(facts.get("webassembly")), wasm_reason, None),
    ]
