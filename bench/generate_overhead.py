"""Harness overhead of browser generation, and the browser ÷ native ratio users ask for.

For each model (prompt P, N new tokens, batch 1, the `-past` export), in one headless Chromium on the
wasm EP: alternate rounds of the harness's page job (web/page/generate.mjs: its warm-up, stop rule,
clocks, disposal) with rounds of a bare onnxruntime-web loop doing the same steps (prefill with an
empty past, then one run per token feeding the presents back, argmax), timed the same way, in the same
page after the harness's job (the same ORT-web runtime). Goal: harness ÷ bare <= 1.03 on TTFT and on
decode tokens/s. Then native ONNX Runtime on the CPU at one thread on the same file and prompt
(harness.prepare.greedy, the figures of harness.core.generation), for the ratio browser wasm ÷ native.

    .venv/bin/python bench/generate_overhead.py [--models llama-tiny,gpt2] [--prompt 128] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from harness.browser.run import EpSetting, WebRequest, page_job
from harness.core.generation import decode_steps, generation_figures
from harness.core.records import Case
from harness.prepare.greedy import greedy
from harness.prepare.prepared import PreparedModel, PrepareJob, prepare_model
from harness.prepare.specs import load_specs
from harness.web import driver
from harness.web.eps import EPS
from harness.web.flags import gpu_profile, launch_flags
from harness.web.server import PageServer

BARE_LOOP = """async ({bundle, base, job, generations}) => {
  if (!window.bare) {
    const ort = await import(base + bundle);
    ort.env.wasm.wasmPaths = base;
    ort.env.wasm.numThreads = job.threads;
    ort.env.wasm.proxy = false;
    const bytes = new Uint8Array(await (await fetch(job.model_url)).arrayBuffer());
    const session = await ort.InferenceSession.create(bytes, {executionProviders: ['wasm']});
    const inputs = {};
    for (const i of job.inputs) {
      inputs[i.name] = {data: new BigInt64Array(await (await fetch(i.url)).arrayBuffer()), dims: i.dims};
    }
    window.bare = {ort, session, inputs};
  }
  const {ort, session, inputs} = window.bare;
  const [logitsName, ...presents] = session.outputNames;
  const pasts = presents.map((p) => 'past' + p.slice('present'.length));
  const length = inputs.input_ids.dims[1];
  const once = async () => {
    let feeds = {
      input_ids: new ort.Tensor('int64', inputs.input_ids.data, inputs.input_ids.dims),
      attention_mask: new ort.Tensor('int64', inputs.attention_mask.data, inputs.attention_mask.dims),
      position_ids: new ort.Tensor('int64', BigInt64Array.from({length}, (_, i) => BigInt(i)), [1, length]),
    };
    for (const m of session.inputMetadata) {
      if (!m.name.startsWith('past')) continue;
      feeds[m.name] = new ort.Tensor('float32', new Float32Array(0), [1, m.shape[1], 0, m.shape[3]]);
    }
    const started = performance.now();
    let last = started, ttft = 0, total = length;
    const steps = [];
    for (let step = 0; step < job.new_tokens; step++) {
      const out = await session.run(feeds);
      const now = performance.now();
      if (step === 0) ttft = now - started; else steps.push(now - last);
      last = now;
      const logits = out[logitsName].data;
      let best = 0;
      for (let v = 1; v < logits.length; v++) if (logits[v] > logits[best]) best = v;
      for (const name of pasts) feeds[name].dispose();
      total++;
      feeds = {
        input_ids: new ort.Tensor('int64', BigInt64Array.of(BigInt(best)), [1, 1]),
        attention_mask: new ort.Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]),
        position_ids: new ort.Tensor('int64', BigInt64Array.of(BigInt(total - 1)), [1, 1]),
      };
      presents.forEach((name, i) => (feeds[pasts[i]] = out[name]));
    }
    for (const name of pasts) feeds[name].dispose();
    return {ttft, steps};
  };
  await once(); // untimed warm-up, as the harness page
  const runs = [];
  for (let g = 0; g < generations; g++) runs.push(await once());
  return runs;
}"""


def _figures(prompt: int, ttft: list[float], steps: list[list[float]]) -> dict[str, float | None]:
    return generation_figures(1, prompt, ttft, steps)


async def browser_rounds(prepared: PreparedModel, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    from playwright.async_api import async_playwright

    request = WebRequest(modes=["generate"], new_tokens=args.new_tokens, warmup=0, iterations=args.generations,
                         min_duration_s=0.0, max_iterations=args.generations, max_time_s=None)  # fmt: skip
    setting = EpSetting("wasm", 1)
    server = PageServer()
    await server.start()
    try:
        async with async_playwright() as playwright:
            profile = gpu_profile("off")
            source = driver.LocalBrowser(driver.resolve_browser("chromium"), launch_flags(["wasm"], profile), profile)
            session = driver.BrowserSession(playwright, source, server)
            await session.ensure_started()
            case = Case(1, args.prompt, "fp32", "generate", args.new_tokens)
            job = page_job(server, prepared, setting, case, request)
            # the bare loop runs in the harness's own page, after its job: the same ORT-web runtime, the same
            # foreground page (a second, hidden page of the browser runs slower and would flatter the harness)
            bare_args = {"bundle": EPS["wasm"].bundle, "base": server.base_url + "ort/", "job": job}
            harness, bare = [], []
            for _ in range(args.rounds):
                answer = await session.run_job(server.page_url, "bench", job, 900)
                if answer["status"] != "ok":
                    raise RuntimeError(f"harness page: {answer['status']}: {answer.get('error')}")
                made = answer["generation"]
                harness.append(_figures(args.prompt, made["ttft_samples_ms"], made["step_samples_ms"]))
                page = await session.page(server.page_url, "bench")
                runs = await page.evaluate(BARE_LOOP, bare_args | {"generations": args.generations})
                bare.append(_figures(args.prompt, [r["ttft"] for r in runs], [r["steps"] for r in runs]))
            await session.close()
    finally:
        await server.stop()
    return harness, bare


def native_one_thread(prepared: PreparedModel, args: argparse.Namespace) -> dict[str, float | None]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    assert prepared.onnx_past_path is not None
    session = ort.InferenceSession(str(prepared.onnx_past_path), options, providers=["CPUExecutionProvider"])
    feeds, _ = prepared.load_case((1, args.prompt))
    prompt = {name: feeds[name] for name in ("input_ids", "attention_mask")}
    greedy(session, prompt, args.new_tokens)  # warm-up
    ttft, steps = [], []
    for _ in range(args.rounds * args.generations):
        stamps: list[int] = []
        started = time.perf_counter_ns()
        greedy(session, prompt, args.new_tokens, lambda stamps=stamps: stamps.append(time.perf_counter_ns()))
        ttft.append((stamps[0] - started) / 1e6)
        steps.append(decode_steps(stamps))
    return _figures(args.prompt, ttft, steps)


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in rounds]))


def bench_model(name: str, args: argparse.Namespace) -> None:
    spec = load_specs()[name]
    prepared = next(prepare_model(PrepareJob(spec, [(1, args.prompt)], with_past=True)))
    if prepared.onnx_past_path is None:
        print(f"{name}: no export with past: {prepared.onnx_past_error}")
        return
    harness, bare = driver.run_sync(browser_rounds(prepared, args))
    # Rounds alternate: a per-round ratio compares runs seconds apart; its median resists load bursts.
    pairs = list(zip(harness, bare, strict=True))
    ttft_ratio = float(np.median([h["ttft_ms"] / b["ttft_ms"] for h, b in pairs]))
    tg_ratio = float(np.median([b["decode_tokens_per_s"] / h["decode_tokens_per_s"] for h, b in pairs]))
    print(
        f"{name} prompt {args.prompt}, {args.new_tokens} new tokens, wasm 1 thread: harness TTFT "
        f"{_median(harness, 'ttft_ms'):.2f} ms, tg {_median(harness, 'decode_tokens_per_s'):.1f} tokens/s | bare "
        f"TTFT {_median(bare, 'ttft_ms'):.2f} ms, tg {_median(bare, 'decode_tokens_per_s'):.1f} tokens/s | "
        f"harness/bare: TTFT {ttft_ratio:.3f}, tg time {tg_ratio:.3f} (goal <= 1.03; {args.rounds} rounds x "
        f"{args.generations} generations)"
    )
    native = native_one_thread(prepared, args)
    wasm_tg, native_tg = _median(harness, "decode_tokens_per_s"), native["decode_tokens_per_s"] or float("nan")
    print(
        f"{name} native ORT CPU 1 thread: TTFT {native['ttft_ms']:.2f} ms, pp {native['prefill_tokens_per_s']:.0f}, "
        f"tg {native_tg:.1f} tokens/s | wasm/native: TTFT {_median(harness, 'ttft_ms') / native['ttft_ms']:.2f}x, "
        f"tg tokens/s {wasm_tg / native_tg:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama-tiny,gpt2")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--generations", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name in args.models.split(","):
        bench_model(name, args)
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
