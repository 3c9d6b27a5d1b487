"""The one protocol every native backend implements: probe → load → run → memory, and the
capabilities the planner reads instead of knowing engines by name.

The measuring loop (harness.run.measure) is written once against this protocol.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from harness.core.profiles import Profile
from harness.core.records import Target
from harness.core.records import UnsupportedError as UnsupportedError  # re-exported: what every backend raises
from harness.prepare.specs import ModelSpec


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str


@dataclass(frozen=True)
class Capabilities:
    """What an engine can be asked to run. The planner, the workers and the suites read these; no module
    outside native/ names an engine. Precisions are not listed: whether one runs depends on the device
    and the model, so load() decides, and what it refuses is recorded as `unsupported` with its reason."""

    modes: tuple[str, ...] = ("inference",)  # of harness.core.records.MODES
    generate_needs_past_export: bool = False  # generate runs the ONNX export with past key/values
    needs_onnx: bool = True  # loads the exported ONNX file (False: builds its model from the spec itself)
    runs_onnx_files: bool = True  # applies to a model given as an .onnx file (--model-path x.onnx)
    worker_needs_torch: bool = False  # its worker imports torch anyway: fork it from the torch fork server
    reads_machine_load: bool = False  # its load takes LoadRequest.others_busy_cpus (ORT: whether its pool spins)
    runs_gguf: bool = False  # loads the GGUF the prepare worker writes of the weights (LoadRequest.gguf_path)
    # builds its own module of the weights (torch): its fp32 generations are checked against native ORT teacher-forced
    # on the fp32 export with past of the same weights, where the run made one
    checked_on_export: bool = False

    def plans(self, mode: str, has_past_export: bool) -> bool:
        """Whether a case of this mode is planned for a model (one with an export with past, or not)."""
        if mode not in self.modes:
            return False
        return has_past_export or mode != "generate" or not self.generate_needs_past_export


@dataclass(frozen=True)
class LoadRequest:
    spec: ModelSpec
    onnx_path: Path | None
    precision: str  # requested
    example_feeds: dict[str, np.ndarray] | None = None  # one case's inputs, for placement checks
    onnx_past_path: Path | None = None  # the export with past key/values: load it to generate
    threads: int | None = None  # intra-op threads (--native-threads); None: the engine's default, read back
    # CPUs the machine's other processes kept busy just before the load (others_busy_cpus), read before the load's
    # timer starts; None: the engine reads it itself where it needs it
    others_busy_cpus: float | None = None
    gguf_path: Path | None = None  # the GGUF of the weights at this precision (Capabilities.runs_gguf), where written
    gguf_error: str | None = None  # why there is none


class Clock:
    """Wall clock around a synchronous run(); device backends substitute device timers."""

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> float:
        return (time.perf_counter_ns() - self._t0) / 1e6


class Session(Protocol):
    precision: str  # the precision that actually runs
    facts: dict[str, Any]  # provenance: versions, device, provider that ran, fallbacks
    clock: Clock

    def prepare(self, feeds: dict[str, np.ndarray]) -> Any:
        """Convert inputs once (device copies, dtype) outside the timed region."""

    def run(self, prepared: Any) -> Any:
        """One inference; returns when the device has finished."""

    def to_numpy(self, outputs: Any) -> list[np.ndarray]: ...

    def reset_device_peak(self) -> None: ...

    def device_memory_peak_mb(self) -> float | None:
        """Device memory high-water mark since reset (None on CPU: RSS covers it)."""


class Profiling(Protocol):
    """What a session offers when it can say where its time goes (ONNX Runtime, OpenVINO, torch)."""

    def profile(self, prepared: Any, iterations: int) -> Profile:
        """`iterations` runs under the engine's profiler, per operator. Where profiling is a load-time
        option the runs use a profiled twin, so the timed session never profiles."""


class Backend(Protocol):
    engine: str
    capabilities: Capabilities

    def targets(self) -> list[Target]:
        """Every (hardware, provider) this engine can serve, available here or not."""

    def probe(self, target: Target) -> Availability: ...

    def load(self, request: LoadRequest, target: Target) -> Session: ...

    def device(self, target: Target) -> str | None:
        """The accelerator a target computes on, or None for the host's CPU cores: targets on one device
        share its compute (a suite runs them one after another), different devices run side by side."""


class DeviceByHardware:
    """Mixin for backends whose targets compute on the device their hardware names (cpu: the host)."""

    def device(self, target: Target) -> str | None:
        return None if target.hardware == "cpu" else target.hardware


class HostMemory:
    """Mixin for sessions whose memory is host RAM, measured by RSS in the worker."""

    def reset_device_peak(self) -> None:
        return None

    def device_memory_peak_mb(self) -> float | None:
        return None


def physical_cores() -> int:
    """The host's physical cores (psutil), what ONNX Runtime's default intra-op pool sizes itself to."""
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


LOAD_WINDOW_S = 0.2  # how long the machine's load is read before a session is made: 20 scheduler ticks per CPU


def others_busy_cpus(window_s: float = LOAD_WINDOW_S) -> float:
    """CPUs' worth of work the machine's other processes did over `window_s` while this one slept
    (psutil.cpu_percent of the whole machine; nothing of this process runs meanwhile)."""
    import psutil

    return psutil.cpu_percent(interval=window_s) / 100 * (psutil.cpu_count() or 1)


def thread_facts(threads: int | None, source: str, spinning: bool | None, spinning_source: str) -> dict[str, Any]:
    """What every native row says of its threads: the intra-op count that ran (read back from the engine
    where it can be, else the engine's documented default, and `source` says which) and whether idle
    workers spin (None: the engine has no such setting, `spinning_source` says why)."""
    return {"native_threads": threads, "native_threads_source": source,
            "spinning": spinning, "spinning_source": spinning_source}  # fmt: skip
