"""Harness overhead on native backends: harness p50 vs a bare loop's p50, same process, same inputs.

For bert-tiny (batch 1, seq 32) on ORT CPU and torch CPU, alternate rounds of the harness's
measure() (the real backend session, clock and stop rule) with rounds of a bare
`session.run` / `module(*tensors)` loop timed with perf_counter_ns, so machine noise hits both
alike. Prints p50 of each and the ratio (target <= 1.02).

    .venv/bin/python bench/native_overhead.py [--rounds 10] [--iterations 200]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from harness.core.records import Target
from harness.native import get_backend
from harness.native.base import LoadRequest
from harness.prepare.prepared import PrepareJob, prepare_model
from harness.prepare.specs import load_specs
from harness.run.measure import MeasureConfig, measure
from harness.run.memory import PeakRss


def bare_loop(call: Callable[[], object], iterations: int) -> list[float]:
    samples = []
    for _ in range(iterations):
        started = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def compare(name: str, session, feeds: dict[str, np.ndarray], bare_call, rounds: int, iterations: int) -> float:
    config = MeasureConfig(warmup=20, iterations=iterations, min_duration_s=0.0, max_iterations=iterations)
    rss = PeakRss()
    harness_samples: list[float] = []
    bare_samples: list[float] = []
    for _ in range(20):
        bare_call()
    for _ in range(rounds):
        harness_samples += measure(session, feeds, config, rss).samples_ms
        bare_samples += bare_loop(bare_call, iterations)
    harness_p50 = float(np.median(harness_samples))
    bare_p50 = float(np.median(bare_samples))
    ratio = harness_p50 / bare_p50
    print(
        f"{name:<22} harness p50 {harness_p50:.4f} ms | bare p50 {bare_p50:.4f} ms | ratio {ratio:.3f} "
        f"({len(harness_samples)} + {len(bare_samples)} samples)"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()

    spec = load_specs()["bert-tiny"]
    prepared = next(prepare_model(PrepareJob(spec, [(1, 32)])))
    feeds, _ = prepared.load_case((1, 32))
    print(f"bert-tiny b1 s32, load average {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}")

    ort_session = get_backend("onnxruntime").load(
        LoadRequest(spec, prepared.onnx_path, "fp32"), Target("cpu", "onnxruntime", "CPUExecutionProvider")
    )
    ort_feeds = ort_session.prepare(feeds)
    raw = ort_session.session
    ratios = [
        compare("onnxruntime CPU", ort_session, feeds, lambda: raw.run(None, ort_feeds), args.rounds, args.iterations)
    ]

    torch_session = get_backend("torch").load(LoadRequest(spec, None, "fp32"), Target("cpu", "torch", "cpu"))
    tensors = torch_session.prepare(feeds)
    module = torch_session.module

    def torch_call() -> object:
        with torch.inference_mode():
            return module(*tensors)

    ratios.append(compare("torch CPU", torch_session, feeds, torch_call, args.rounds, args.iterations))
    print(f"worst ratio {max(ratios):.3f} (target <= 1.02)")


if __name__ == "__main__":
    main()
