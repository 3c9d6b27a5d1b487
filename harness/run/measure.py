"""The measuring loops, written once for every native backend.

first run (timed) → warmup → timed iterations until both the iteration count and the minimum
duration are met (capped by max_iterations). Three modes share that stop rule and the
observation of the machine around it (CPU use, load average, RSS peak, energy):
  inference  one session.run per iteration; only run() sits inside the timed region
  generate   one generate() of exactly new_tokens tokens per iteration, with a timestamp per
             token (time to first token, time per output token)
  training   one forward + backward + optimizer step per iteration
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from harness.native.base import Session
from harness.run.energy import EnergyMeter
from harness.run.memory import PeakRss, nvml_used_mb


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
    outputs: list[np.ndarray]  # from the first run, for the parity check (inference only)
    memory_peak_mb: float
    device_memory_peak_mb: float | None
    nvml_used_mb: float | None  # device-wide, after the loop, on NVIDIA GPUs
    load_avg_1m: float
    cpu_percent: float  # whole machine, during warmup + timed loop
    process_cpu_percent: float
    energy_j: float | None
    energy_source: str
    ttft_samples_ms: list[float] = field(default_factory=list)
    tpot_samples_ms: list[float] = field(default_factory=list)


def timed_iterations(step: Callable[[], float], config: MeasureConfig) -> list[float]:
    """Call step() (which returns its own duration in ms) until the stop rule is met."""
    samples: list[float] = []
    deadline = time.perf_counter() + config.min_duration_s
    while len(samples) < config.max_iterations and (len(samples) < config.iterations or time.perf_counter() < deadline):
        samples.append(step())
    return samples


def _observe(session: Session, rss: PeakRss, body: Callable[[], tuple[float, list[float], Any]]) -> Measurement:
    """Run body() = (first_run_ms, samples, outputs) while observing the machine around it."""
    process = psutil.Process()
    psutil.cpu_percent(interval=None)  # start both CPU-use windows here
    process.cpu_percent(interval=None)
    rss.reset()
    session.reset_device_peak()
    meter = EnergyMeter(0 if session.facts.get("uses_nvidia_gpu") else None)
    meter.start()
    first_run_ms, samples, outputs = body()
    energy = meter.stop()
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
        energy_j=energy.joules,
        energy_source=energy.source,
    )


def measure(session: Session, feeds: dict[str, np.ndarray], config: MeasureConfig, rss: PeakRss) -> Measurement:
    prepared = session.prepare(feeds)
    clock = session.clock

    def step() -> float:
        clock.start()
        session.run(prepared)
        return clock.stop()

    def body() -> tuple[float, list[float], Any]:
        clock.start()
        first_outputs = session.run(prepared)
        first_run_ms = clock.stop()
        outputs = session.to_numpy(first_outputs)
        for _ in range(config.warmup):
            session.run(prepared)
        return first_run_ms, timed_iterations(step, config), outputs

    return _observe(session, rss, body)


def measure_generation(
    session: Any, feeds: dict[str, np.ndarray], config: MeasureConfig, new_tokens: int, rss: PeakRss
) -> Measurement:
    """Each iteration generates exactly new_tokens tokens; session.generate calls stamp() as each
    token's logits are ready (device-synchronised), giving TTFT and TPOT from the same run."""
    prepared = session.prepare(feeds)
    ttft: list[float] = []
    tpot: list[float] = []

    def one_generation(record: bool) -> float:
        stamps: list[int] = []
        started = time.perf_counter_ns()
        produced = session.generate(prepared, new_tokens, lambda: stamps.append(time.perf_counter_ns()))
        total_ms = (time.perf_counter_ns() - started) / 1e6
        if produced != new_tokens or len(stamps) != new_tokens:
            raise RuntimeError(f"generate produced {produced} tokens ({len(stamps)} steps), asked {new_tokens}")
        if record:
            ttft.append((stamps[0] - started) / 1e6)
            if new_tokens > 1:
                tpot.append((stamps[-1] - stamps[0]) / 1e6 / (new_tokens - 1))
        return total_ms

    def body() -> tuple[float, list[float], Any]:
        first_run_ms = one_generation(record=False)
        for _ in range(config.warmup):
            one_generation(record=False)
        return first_run_ms, timed_iterations(lambda: one_generation(record=True), config), []

    measured = _observe(session, rss, body)
    measured.ttft_samples_ms, measured.tpot_samples_ms = ttft, tpot
    return measured


def measure_training(session: Any, feeds: dict[str, np.ndarray], config: MeasureConfig, rss: PeakRss) -> Measurement:
    """Each iteration is one optimizer step: forward, backward, update."""
    prepared = session.prepare_training(feeds)
    clock = session.clock

    def step() -> float:
        clock.start()
        session.train_step(prepared)
        return clock.stop()

    def body() -> tuple[float, list[float], Any]:
        first_run_ms = step()
        for _ in range(config.warmup):
            session.train_step(prepared)
        return first_run_ms, timed_iterations(step, config), []

    return _observe(session, rss, body)
