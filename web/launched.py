"""Browsers the harness launches without Playwright: Firefox (its own process, or through geckodriver) and Safari
(through safaridriver). Each opens the run's served page (harness.web.device_server), which asks for its jobs over
the same protocol a phone opening `web --serve`'s URL uses; only the launch and the kill are this module's.

Playwright drives only the Chromium family here: its Firefox channel is its own patched build (downloaded, and
its wasm is reported to stay on the baseline tier) and its BiDi channel fails on Firefox ESR 153
(`emulation.setMediaFeaturesOverride: unknown command`). A launched Firefox gets a fresh profile of its own
(FIREFOX_PREFS in its user.js), runs headless unless --headed, and lives in its own process group: closing or
killing the run leaves no Firefox behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.core.labels import LAUNCHED_BROWSERS

__all__ = ["LAUNCHED_BROWSERS", "LaunchError", "LaunchedChoice", "launcher", "resolve_launched"]

DRIVERS = ("process", "webdriver")  # how a launched Firefox is started: its own process, or through geckodriver
FIREFOX_CANDIDATES = (
    "firefox-esr",
    "firefox",
    "/usr/lib/firefox-esr/firefox-esr",
    "/usr/lib/firefox/firefox",
    "/Applications/Firefox.app/Contents/MacOS/firefox",
)
SAFARI_DRIVERS = ("safaridriver", "/usr/bin/safaridriver")
# A fresh profile's user.js: nothing but the page runs (no updates, telemetry, first-run or session-restore pages,
# background services), no slow-script dialog stops a long wasm job, and WebGPU is on where the build has it.
FIREFOX_PREFS: dict[str, Any] = {
    "app.update.disabledForTesting": True,
    "app.update.auto": False,
    "app.normandy.enabled": False,
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.startup.page": 0,
    "browser.aboutwelcome.enabled": False,
    "browser.sessionstore.resume_from_crash": False,
    "browser.safebrowsing.downloads.remote.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.healthreport.uploadEnabled": False,
    "toolkit.telemetry.enabled": False,
    "toolkit.telemetry.unified": False,
    "toolkit.startup.max_resumed_crashes": -1,
    "extensions.update.enabled": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "dom.max_script_run_time": 0,
    "dom.webgpu.enabled": True,
}
CLOSE_GRACE_S = 5.0  # how long a closed Firefox may take to exit before its process group is killed


class LaunchError(RuntimeError):
    """The browser or its driver could not be found or started; the message says what was looked for."""


class Launcher(Protocol):
    """One launched browser at the served page: the run opens it, watches it, and closes (or kills) it."""

    async def open(self, page_url: str) -> None: ...

    def alive(self) -> bool: ...

    async def close(self) -> None: ...

    def kill(self) -> None: ...

    def facts(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LaunchedChoice:
    """A browser launched outside Playwright: which, the binary, how it is driven, and the binary's own version."""

    kind: str  # firefox | safari
    binary: Path | None  # None: the driver finds it (Safari), or a remote driver's
    driver: str  # process | webdriver
    version: str | None  # the binary's `--version` line, e.g. "Mozilla Firefox 153.8.0esr"
    webdriver_url: str | None = None  # a remote driver (a device farm's, a Mac on the network)

    @property
    def device(self) -> str:
        """What the rows' target says ran them: the browser, beside Chromium's unnamed default."""
        return self.kind


def _lookup(name: str) -> Path | None:
    if name.startswith("/"):
        return Path(name) if Path(name).is_file() and os.access(name, os.X_OK) else None
    found = shutil.which(name)
    return Path(found) if found else None


def binary_version(binary: Path) -> str | None:
    """`firefox --version`'s line (Firefox reads no profile for it), or None when it says nothing in 20 s."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    line = (done.stdout or "").strip().splitlines()
    return line[0][:200] if line else None


def resolve_launched(
    kind: str, browser_path: Path | None = None, driver: str = "process", webdriver_url: str | None = None
) -> LaunchedChoice:
    """The browser --browser firefox|safari names: its binary (or --browser-path) and how it is driven."""
    if kind == "safari":  # Safari has one way in: safaridriver (on every Mac), or a remote WebDriver
        if webdriver_url is None and sys.platform != "darwin":
            raise LaunchError(
                "--browser safari: Safari runs on macOS only, through safaridriver (run `safaridriver --enable` "
                "once); from another machine, point --webdriver-url at a Mac's or a device farm's WebDriver"
            )
        return LaunchedChoice("safari", None, "webdriver", None, webdriver_url)
    if webdriver_url is not None:
        return LaunchedChoice(kind, browser_path, "webdriver", None, webdriver_url)
    if browser_path is not None:
        if not (browser_path.is_file() and os.access(browser_path, os.X_OK)):
            raise LaunchError(f"--browser-path {browser_path}: no executable file there (looked only at that path)")
        binary = browser_path
    else:
        found = next((path for name in FIREFOX_CANDIDATES if (path := _lookup(name)) is not None), None)
        if found is None:
            raise LaunchError(
                f"no Firefox found (looked for {', '.join(FIREFOX_CANDIDATES)}); install firefox-esr "
                "(`make setup` does, with apt) or pass --browser-path"
            )
        binary = found
    version = binary_version(binary)
    if version is None or "firefox" not in version.lower():
        raise LaunchError(f"{binary}: `--version` did not name Firefox ({version or 'no answer'}); pass a Firefox")
    return LaunchedChoice(kind, binary, driver, version)


def write_profile(folder: Path, prefs: dict[str, Any]) -> None:
    """A fresh Firefox profile: only a user.js, read at start over every default."""
    lines = [f"user_pref({json.dumps(name)}, {json.dumps(value)});" for name, value in prefs.items()]
    (folder / "user.js").write_text("\n".join(lines) + "\n")


def die_with_parent() -> None:
    """In the child, before exec (Linux): SIGKILL when the harness dies, even by SIGKILL, so no Firefox outlives
    the run (its content processes exit when it does: "Exiting due to channel error")."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kill_group(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a launched process's whole group (the browser's content and GPU processes are in it)."""
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=CLOSE_GRACE_S)


class FirefoxProcess:
    """Firefox started here as its own process: `-headless -no-remote -profile <fresh> URL`, in a process group."""

    def __init__(self, choice: LaunchedChoice, headless: bool = True, args: tuple[str, ...] = ()) -> None:
        assert choice.binary is not None
        self.choice = choice
        self.headless = headless
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self.command_line: list[str] = []
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._profile = ""

    async def open(self, page_url: str) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="accelharness-firefox-")
        profile = Path(self._folder.name) / "profile"
        profile.mkdir()
        write_profile(profile, FIREFOX_PREFS)
        self._profile = str(profile)
        headless = ["-headless"] if self.headless else []
        self.command_line = [str(self.choice.binary), *headless, "-no-remote", "-new-instance", "-profile",
                             str(profile), *self.args, page_url]  # fmt: skip
        log = (Path(self._folder.name) / "firefox.log").open("wb")
        env = {**os.environ, "MOZ_CRASHREPORTER_DISABLE": "1", "MOZ_DISABLE_AUTO_SAFE_MODE": "1"}
        try:
            self.process = subprocess.Popen(
                self.command_line, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env, preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )  # fmt: skip
        except OSError as exc:
            raise LaunchError(f"Firefox did not start: {exc}") from None
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 3) -> str:
        """The last lines Firefox printed (how it ended), in one line."""
        if self._folder is None:
            return ""
        with contextlib.suppress(OSError):
            text = (Path(self._folder.name) / "firefox.log").read_text(errors="replace")
            return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])[:400]
        return ""

    async def close(self) -> None:
        """SIGTERM the group, wait a little, then SIGKILL it; the profile is removed."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            deadline = time.monotonic() + CLOSE_GRACE_S
            while self.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.kill()

    def kill(self) -> None:
        kill_group(self.process)
        if self._folder is not None:
            with contextlib.suppress(OSError):
                self._folder.cleanup()
            self._folder = None

    def facts(self) -> dict[str, Any]:
        return {
            "browser_driven_by": "process (the served page's protocol; no driver)",
            "browser_binary": str(self.choice.binary),
            "browser_binary_version": self.choice.version,
            # the URL (its token) and the profile's temporary path left out
            "browser_command_line": ["<fresh profile>" if a == self._profile else a for a in self.command_line[:-1]],
            "browser_prefs": dict(FIREFOX_PREFS),
            "headed": not self.headless,
        }


def launcher(choice: LaunchedChoice, headless: bool = True, args: tuple[str, ...] = ()) -> Launcher:
    """How this choice is started: Firefox's own process, or a WebDriver session (geckodriver, safaridriver, or a
    remote driver)."""
    if choice.driver == "process":
        return FirefoxProcess(choice, headless, args)
    from harness.web.webdriver import WebDriverBrowser

    prefs = dict(FIREFOX_PREFS) if choice.kind == "firefox" else None
    return WebDriverBrowser(choice.kind, choice.binary, None, choice.webdriver_url, headless, prefs, args)
