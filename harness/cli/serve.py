"""What `accelharness web --serve` shows while it serves: the device URL alone on a line (and as a QR code
for a phone's camera), a warning when it listens beyond this machine, then a line per device event."""

from __future__ import annotations

import sys
from typing import Any

from harness.cli.common import console, errors
from harness.core.records import Result
from harness.core.terminal import terminal_text


class ServeDisplay:
    """The callbacks harness.browser.serve.run_serve is given: on_ready(url), on_event(kind, device, job),
    on_result(result, result_id)."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.rows: list[Result] = []

    def on_ready(self, url: str) -> None:
        from harness.web.device_server import exposure_warning, qr_text

        print(url, flush=True)  # alone on its line, unwrapped: scripts (and the tests) read it from here
        print(qr_text(url), flush=True)
        console.print(
            "Open the URL on each device to measure (the QR code is the same URL, for a phone's camera); "
            "keep the tab in front until it says done."
            + (f" Stops once {self._devices()} finished." if self.request.devices else "")
            + " Ctrl-C stops serving.",
            highlight=False,
        )
        warning = exposure_warning(self.request.host, self.request.certfile is not None)
        if warning:
            errors.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True, markup=True)

    def _devices(self) -> str:
        count = self.request.devices
        return "1 device has" if count == 1 else f"{count} devices have"

    def on_result(self, result: Result, _result_id: str) -> None:
        self.rows.append(result)

    def on_event(self, kind: str, device: Any, job: Any) -> None:
        progress = device.progress()
        count = f"[{progress['done']}/{progress['total']}]"
        line = {
            "arrived": lambda: _arrived(device),
            "leased": lambda: f"{device.id}: running {job.label} ({progress['done'] + 1}/{progress['total']})",
            "answered": lambda: f"{device.id}: {job.label}: {_outcome(job.outcome)} {count}",
            "lost": lambda: f"{device.id}: its page lost its lease on {job.label} ({job.lost[-1]}); offered again",
            "timeout": lambda: f"{device.id}: {job.label}: {_outcome(job.outcome)} {count}",
            "disconnected": lambda: f"{device.id}: {job.label}: {_outcome(job.outcome)}",
        }.get(kind)
        if line is None:
            return
        # names, models, GPU descriptions, addresses and error messages come from the device
        console.print(terminal_text(line()), highlight=False, markup=False)
        if kind in ("answered", "timeout") and progress["finished"]:
            console.print(f"{device.id}: finished all {progress['total']} jobs", highlight=False, markup=False)
        sys.stdout.flush()


def _arrived(device: Any) -> str:
    page = next(reversed(device.pages.values()))
    left = f"{len(device.jobs)} jobs" if device.jobs else "nothing left to run (finished all 0 jobs)"
    return f"device {device.id} arrived ({device.name}) from {page.address} at {page.origin}: {left}"


def _outcome(outcome: dict[str, Any] | None) -> str:
    if not outcome:
        return "?"
    text = outcome["status"]
    if outcome.get("p50_ms") is not None:
        text += f", p50 {outcome['p50_ms']:.3f} ms"
    if outcome.get("max_abs_diff") is not None:
        text += f", max |diff| {outcome['max_abs_diff']:.2g}"
    if outcome.get("error"):
        text += f": {outcome['error'].splitlines()[0][:200]}"
    return text
