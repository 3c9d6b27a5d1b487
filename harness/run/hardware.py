"""Which platforms this machine can run, and why not where it cannot.

A native platform is available when at least one engine target on it probes available. The
browser platforms (wasm, webgpu, webnn) are decided by a probe page in headless Chromium
(harness.web.driver.platform_verdicts): WebAssembly, the WebGPU adapter, a WebNN MLContext. A run
that drives no browser records the native platforms only: launching Chromium to say what a page
could do would cost a native run more time (1.5 s) than many of its measurements.

The native probes run once per engine and process, in a worker (harness.run.isolation), and only for
the engines asked for: a run probes its own engines while it is planned, and its hardware rows are the
platforms those engines serve, as they find them (a platform none of them serves gets no row: not
probed is not unavailable; a web run's rows are the browser platforms only). Torch's probes import
torch and transformers (1.6 s): they fork from the server that has them imported for the run's own
torch workers, while a run without torch probes in a spawned worker and starts no fork server. A
probe that crashes (a broken driver) makes every target it would have probed unavailable, saying so,
instead of taking the CLI down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.core.records import Target
from harness.native import ENGINES, capabilities, get_backend
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
GPU_PLATFORMS = ("cuda", "rocm")  # the platforms whose devices torch names


@dataclass(frozen=True)
class MachineProbe:
    targets: Probes  # the engines probed, each with its targets
    gpu_names: list[str] | None  # the CUDA/ROCm devices torch sees; None: not asked (nothing needed torch)
    # engine → the devices its own discovery reports (ORT's get_ep_devices, plugin EPs registered)
    discovered: dict[str, list[dict]] = field(default_factory=dict)


def _gpu_names() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def _probe_needs_torch(engines: tuple[str, ...]) -> bool:
    """Whether probing these engines imports torch anyway: then the probe forks from the torch fork
    server, whose start the run's own torch workers then share."""
    return any(capabilities(engine).worker_needs_torch for engine in engines)


def probe_machine(engines: tuple[str, ...]) -> Iterator[MachineProbe]:
    """Worker entry point: every target of each engine with its probe (and the devices the engine's own
    discovery reports), and the GPUs torch sees where torch is probed or a CUDA/ROCm target is available (the
    device names a run's hardware class reads)."""
    targets, discovered = {}, {}
    for engine in engines:
        backend = get_backend(engine)
        targets[engine] = [(target, backend.probe(target)) for target in backend.targets()]
        if hasattr(backend, "discovered_devices"):
            discovered[engine] = backend.discovered_devices()
    gpu_available = any(t.hardware in GPU_PLATFORMS and a.ok for probes in targets.values() for t, a in probes)
    yield MachineProbe(targets, _gpu_names() if gpu_available or _probe_needs_torch(engines) else None, discovered)


_probed: dict[str, list[tuple[Target, Availability]]] = {}  # engine → its probed targets, in this process
_discovered: dict[str, list[dict]] = {}  # engine → the devices its own discovery reported, where it has one
_gpu_names_found: list[list[str]] = []  # the GPU names, once a probe asked torch for them
_PROBE_LOCK = threading.Lock()  # device-group threads plan concurrently: each engine is probed once


def _probe(engines: tuple[str, ...]) -> None:
    """Probe the engines not yet probed in this process, in one worker; where the worker fails, each of
    their targets is unavailable with the reason."""
    from harness.run.isolation import run_isolated

    with _PROBE_LOCK:
        missing = tuple(e for e in engines if e not in _probed)
        if missing:
            _probe_in_worker(missing, run_isolated)


def _probe_in_worker(missing: tuple[str, ...], run_isolated: Any) -> None:
    found: list[MachineProbe] = []
    uses_torch = _probe_needs_torch(missing)
    outcome = run_isolated(probe_machine, missing, PROBE_TIMEOUT_S, found.append, uses_torch=uses_torch)
    if found:
        _probed.update(found[0].targets)
        _discovered.update(found[0].discovered)
        if found[0].gpu_names is not None and not _gpu_names_found:
            _gpu_names_found.append(found[0].gpu_names)
        return
    failed = Availability(False, f"the hardware probe failed ({outcome.status}): {outcome.message}")
    _probed.update({e: [(t, failed) for t in get_backend(e).targets()] for e in missing})


def machine_probe(engines: tuple[str, ...] = ENGINES) -> MachineProbe:
    """The engines' targets, each probed once per process in a worker, and the GPU names if known.
    Only the engines asked for are probed: a run without torch starts no torch fork server."""
    _probe(engines)
    gpus = _gpu_names_found[0] if _gpu_names_found else None
    discovered = {e: _discovered[e] for e in engines if e in _discovered}  # `hardware` lists them
    return MachineProbe({e: _probed[e] for e in engines}, gpus, discovered)


def native_targets(hardware: list[str], engines: list[str]) -> list[tuple[Target, Availability]]:
    """Every target of the given hardware served by the given engines, with its probe."""
    probed = machine_probe(tuple(engines)).targets
    return [(target, found) for engine in engines for target, found in probed[engine] if target.hardware in hardware]


def _platform_status(platform: str, probes: list[tuple[Target, Availability]]) -> PlatformStatus:
    ready = [f"{t.engine}:{t.provider}" for t, a in probes if a.ok]
    name = f"{platform} (native)" if platform in WEB_HARDWARE else platform  # not the page's platform
    if ready:
        return PlatformStatus(name, True, "runs on " + ", ".join(ready))
    reasons = "; ".join(sorted({a.reason for _, a in probes}))
    return PlatformStatus(name, False, reasons or "no engine serves it")


def probed_platforms(engines: tuple[str, ...], every: bool = False) -> list[PlatformStatus]:
    """The native platforms these engines serve, each as their probes find it: available where one of
    them runs it, else unavailable with their reasons. A platform none of them serves is left out (not
    probed is not unavailable), unless `every` (then it is "no engine serves it")."""
    targets = machine_probe(engines).targets
    statuses = []
    for platform in NATIVE_PLATFORMS:
        probes = [(t, a) for e in engines for t, a in targets[e] if t.hardware == platform]
        if probes or every:
            statuses.append(_platform_status(platform, probes))
    return statuses


def detect_platforms(browser: bool = True) -> list[PlatformStatus]:
    """Every native platform (every engine probed), and the browser platforms too unless `browser` is False."""
    return probed_platforms(ENGINES, every=True) + (web_platforms() if browser else [])


def web_platforms() -> list[PlatformStatus]:
    """wasm, webgpu and webnn as a real page in the browser sees them (one launch, cached per process)."""
    from harness.web.driver import platform_verdicts

    return [PlatformStatus(*verdict) for verdict in platform_verdicts()]


def hardware_rows(engines: tuple[str, ...] | None = None) -> list[dict]:
    """Rows for the store's hardware table: one per native platform the engines serve (`engines`; None:
    the engines this process has probed, which a run's planning did for its own engines), as they find
    it. A GPU platform's device is torch's name for it, where a probe asked torch (else NULL). (A browser
    platform's row comes from the browser that ran it: harness.browser.run.)"""
    engines = tuple(e for e in ENGINES if e in _probed) if engines is None else engines
    gpus = machine_probe(engines).gpu_names
    rows = []
    for status in probed_platforms(engines):
        device = ", ".join(gpus) if status.platform in GPU_PLATFORMS and gpus else status.device_name
        rows.append(platform_row(status, device))
    return rows


def platform_row(status: PlatformStatus, device: str | None = None) -> dict[str, Any]:
    """A hardware-table row of a platform's status (`device`: a name found elsewhere, else the status's own)."""
    return {"platform": status.platform, "available": status.available, "reason": status.reason,
            "device_name": device or status.device_name}  # fmt: skip
