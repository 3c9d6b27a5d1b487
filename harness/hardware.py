"""Which platforms this machine can run, and why not where it cannot.

A native platform is available when at least one engine target on it probes available. The
browser platforms (wasm, webgpu, webnn) are decided by a real page in Chromium, so here they
report whether a browser is present and leave the verdict to `accelharness web`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from harness.native import ENGINES, get_backend
from harness.native.base import Availability
from harness.result import Target

NATIVE_PLATFORMS = ("cpu", "cuda", "rocm", "mps", "openvino", "qnn", "directml")
WEB_PLATFORMS = ("webnn", "webgpu", "wasm")
PLATFORMS = NATIVE_PLATFORMS + WEB_PLATFORMS
BROWSER_BINARIES = ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser", "microsoft-edge")


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


def detect_platforms() -> list[PlatformStatus]:
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
    browser = next((b for b in BROWSER_BINARIES if shutil.which(b)), None)
    for platform in WEB_PLATFORMS:
        if browser is None:
            statuses.append(
                PlatformStatus(platform, False, f"no browser found (looked for {', '.join(BROWSER_BINARIES)})")
            )
        else:
            statuses.append(
                PlatformStatus(
                    platform, False, f"browser {shutil.which(browser)} found; the browser backend is not in this build"
                )
            )
    return statuses


def hardware_rows() -> list[dict]:
    """Rows for the store's hardware table (one per platform)."""
    gpus = _gpu_names()
    rows = []
    for status in detect_platforms():
        device = ", ".join(gpus) if status.platform in ("cuda", "rocm") and gpus else status.device_name
        rows.append(
            {"platform": status.platform, "available": status.available, "reason": status.reason, "device_name": device}
        )
    return rows
