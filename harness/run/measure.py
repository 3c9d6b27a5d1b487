"""The measuring loops, written once for every native backend.

first run (timed) → warmup → timed iterations until both the iteration count and the minimum
duration are met (capped by max_iterations). A time budget (max_time_s) starts with the first run
and caps the warmup and the timed loop: once it is spent the loop stops, but never before
min_iterations samples (web/page/runner.mjs keeps the same rule). Three modes share that stop rule
and the observation of the machine around it (CPU use, load average, RSS peak, energy):
  inference  one session.run per iteration; only run() sits inside the timed region
  generate   one generate() of exactly new_tokens tokens per iteration, with a timestamp per
             token (time to first token, time per output token)
  training   one forward + backward + optimizer step per iteration
With profiling asked for, an inference measurement is followed by a few profiled iterations
(Session.profile): after the timed loop and outside the window the machine is observed in, so the
profiler's overhead touches no sample and no CPU, memory or energy figure.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from harness.core.generation import decode_steps, mean_steps
from harness.core.profiles import Profile
from harness.core.records import UnsupportedError
from harness.native.base import Session
from harness.run.energy import EnergyMeter
from harness.run.memory import PeakRss, nvml_used_mb


@dataclass(frozen=True)
class MeasureConfig:
    warmup: int = 5
    iterations: int = 20
    min_duration_s: float = 0.5
    max_iterations: int = 10_000
    min_iterations: int = 3  # the budget never stops the timed loop below this many samples
    max_time_s: float | None = None  # warmup + timed loop budget; None: no budget
    profile_iterations: int = 0  # inference: profiled iterations after the timed loop (0: none)


class Budget:
    """The time budget of one case: it starts when created (before the first run) and records whether
    it cut the warmup or the timed loop short."""

    def __init__(self, config: MeasureConfig) -> None:
        self.config = config
        self.max_time_s = config.max_time_s
        self.deadline = math.inf if config.max_time_s is None else time.perf_counter() + config.max_time_s
        self.stopped = False
        self.warmup_run = 0

    def warm_up(self, run: Callable[[], object]) -> None:
        """Up to config.warmup untimed runs, as many as the budget allows."""
        while self.warmup_run < self.config.warmup:
            if time.perf_counter() >= self.deadline:
                self.stopped = True
                return
            run()
            self.warmup_run += 1

    def timed_iterations(self, step: Callable[[], float]) -> list[float]:
        """Call step() (which returns its own duration in ms) until the stop rule is met."""
        config = self.config
        samples: list[float] = []
        wanted = time.perf_counter() + config.min_duration_s
        floor = min(config.min_iterations, config.iterations)
        while len(samples) < config.max_iterations:
            now = time.perf_counter()
            if len(samples) >= config.iterations and now >= wanted:
                break
            if len(samples) >= floor and now >= self.deadline:
                self.stopped = True
                break
            samples.append(step())
        return samples

    @property
    def facts(self) -> dict[str, Any]:
        """What a row records about the budget (the page reports the same three facts)."""
        return {"max_time_s": self.max_time_s, "warmup_run": self.warmup_run, "budget_stopped": self.stopped}


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
    budget: dict[str, Any] = field(default_factory=dict)  # Budget.facts
    ttft_samples_ms: list[float] = field(default_factory=list)
    tpot_samples_ms: list[float] = field(default_factory=list)
    step_samples_ms: list[list[float]] = field(default_factory=list)  # generate: each generation's decode steps
    generated_tokens: list[list[int]] | None = None  # generate: the first generation's token ids
    encoder_samples_ms: list[float] = field(default_factory=list)  # generate, encoder–decoders: the encoder's run
    profile: Profile | None = None  # per-operator times, taken after the timed loop
    profile_error: str | None = None  # why a profile asked for is missing


Body = Callable[[], tuple[float, list[float], Any, Budget]]


def _observe(session: Session, rss: PeakRss, body: Body) -> Measurement:
    """Run body() = (first_run_ms, samples, outputs, budget) while observing the machine around it."""
    process = psutil.Process()
    psutil.cpu_percent(interval=None)  # start both CPU-use windows here
    process.cpu_percent(interval=None)
    rss.reset()
    session.reset_device_peak()
    children = getattr(session, "children_memory", None)  # an engine's own child process (llama.cpp's node runner)
    if children is not None:
        children.reset()
    meter = EnergyMeter(0 if session.facts.get("uses_nvidia_gpu") else None)
    meter.start()
    first_run_ms, samples, outputs, budget = body()
    energy = meter.stop()
    peak_mb = rss.peak_mb()
    if children is not None:  # the engine's memory is in its child too: both peaks, summed (its facts say so)
        peak_mb += children.peak_mb()
    return Measurement(
        first_run_ms=first_run_ms,
        samples_ms=samples,
        outputs=outputs,
        memory_peak_mb=peak_mb,
        device_memory_peak_mb=session.device_memory_peak_mb(),
        nvml_used_mb=nvml_used_mb() if session.facts.get("uses_nvidia_gpu") else None,
        load_avg_1m=os.getloadavg()[0],
        cpu_percent=psutil.cpu_percent(interval=None),
        process_cpu_percent=process.cpu_percent(interval=None),
        energy_j=energy.joules,
        energy_source=energy.source,
        budget=budget.facts,
    )


def measure(session: Session, feeds: dict[str, np.ndarray], config: MeasureConfig, rss: PeakRss) -> Measurement:
    prepared = session.prepare(feeds)
    clock = session.clock

    def step() -> float:
        clock.start()
        session.run(prepared)
        return clock.stop()

    def body() -> tuple[float, list[float], Any, Budget]:
        budget = Budget(config)
        clock.start()
        first_outputs = session.run(prepared)
        first_run_ms = clock.stop()
        outputs = session.to_numpy(first_outputs)
        budget.warm_up(lambda: session.run(prepared))
        return first_run_ms, budget.timed_iterations(step), outputs, budget

    measured = _observe(session, rss, body)
    if config.profile_iterations > 0:  # after the loop and its observation: nothing profiled is timed
        measured.profile, measured.profile_error = profile_after(session, prepared, config.profile_iterations)
    return measured


def profile_after(session: Session, prepared: Any, iterations: int) -> tuple[Profile | None, str | None]:
    """The session's per-operator profile of `iterations` runs, or why there is none (a failing
    profiler costs the row its profile, never its measurement)."""
    if not hasattr(session, "profile"):
        return None, f"{type(session).__name__} has no profiler"
    try:
        return session.profile(prepared, iterations), None
    except Exception as exc:  # the engine's own words are the reason
        return None, f"profiling failed: {type(exc).__name__}: {exc}"


def measure_generation(
    session: Any,
    feeds: dict[str, np.ndarray],
    config: MeasureConfig,
    new_tokens: int,
    rss: PeakRss,
    eos: tuple[int, ...] = (),
    depth: int = 0,
) -> Measurement:
    """Each iteration generates exactly new_tokens tokens (with `eos`, the ids --stop-at-eos stops at: up to
    new_tokens, ending when every row made one); session.generate calls stamp() as each token's logits are
    ready (device-synchronised), giving TTFT and every decode step from the same run (harness.core.generation
    defines the figures, over the steps made). The first generation's token ids are kept. At a depth, the
    session fills its KV cache to that many tokens first and calls begin(): the clock starts there."""
    if depth and not getattr(session, "fills_cache", False):
        raise UnsupportedError(f"--depths {depth}: this engine's generation starts from an empty KV cache here "
                               "(ONNX Runtime's and torch's greedy loops and the page fill one)")  # fmt: skip
    prepared = session.prepare(feeds)
    ttft: list[float] = []
    steps: list[list[float]] = []
    tokens: list[list[int]] | None = None
    encoded: list[float] = []

    def one_generation(record: bool) -> float:
        stamps: list[int] = []
        started = [time.perf_counter_ns()]

        def begin() -> None:  # the cache is filled: what is timed starts here
            started[0] = time.perf_counter_ns()

        stamp = lambda: stamps.append(time.perf_counter_ns())  # noqa: E731
        if getattr(session, "fills_cache", False):  # every depth, 0 too, timed from the same point
            produced = session.generate(prepared, new_tokens, stamp, eos, depth=depth, begin=begin)
        else:
            produced = session.generate(prepared, new_tokens, stamp, eos)
        total_ms = (time.perf_counter_ns() - started[0]) / 1e6
        fixed = not eos or not 1 <= produced <= new_tokens  # only an EOS stop may end a generation early
        if (fixed and produced != new_tokens) or len(stamps) != produced:
            raise RuntimeError(f"generate produced {produced} tokens ({len(stamps)} steps), asked {new_tokens}")
        if record:
            ttft.append((stamps[0] - started[0]) / 1e6)
            steps.append(decode_steps(stamps))
            if (encoder_ms := getattr(session, "encoder_ms", None)) is not None:  # an encoder–decoder's phase
                encoded.append(encoder_ms)
        return total_ms

    def body() -> tuple[float, list[float], Any, Budget]:
        nonlocal tokens
        budget = Budget(config)
        first_run_ms = one_generation(record=False)
        generated = getattr(session, "generated", None)  # the engine's token ids, where it keeps them
        tokens = None if generated is None else np.asarray(generated).tolist()
        budget.warm_up(lambda: one_generation(record=False))
        return first_run_ms, budget.timed_iterations(lambda: one_generation(record=True)), [], budget

    measured = _observe(session, rss, body)
    measured.ttft_samples_ms, measured.step_samples_ms = ttft, steps
    measured.tpot_samples_ms, measured.generated_tokens = mean_steps(steps), tokens
    measured.encoder_samples_ms = encoded
    return measured


def measure_training(session: Any, feeds: dict[str, np.ndarray], config: MeasureConfig, rss: PeakRss) -> Measurement:
    """Each iteration is one optimizer step: forward, backward, update."""
    prepared = session.prepare_training(feeds)
    clock = session.clock

    def step() -> float:
        clock.start()
        session.train_step(prepared)
        return clock.stop()

    def body() -> tuple[float, list[float], Any, Budget]:
        budget = Budget(config)
        first_run_ms = step()
        budget.warm_up(lambda: session.train_step(prepared))
        return first_run_ms, budget.timed_iterations(step), [], budget

    return _observe(session, rss, body)
