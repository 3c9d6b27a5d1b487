"""Which platforms this machine can run, and why not where it cannot.

A native platform is available when at least one engine target on it probes available. The
browser platforms (wasm, webgpu, webnn) are decided by a probe page in headless Chromium
(harness.web.driver.platform_verdicts): WebAssembly, the WebGPU adapter, a WebNN MLContext. A run
that drives no browser records the native platforms only: launching Chromium to say what a page
could do would cost a native run more time (1.5 s) than many of its measurements.

The native probes run once per process, in a worker (harness.run.isolation): torch's and the GPU's
probes import torch and transformers (1.6 s), which the CLI process needs for nothing else, while the
worker forks from the server that has them imported for the run's own workers; and a probe that
crashes (a broken driver) makes every target it would have probed unavailable, saying so, instead of
taking the CLI down.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.core.records import Target
from harness.native import ENGINES, get_backend
from harness.native.base import Availability
from harness.web.eps import WEB_HARDWARE

NATIVE_PLATFORMS = ("cpu", "cuda", "rocm", "mps", "openvino", "qnn", "directml", "webgpu")
# What a run without --hardware runs: native WebGPU only when asked for, since on a machine without a
# GPU it is SwiftShader on the host's cores (minutes of F rows in every default run)
DEFAULT_NATIVE_PLATFORMS = tuple(p for p in NATIVE_PLATFORMS if p != "webgpu")
# the browser platforms are the browser EP table's; webgpu is both (native WebGPU, and the page's)
PLATFORMS = NATIVE_PLATFORMS + tuple(p for p in WEB_HARDWARE if p not in NATIVE_PLATFORMS)


@dataclass(frozen=True)
class PlatformStatus:
    platform: str
    available: bool
    reason: str
    device_name: str | None = None


PROBE_TIMEOUT_S = 120.0  # a probe that takes longer is stuck (a driver that does not answer)
Probes = dict[str, list[tuple[Target, Availability]]]  # engine → its targets, each with its probe


@dataclass(frozen=True)
class MachineProbe:
    targets: Probes
    gpu_names: list[str]  # the CUDA/ROCm devices torch sees
    # engine → the devices its own discovery reports (ORT's get_ep_devices, plugin EPs registered)
    discovered: dict[str, list[dict]] = field(default_factory=dict)


def _gpu_names() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def probe_machine(engines: tuple[str, ...]) -> Iterator[MachineProbe]:
    """Worker entry point: every target of each engine with its probe, and the GPUs torch sees."""
    targets, discovered = {}, {}
    for engine in engines:
        backend = get_backend(engine)
        targets[engine] = [(target, backend.probe(target)) for target in backend.targets()]
        if hasattr(backend, "discovered_devices"):
            discovered[engine] = backend.discovered_devices()
    yield MachineProbe(targets, _gpu_names(), discovered)


@functools.cache
def machine_probe() -> MachineProbe:
    """Every engine's targets probed in a worker, once per process; where the worker fails, every
    target is unavailable with the reason."""
    from harness.run.isolation import run_isolated

    found: list[MachineProbe] = []
    outcome = run_isolated(probe_machine, ENGINES, PROBE_TIMEOUT_S, found.append, uses_torch=True)
    if found:
        return found[0]
    failed = Availability(False, f"the hardware probe failed ({outcome.status}): {outcome.message}")
    return MachineProbe({e: [(t, failed) for t in get_backend(e).targets()] for e in ENGINES}, [])


def native_targets(hardware: list[str], engines: list[str]) -> list[tuple[Target, Availability]]:
    """Every target of the given hardware served by the given engines, with its probe."""
    probed = machine_probe().targets
    return [(target, found) for engine in engines for target, found in probed[engine] if target.hardware in hardware]


def detect_platforms(browser: bool = True) -> list[PlatformStatus]:
    """Every native platform, and the browser platforms too unless `browser` is False."""
    targets = native_targets(list(NATIVE_PLATFORMS), list(ENGINES))
    statuses = []
    for platform in NATIVE_PLATFORMS:
        probes = [(t, a) for t, a in targets if t.hardware == platform]
        ready = [f"{t.engine}:{t.provider}" for t, a in probes if a.ok]
        name = f"{platform} (native)" if platform in WEB_HARDWARE else platform  # not the page's platform
        if ready:
            statuses.append(PlatformStatus(name, True, "runs on " + ", ".join(ready)))
        else:
            reasons = "; ".join(sorted({a.reason for _, a in probes}))
            statuses.append(PlatformStatus(name, False, reasons or "no engine serves it"))
    return statuses + (web_platforms() if browser else [])


def web_platforms() -> list[PlatformStatus]:
    """wasm, webgpu and webnn as a real page in the browser sees them (one launch, cached per process)."""
    from harness.web.driver import platform_verdicts

    return [PlatformStatus(*verdict) for verdict in platform_verdicts()]


def hardware_rows(browser: bool = True) -> list[dict]:
    """Rows for the store's hardware table: one per platform (browser platforms only if `browser`)."""
    gpus = machine_probe().gpu_names
    rows = []
    for status in detect_platforms(browser):
        device = ", ".join(gpus) if status.platform in ("cuda", "rocm") and gpus else status.device_name
        rows.append(
            {"platform": status.platform, "available": status.available, "reason": status.reason, "device_name": device}
        )
    return rows
