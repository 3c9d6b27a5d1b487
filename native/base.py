"""The one protocol every native backend implements: probe → load → run → memory.

The measuring loop (harness.run.measure) is written once against this protocol.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from harness.core.records import Target
from harness.prepare.specs import ModelSpec


class UnsupportedError(RuntimeError):
    """The backend cannot run this model/precision here; recorded as status `unsupported`."""


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str


@dataclass(frozen=True)
class LoadRequest:
    spec: ModelSpec
    onnx_path: Path | None
    precision: str  # requested
    example_feeds: dict[str, np.ndarray] | None = None  # one case's inputs, for placement checks
    onnx_past_path: Path | None = None  # the export with past key/values: load it to generate


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


class Backend(Protocol):
    engine: str

    def targets(self) -> list[Target]:
        """Every (hardware, provider) this engine can serve, available here or not."""

    def probe(self, target: Target) -> Availability: ...

    def load(self, request: LoadRequest, target: Target) -> Session: ...


class HostMemory:
    """Mixin for sessions whose memory is host RAM, measured by RSS in the worker."""

    def reset_device_peak(self) -> None:
        return None

    def device_memory_peak_mb(self) -> float | None:
        return None
