"""Peak RSS of a launched browser's page renderer and GPU process during the page's timed loop.

The page marks the loop's start and end through a Playwright binding (outside the timed region);
between the marks a thread samples the RSS of the page's renderer and the GPU process of the
browser this harness launched (psutil over its process tree) and keeps the largest sum. Samples
are taken at both marks, so a loop shorter than the interval still has two. Chromium names no
page in a renderer's command line: the page's renderer is the largest renderer that is not the
browser's own UI (--top-chrome-webui), since it holds the ORT runtime and the model; the others
(a spare renderer kept for the next page) are recorded apart. A remote browser's processes are on
another machine: its rows have no such figure, and say why.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import psutil

from harness.core.units import MB

PROCESS_TYPES = ("renderer", "gpu-process")
INTERVAL_S = 0.01
UI_RENDERER = "--top-chrome-webui"  # the browser's own UI, not a page
COVERS = (
    "RSS of the page's renderer (the largest renderer besides the browser UI's) plus the GPU process of the "
    f"launched browser, summed; sampled every {INTERVAL_S * 1000:g} ms and at the timed loop's start and end "
    "marks; the largest sum during the loop (pages shared by the two processes count twice)"
)


def _process_type(process: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        cmdline = process.cmdline()
        for arg in cmdline:
            if arg.startswith("--type="):
                kind = arg.removeprefix("--type=")
                return kind if kind in PROCESS_TYPES and UI_RENDERER not in cmdline else None
    return None


def _rss_mb(process: psutil.Process) -> float:
    try:
        return process.memory_info().rss / MB
    except psutil.Error:
        return 0.0


class LoopMemory:
    """One timed loop's peak; start() at the page's first mark, stop() at its second."""

    def __init__(self, browser_pid: int) -> None:
        self.browser_pid = browser_pid
        self._processes: list[tuple[str, psutil.Process]] = []
        self._peak = 0.0
        self._peak_by_type: dict[str, float] = {}
        self._samples = 0
        # the GPU process's RSS at the loop's start and end: where WebGPU buffers live on a software adapter
        # (a renderer's RSS moves by tens of MB with V8's heap alone, so it tells nothing of a leak)
        self._gpu_ends: list[float] = []
        self._others: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        found: list[tuple[str, psutil.Process]] = []
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.browser_pid).children(recursive=True):
                kind = _process_type(child)
                if kind is not None:
                    found.append((kind, child))
        renderers = sorted((p for kind, p in found if kind == "renderer"), key=_rss_mb, reverse=True)
        self._others = {p.pid: round(_rss_mb(p), 1) for p in renderers[1:]}
        self._processes = [(kind, p) for kind, p in found if kind != "renderer"] + [
            ("renderer", p) for p in renderers[:1]
        ]
        self._peak, self._peak_by_type, self._samples = 0.0, {}, 0
        self._stop.clear()
        self._gpu_ends = [self._sample().get("gpu-process", 0.0)]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sample()

    def _sample(self) -> dict[str, float]:
        by_type: dict[str, float] = {}
        for kind, process in self._processes:  # a process that exits mid-loop no longer counts
            by_type[kind] = by_type.get(kind, 0.0) + _rss_mb(process)
        total = sum(by_type.values())
        self._samples += 1
        if total > self._peak:
            self._peak, self._peak_by_type = total, by_type
        return by_type

    def stop(self) -> dict[str, Any]:
        """memory_peak_mb (None when no process was found) and details saying what it covers."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._gpu_ends.append(self._sample().get("gpu-process", 0.0))
        measured = any(kind == "gpu-process" for kind, _ in self._processes) and len(self._gpu_ends) == 2
        return {
            "memory_peak_mb": self._peak if self._processes else None,
            "memory_covers": COVERS if self._processes else "no renderer or GPU process found under the browser",
            "memory_processes": {kind: process.pid for kind, process in self._processes},
            "memory_peak_by_type_mb": self._peak_by_type,
            "memory_other_renderers_mb": self._others,  # at the loop's start, not counted
            "memory_samples": self._samples,
            "gpu_process_loop_start_mb": self._gpu_ends[0] if measured else None,
            "gpu_process_loop_end_mb": self._gpu_ends[1] if measured else None,
        }
