"""Which platforms this machine can run, and why not where it cannot.

A native platform is available when at least one engine target on it probes available. The
browser platforms (wasm, webgpu, webnn) are decided by a probe page in headless Chromium
(harness.web.driver.platform_verdicts): WebAssembly, the WebGPU adapter, a WebNN MLContext. A run
that drives no browser records the native platforms only: launching Chromium to say what a page
could do would cost a native run more time (1.5 s) than many of its measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.records import Target
from harness.native import ENGINES, get_backend
from harness.native.base import Availability
from harness.web.eps import WEB_HARDWARE

NATIVE_PLATFORMS = ("cpu", "cuda", "rocm", "mps", "openvino", "qnn", "directml")
PLATFORMS = NATIVE_PLATFORMS + WEB_HARDWARE  # the browser platforms are the browser EP table's


@dataclass(frozen=True)
class PlatformStatus:
    platform: str
    available: bool
    reason: str
    device_name: str | None = None


def native_targets(hardware: list[str], engines: list[str]) -> list[tuple[Target, Availability]]:
    """Every target of the given hardware served by the given engines, with its probe."""
    found = []
    for engine in engines:
        backend = get_backend(engine)
        for target in backend.targets():
            if target.hardware in hardware:
                found.append((target, backend.probe(target)))
    return found


def _gpu_names() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def detect_platforms(browser: bool = True) -> list[PlatformStatus]:
    """Every native platform, and the browser platforms too unless `browser` is False."""
    targets = native_targets(list(NATIVE_PLATFORMS), list(ENGINES))
    statuses = []
    for platform in NATIVE_PLATFORMS:
        probes = [(t, a) for t, a in targets if t.hardware == platform]
        ready = [f"{t.engine}:{t.provider}" for t, a in probes if a.ok]
        if ready:
            statuses.append(PlatformStatus(platform, True, "runs on " + ", ".join(ready)))
        else:
            reasons = "; ".join(sorted({a.reason for _, a in probes}))
            statuses.append(PlatformStatus(platform, False, reasons or "no engine serves it"))
    return statuses + (web_platforms() if browser else [])


def web_platforms() -> list[PlatformStatus]:
    """wasm, webgpu and webnn as a real page in the browser sees them (one launch, cached per process)."""
    from harness.web.driver import platform_verdicts

    return [PlatformStatus(*verdict) for verdict in platform_verdicts()]


def hardware_rows(browser: bool = True) -> list[dict]:
    """Rows for the store's hardware table: one per platform (browser platforms only if `browser`)."""
    gpus = _gpu_names()
    rows = []
    for status in detect_platforms(browser):
        device = ", ".join(gpus) if status.platform in ("cuda", "rocm") and gpus else status.device_name
        rows.append(
            {"platform": status.platform, "available": status.available, "reason": status.reason, "device_name": device}
        )
    return rows
