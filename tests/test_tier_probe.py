"""The page's wasm tier probe (web/page/tier.mjs) in real browsers, headless, each on a fresh profile: Firefox ESR
and Chromium as they ship see their wasm tier up (`tiered` true), and the same browsers kept on their baseline tier
(the planted fault: Firefox's javascript.options.wasm_optimizingjit = false, V8's --liftoff-only) do not. The probe
runs alone in a tiny cross-origin-isolated page served here (as the harness's page is: a 5-20 µs timer) and posts
its answer back, which harness.web.answers checks as it checks every page's facts. Four browser starts, ~6 s."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.web.answers import check_facts
from harness.web.launched import FIREFOX_PREFS, die_with_parent, kill_group, write_profile
from harness.web.server import PAGE_DIR

FIREFOX = shutil.which("firefox-esr")
CHROMIUMS = ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium")
CHROMIUM = next((path for path in CHROMIUMS if Path(path).exists()), None)
ANSWER_S = 60.0  # a page that has not posted by then failed
PAGE = b"""<!doctype html><meta charset="utf-8"><title>tier</title><script type="module">
import { wasmTierProbe } from './tier.mjs';
let answer;
try {
  answer = { wasm_tier: await wasmTierProbe() };
} catch (e) {
  answer = { wasm_tier: null, wasm_tier_error: String(e) };
}
answer.user_agent = navigator.userAgent;
answer.cross_origin_isolated = self.crossOriginIsolated;
await fetch('./answer', { method: 'POST', body: JSON.stringify(answer) });
</script>
"""


class _Handler(BaseHTTPRequestHandler):
    answers: queue.Queue[dict[str, Any]]

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/tier.html":
            self._send(PAGE, "text/html")
        elif self.path == "/tier.mjs":
            self._send((PAGE_DIR / "tier.mjs").read_bytes(), "text/javascript")
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answers.put(json.loads(body))
        self._send(b"{}", "application/json")


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, queue.Queue[dict[str, Any]]]]:
    answers: queue.Queue[dict[str, Any]] = queue.Queue()
    handler = type("Handler", (_Handler,), {"answers": answers})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/tier.html", answers
    server.shutdown()
    server.server_close()


def _answer(answers: queue.Queue[dict[str, Any]], process: subprocess.Popen[bytes]) -> dict[str, Any]:
    try:
        answer = answers.get(timeout=ANSWER_S)
    except queue.Empty:
        pytest.fail(f"the probe page posted nothing in {ANSWER_S:g} s (browser exit code {process.poll()})")
    check_facts(answer)  # the checks every page's facts pass
    assert answer["cross_origin_isolated"] is True, answer
    assert answer["wasm_tier"] is not None, answer.get("wasm_tier_error")
    return answer["wasm_tier"]


def firefox_probe(url: str, answers: queue.Queue[dict[str, Any]], prefs: dict[str, Any]) -> dict[str, Any]:
    assert FIREFOX is not None
    with tempfile.TemporaryDirectory(prefix="accelharness-tier-") as folder:
        write_profile(Path(folder), FIREFOX_PREFS | prefs)
        env = {**os.environ, "MOZ_CRASHREPORTER_DISABLE": "1"}
        process = subprocess.Popen(
            [FIREFOX, "-headless", "-no-remote", "-new-instance", "-profile", folder, url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True,
            env=env, preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )  # fmt: skip
        try:
            return _answer(answers, process)
        finally:
            kill_group(process)


def chromium_probe(url: str, answers: queue.Queue[dict[str, Any]], args: list[str]) -> dict[str, Any]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="accelharness-tier-") as folder:
        process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--no-first-run", f"--user-data-dir={folder}", *args, url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )  # fmt: skip
        try:
            return _answer(answers, process)
        finally:
            kill_group(process)


@pytest.mark.skipif(FIREFOX is None, reason="needs Firefox ESR (`make setup`)")
@pytest.mark.parametrize(
    ("prefs", "tiered"),
    [({}, True), ({"javascript.options.wasm_optimizingjit": False}, False)],
    ids=["firefox", "firefox-baseline-only"],
)
def test_firefox_wasm_tiers_up_unless_kept_on_baseline(served: tuple, prefs: dict[str, Any], tiered: bool) -> None:
    """Measured here: 2.1-2.7 as shipped, 1.03-1.07 on the baseline tier only (tier.mjs's TIERED_RATIO: 1.5)."""
    found = firefox_probe(*served, prefs)
    assert found["tiered"] is tiered, found
    assert found["cold_ms"] > 0 and found["warm_ms"] > 0 and found["elapsed_ms"] < 1000, found


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium")
@pytest.mark.parametrize(
    ("args", "tiered"),
    [([], True), (["--js-flags=--liftoff-only"], False)],
    ids=["chromium", "chromium-liftoff-only"],
)
def test_chromium_wasm_tiers_up_unless_kept_on_liftoff(served: tuple, args: list[str], tiered: bool) -> None:
    """Measured here: 4.5 as shipped (Liftoff, then TurboFan), 0.92-0.95 with Liftoff only."""
    found = chromium_probe(*served, args)
    assert found["tiered"] is tiered, found
    assert found["cold_ms"] > 0 and found["warm_ms"] > 0 and found["elapsed_ms"] < 1000, found
