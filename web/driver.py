"""Find the browser, launch it headless through Playwright, and run page jobs under a time limit.

The page times everything itself; this module only hands it a job and reads the answer. A page
that does not answer within the timeout, or a browser that crashes or disconnects, becomes a
`timeout`/`error` answer and the browser is restarted, so one bad job never ends the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import psutil

from harness.web.server import PageResultError, PageServer, SetupError, validate_page_result

BROWSERS = ("chrome", "chromium", "edge")
CANDIDATES: dict[str, tuple[str, ...]] = {
    "chrome": ("google-chrome", "google-chrome-stable", "/opt/google/chrome/chrome"),
    "chromium": ("chromium", "chromium-browser", "/usr/bin/chromium"),
    "edge": ("microsoft-edge", "microsoft-edge-stable", "/opt/microsoft/msedge/msedge"),
}
# Distribution launchers are shell scripts that add their own flags (Debian's /etc/chromium.d adds
# --enable-gpu-rasterization, extensions...); the binary they exec is launched instead, so the flag
# list recorded with each row is the one the browser got.
REAL_BINARIES = ("chrome", "msedge", "chromium", "/usr/lib/chromium/chromium", "/usr/lib/chromium-browser/chromium")

BASE_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",  # SwiftShader still serves WebGPU with it; drop it (and add Vulkan/ANGLE flags) on a real GPU
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-unsafe-webgpu",
)
EP_FLAGS: dict[str, tuple[str, ...]] = {
    "wasm": (),
    "webgpu": (),
    "webnn": ("--enable-features=WebMachineLearningNeuralNetwork",),
}
# One bundle per EP, each the import ORT's docs give for it. The wasm EP gets the plain
# (non-asyncify) build: on bert-tiny the JSEP/asyncify builds ran the same wasm EP 2-6x slower.
BUNDLES = {"wasm": "ort.wasm.min.mjs", "webgpu": "ort.webgpu.min.mjs", "webnn": "ort.all.min.mjs"}
PAGE_READY_MS = 30_000
CLOSE_TIMEOUT_S = 10.0
KILL_FAULT_DELAY_S = 1.0
DEATH_GRACE_S = 2.0  # how long a crashed/killed browser may take to finish dying
PROBE_TIMEOUT_S = 60.0

T = TypeVar("T")


class BrowserNotFound(RuntimeError):
    """No usable browser binary; the message names every name and path looked for."""


@dataclass(frozen=True)
class BrowserChoice:
    requested: str  # chrome | chromium | edge
    kind: str  # what is actually launched: chrome | chromium | edge | path
    found: str  # the name or path that resolved
    binary: Path  # the executable launched
    fallback: str | None  # why it is not the requested browser, if it is not


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
    for name in REAL_BINARIES:
        candidate = Path(name) if name.startswith("/") else path.parent / name
        if candidate.is_file() and os.access(candidate, os.X_OK) and not _is_script(candidate):
            return candidate
    return path


def _lookup(name: str) -> Path | None:
    if name.startswith("/"):
        return Path(name) if Path(name).is_file() and os.access(name, os.X_OK) else None
    found = shutil.which(name)
    return Path(found) if found else None


def resolve_browser(browser: str, browser_path: Path | str | None = None) -> BrowserChoice:
    """The binary for --browser/--browser-path; chrome and edge fall back to Chromium."""
    if browser not in BROWSERS:
        raise BrowserNotFound(f"unknown browser '{browser}'; valid: {', '.join(BROWSERS)}")
    if browser_path is not None:
        path = Path(browser_path)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrowserNotFound(f"--browser-path {path}: no executable file there (looked only at that path)")
        return BrowserChoice(browser, "path", str(path), real_binary(path), None)
    order = [(browser, CANDIDATES[browser])]
    if browser != "chromium":
        order.append(("chromium", CANDIDATES["chromium"]))
    for kind, names in order:
        for name in names:
            path = _lookup(name)
            if path is not None:
                fallback = None
                if kind != browser:
                    fallback = f"{browser} not found (looked for {', '.join(CANDIDATES[browser])}); used {path}"
                return BrowserChoice(browser, kind, name, real_binary(path), fallback)
    looked = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in order)
    raise BrowserNotFound(f"no {browser} browser found (looked for {looked}); pass --browser-path")


def launch_flags(eps: list[str] | tuple[str, ...]) -> list[str]:
    flags = list(BASE_FLAGS)
    for ep in eps:
        flags += [f for f in EP_FLAGS[ep] if f not in flags]
    return flags


def _browser_processes() -> dict[int, list[str]]:
    """Our descendant browser main processes (Playwright talks to them over a pipe)."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if "--remote-debugging-pipe" in cmdline and not any(a.startswith("--type=") for a in cmdline):
                found[child.pid] = cmdline
    return found


class BrowserSession:
    """One launched browser and the page the current (EP, threads) setting runs in."""

    def __init__(self, playwright: Any, choice: BrowserChoice, flags: list[str]) -> None:
        self.playwright = playwright
        self.choice = choice
        self.flags = flags
        self.browser: Any = None
        self.version = ""
        self.pid: int | None = None
        self.command_line: list[str] = []
        self.restarts = 0
        self._page: Any = None
        self._page_key: object = None

    async def start(self) -> None:
        before = set(_browser_processes())
        self.browser = await self.playwright.chromium.launch(
            executable_path=str(self.choice.binary), headless=True, args=self.flags
        )
        self.version = self.browser.version
        new = {pid: cmd for pid, cmd in _browser_processes().items() if pid not in before}
        self.pid, self.command_line = next(iter(new.items()), (None, []))

    async def close(self) -> None:
        self._page, self._page_key = None, None
        if self.browser is not None:
            try:
                await asyncio.wait_for(self.browser.close(), CLOSE_TIMEOUT_S)
            except Exception:  # a wedged browser: make sure the process is gone
                self.kill()
            self.browser = None

    def kill(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def alive(self) -> bool:
        try:
            return self.pid is not None and psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    async def alive_after_failure(self) -> bool:
        """Whether the browser survived a failed call. Playwright sees the pipe close while the kernel is still
        tearing a killed process down, so give it a moment to turn into a zombie before believing it lives."""
        deadline = asyncio.get_running_loop().time() + DEATH_GRACE_S
        while self.alive() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return self.alive()

    async def restart(self) -> None:
        """Close this browser; the next job starts a fresh one (ensure_started)."""
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
            self.browser = None
            return f"the browser failed to start: {_first_line(exc)}"
        return None

    async def page(self, url: str, key: object) -> Any:
        """The page for this setting; a fresh one whenever the setting changes or the old one died."""
        if self._page is not None and self._page_key == key and not self._page.is_closed():
            return self._page
        if self._page is not None:
            with contextlib.suppress(Exception):
                await self._page.close()
        self._page = await self.browser.new_page()
        await self._page.goto(url)
        await self._page.wait_for_function("window.accelharnessReady === true", timeout=PAGE_READY_MS)
        self._page_key = key
        return self._page

    async def run_job(self, url: str, key: object, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The page's validated answer, or a synthesized timeout/error answer (the browser is then restarted)."""
        problem = await self.ensure_started()
        if problem is not None:
            return _failure("error", problem)
        killer = None
        stage = "loading the benchmark page"
        try:
            page = await asyncio.wait_for(self.page(url, key), timeout_s)
            stage = "running the job"
            if job.get("fault") == "kill":  # test-only: SIGKILL the browser while the page is mid-job
                killer = asyncio.get_running_loop().call_later(KILL_FAULT_DELAY_S, self.kill)
            raw = await asyncio.wait_for(page.evaluate("job => window.accelharness.runJob(job)", job), timeout_s)
        except TimeoutError:
            await self.restart()
            return _failure("timeout", f"no answer within --timeout {timeout_s:g}s while {stage}; browser restarted")
        except Exception as exc:  # Playwright's TargetClosedError, 'Target crashed', a page that never loads...
            survived = await self.alive_after_failure()
            gone = "" if survived else f"browser process {self.pid} is gone (crashed or killed); "
            await self.restart()
            return _failure("error", f"the browser failed while {stage}: {gone}{_first_line(exc)}; browser restarted")
        finally:
            if killer is not None:
                killer.cancel()
        try:
            return validate_page_result(raw, job["max_iterations"])
        except PageResultError as exc:
            return _failure("error", f"the page's answer failed validation: {exc}")

    def facts(self) -> dict[str, Any]:
        return {
            "browser": self.choice.kind,
            "browser_requested": self.choice.requested,
            "browser_version": self.version,
            "browser_binary": str(self.choice.binary),
            "browser_found_as": self.choice.found,
            "browser_fallback": self.choice.fallback,
            "flags": self.flags,
            "browser_command_line": self.command_line,
            "browser_restarts": self.restarts,
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

    server = PageServer()
    await server.start()
    try:
        async with async_playwright() as playwright:
            session = BrowserSession(playwright, choice, launch_flags(list(EP_FLAGS)))
            try:
                await session.start()
                page = await session.page(server.page_url, "probe")
                probing = page.evaluate("d => window.accelharness.probe(d)", device_type)
                facts = await asyncio.wait_for(probing, PROBE_TIMEOUT_S)
                return facts | session.facts()
            finally:
                await session.close()
    finally:
        await server.stop()


@cache
def probe_browser(browser: str = "chromium", device_type: str = "gpu") -> dict[str, Any]:
    """One browser launch: what the page sees of WebAssembly, WebGPU and WebNN (cached per process)."""
    try:
        choice = resolve_browser(browser)
        return {"ok": True} | run_sync(_probe(choice, device_type))
    except (BrowserNotFound, SetupError) as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # the browser failed to start or the page did not load
        return {"ok": False, "error": f"browser probe failed: {type(exc).__name__}: {exc}"}


def _webgpu_verdict(facts: dict[str, Any]) -> tuple[bool, str, str | None]:
    webgpu = facts.get("webgpu") or {}
    if not webgpu.get("available"):
        return False, webgpu.get("error") or "no WebGPU adapter", None
    adapter = webgpu.get("adapter") or {}
    name = " ".join(str(adapter.get(k)) for k in ("vendor", "architecture", "description") if adapter.get(k))
    if is_fallback_adapter(adapter):
        return True, f"adapter {name or '?'} is a fallback/software adapter: correctness only, not GPU speed", name
    return True, f"adapter {name or '?'}", name


def is_fallback_adapter(adapter: dict[str, Any] | None) -> bool:
    """A software or fallback WebGPU adapter (SwiftShader, llvmpipe, WARP) runs 100-300x slower than a GPU."""
    if not adapter:
        return False
    text = " ".join(str(adapter.get(k, "")) for k in ("vendor", "architecture", "description", "device")).lower()
    return adapter.get("isFallbackAdapter") is True or any(s in text for s in SOFTWARE_ADAPTERS)


SOFTWARE_ADAPTERS = ("swiftshader", "llvmpipe", "lavapipe", "microsoft basic render", "warp")


def platform_verdicts(browser: str = "chromium") -> list[tuple[str, bool, str, str | None]]:
    """(platform, available, reason, device) for wasm, webgpu and webnn, from one probe page."""
    facts = probe_browser(browser)
    if not facts.get("ok"):
        return [(p, False, facts["error"], None) for p in ("webnn", "webgpu", "wasm")]
    where = f"{facts['browser']} {facts['browser_version']} ({facts['browser_binary']})"
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
