"""Harness overhead in the browser: the page's p50 vs a bare `await session.run(feeds)` loop's p50.

For bert-tiny (batch 1, seq 32) on the wasm EP, in one headless Chromium: alternate rounds of the
harness's page job (runner.mjs: its stop rule, per-iteration performance.now()) with rounds of a
bare loop in a second page of the same browser that imports the same ORT-web bundle, builds the
same feeds from the same served files and times each `await session.run(feeds)`. Then native ORT
CPU on the same ONNX file and inputs (for the wasm/native ratio), and the wall time of
`accelharness web --model bert-tiny --hardware wasm` end to end (browser start, session, measuring).

    .venv/bin/python bench/web_overhead.py [--rounds 5] [--iterations 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.browser.run import EpSetting, WebRequest, page_job
from harness.core.records import Case, Target
from harness.native import get_backend
from harness.native.base import LoadRequest
from harness.prepare.prepared import PreparedModel, PrepareJob, prepare_model
from harness.prepare.specs import load_specs
from harness.run.measure import MeasureConfig, measure
from harness.run.memory import PeakRss
from harness.store import open_store
from harness.web import driver
from harness.web.eps import EPS
from harness.web.flags import gpu_profile, launch_flags
from harness.web.server import PageServer

BARE_LOOP = """async ({bundle, base, job, iterations, warmup}) => {
  if (!window.bare) {
    const ort = await import(base + bundle);
    ort.env.wasm.wasmPaths = base;
    ort.env.wasm.numThreads = job.threads;
    ort.env.wasm.proxy = false;
    const bytes = new Uint8Array(await (await fetch(job.model_url)).arrayBuffer());
    const session = await ort.InferenceSession.create(bytes, {executionProviders: ['wasm']});
    const typed = {int64: BigInt64Array, int32: Int32Array, float32: Float32Array};
    const feeds = {};
    for (const i of job.inputs) {
      const data = new typed[i.dtype](await (await fetch(i.url)).arrayBuffer());
      feeds[i.name] = new ort.Tensor(i.dtype, data, i.dims);
    }
    for (let k = 0; k < warmup; k++) await session.run(feeds);
    window.bare = {session, feeds};
  }
  const {session, feeds} = window.bare;
  const samples = [];
  for (let k = 0; k < iterations; k++) {
    const t0 = performance.now();
    await session.run(feeds);
    samples.push(performance.now() - t0);
  }
  return samples;
}"""


async def browser_rounds(
    prepared: PreparedModel, args: argparse.Namespace
) -> tuple[list[list[float]], list[list[float]]]:
    from playwright.async_api import async_playwright

    request = WebRequest(warmup=20, iterations=args.iterations, min_duration_s=0.0, max_iterations=args.iterations)
    setting = EpSetting("wasm", args.threads)
    server = PageServer()
    await server.start()
    try:
        async with async_playwright() as playwright:
            profile = gpu_profile("off")
            source = driver.LocalBrowser(driver.resolve_browser("chromium"), launch_flags(["wasm"], profile), profile)
            session = driver.BrowserSession(playwright, source, server)
            await session.ensure_started()
            print(f"{source.choice.binary} {session.version}, ORT-web bundle {EPS['wasm'].bundle}")
            job = page_job(server, prepared, setting, Case(1, 32, "fp32"), request)
            bare_page = await session.context.new_page()
            await bare_page.goto(server.page_url)  # same origin: cross-origin isolated like the harness page
            bare_args = {"bundle": EPS["wasm"].bundle, "base": server.base_url + "ort/", "job": job}
            harness_rounds: list[list[float]] = []
            bare_rounds: list[list[float]] = []
            for _ in range(args.rounds):
                answer = await session.run_job(server.page_url, "bench", job, 300)
                if answer["status"] != "ok":
                    raise RuntimeError(f"harness page: {answer['status']}: {answer.get('error')}")
                harness_rounds.append(answer["samples_ms"])
                bare_args |= {"iterations": args.iterations, "warmup": 20}
                bare_rounds.append(await bare_page.evaluate(BARE_LOOP, bare_args))
            await session.close()
    finally:
        await server.stop()
    return harness_rounds, bare_rounds


def native_p50(prepared: PreparedModel, feeds: dict[str, np.ndarray], args: argparse.Namespace) -> float:
    session = get_backend("onnxruntime").load(
        LoadRequest(prepared.spec, prepared.onnx_path, "fp32"), Target("cpu", "onnxruntime", "CPUExecutionProvider")
    )
    config = MeasureConfig(warmup=20, iterations=args.iterations, min_duration_s=0.0, max_iterations=args.iterations)
    samples: list[float] = []
    for _ in range(args.rounds):
        samples += measure(session, feeds, config, PeakRss()).samples_ms
    return float(np.median(samples))


def end_to_end(threads: int) -> dict[str, Any]:
    """Wall time of the CLI run, and where it went according to the row it stored."""
    with tempfile.TemporaryDirectory() as directory:
        db = Path(directory) / "bench.duckdb"
        cli = str(Path(sys.executable).parent / "accelharness")
        command = [cli, "web", "--model", "bert-tiny", "--hardware", "wasm", "--threads", str(threads)]
        started = time.perf_counter()
        subprocess.run([*command, "--db", str(db), "--output-dir", directory], check=True, capture_output=True)
        wall_s = time.perf_counter() - started
        with open_store(db, read_only=True) as store:
            row = store.results(store.resolve_run("latest"))[0]
            samples = store.samples(row["result_id"])
    details = json.loads(row["details"])
    return {
        "wall_s": wall_s,
        "status": row["status"],
        "runtime_init_ms": details.get("runtime_init_ms"),
        "load_ms": row["load_ms"],
        "first_run_ms": row["first_run_ms"],
        "timed_ms": sum(samples),
        "iterations": len(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    prepared = next(prepare_model(PrepareJob(load_specs()["bert-tiny"], [(1, 32)])))
    feeds, _ = prepared.load_case((1, 32))
    print(f"bert-tiny b1 s32, wasm threads {args.threads}, load average {os.getloadavg()[0]:.2f}")

    harness_rounds, bare_rounds = driver.run_sync(browser_rounds(prepared, args))
    harness_p50 = float(np.median(np.concatenate(harness_rounds)))
    bare_p50 = float(np.median(np.concatenate(bare_rounds)))
    # Rounds alternate, so a per-round ratio compares runs seconds apart; its median resists load bursts.
    round_ratio = float(
        np.median([np.median(h) / np.median(b) for h, b in zip(harness_rounds, bare_rounds, strict=True)])
    )
    print(
        f"in-page harness p50 {harness_p50:.4f} ms | bare loop p50 {bare_p50:.4f} ms | "
        f"ratio {harness_p50 / bare_p50:.3f} | median per-round ratio {round_ratio:.3f} "
        f"(target <= 1.02; {args.rounds} x {args.iterations} samples each)"
    )
    native = native_p50(prepared, feeds, args)
    print(f"native ORT CPU p50 {native:.4f} ms | wasm/native {harness_p50 / native:.2f}x")
    e2e = end_to_end(args.threads)
    print(
        f"accelharness web --model bert-tiny --hardware wasm: {e2e['wall_s']:.1f} s wall ({e2e['status']}; "
        f"runtime start {e2e['runtime_init_ms']:.0f} ms, session {e2e['load_ms']:.0f} ms, first run "
        f"{e2e['first_run_ms']:.0f} ms, {e2e['iterations']} timed runs {e2e['timed_ms']:.0f} ms)"
    )
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
