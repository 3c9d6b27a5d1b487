"""The measuring loop, written once for every native backend.

first run (timed) → warmup → timed iterations until both the iteration count and the minimum
duration are met (capped by max_iterations). Only session.run sits inside the timed region.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from harness.memory import PeakRss, nvml_used_mb
from harness.native.base import Session


@dataclass(frozen=True)
class MeasureConfig:
    warmup: int = 5
    iterations: int = 20
    min_duration_s: float = 0.5
    max_iterations: int = 10_000


@dataclass
class Measurement:
    first_run_ms: float
    samples_ms: list[float]
    outputs: list[np.ndarray]  # from the first run, for the parity check
    memory_peak_mb: float
    device_memory_peak_mb: float | None
    nvml_used_mb: float | None  # device-wide, after the loop, on NVIDIA GPUs
    load_avg_1m: float
    cpu_percent: float  # whole machine, during warmup + timed loop
    process_cpu_percent: float


def measure(session: Session, feeds: dict[str, np.ndarray], config: MeasureConfig, rss: PeakRss) -> Measurement:
    prepared = session.prepare(feeds)
    process = psutil.Process()
    psutil.cpu_percent(interval=None)  # start both CPU-use windows here
    process.cpu_percent(interval=None)
    rss.reset()
    session.reset_device_peak()
    clock = session.clock

    clock.start()
    first_outputs: Any = session.run(prepared)
    first_run_ms = clock.stop()
    outputs = session.to_numpy(first_outputs)

    for _ in range(config.warmup):
        session.run(prepared)

    samples: list[float] = []
    deadline = time.perf_counter() + config.min_duration_s
    while len(samples) < config.max_iterations and (len(samples) < config.iterations or time.perf_counter() < deadline):
        clock.start()
        session.run(prepared)
        samples.append(clock.stop())

    return Measurement(
        first_run_ms=first_run_ms,
        samples_ms=samples,
        outputs=outputs,
        memory_peak_mb=rss.peak_mb(),
        device_memory_peak_mb=session.device_memory_peak_mb(),
        nvml_used_mb=nvml_used_mb() if session.facts.get("uses_nvidia_gpu") else None,
        load_avg_1m=os.getloadavg()[0],
        cpu_percent=psutil.cpu_percent(interval=None),
        process_cpu_percent=process.cpu_percent(interval=None),
    )
