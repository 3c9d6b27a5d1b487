"""Our native generation loop against onnxruntime-genai's own, on one real int4 model (not a test).

SmolLM2-135M-Instruct's real weights as an onnxruntime-genai int4 folder (bench/peer_folders.py builds it
offline and caches it). In interleaved rounds, on the same file, prompt and thread count:

  ours        harness.prepare.greedy's loop on an ORT session made by native/onnxruntime_backend.py
              (session_options: --native-threads, spinning by its rule; a GroupQueryAttention graph's KV cache in
              one shared buffer), as `--engines onnxruntime` runs it
  ours-spin   the same loop with spinning forced on (ORT's default), to show what the rule changes
  genai       onnxruntime-genai's own generator loop (og.Generator, greedy, min = max length)
  genai-row   our `onnxruntime-genai` engine (native/onnxruntime_genai_backend.py's GenaiGenerator)

each quiet and with one busy core beside it (a `python -c "while True: pass"` process). Prints each
variant's median TTFT and decode tokens/s and the ratios ours ÷ genai (goal: decode ≥ 0.9, TTFT ≤ 1.1).

and, with --page, one `accelharness run` on the folder (native ORT, the onnxruntime-genai row, the page on
wasm at 1 thread) for the harness's own rows.

    timeout 900 .venv/bin/python bench/generate_peers.py [--threads 2] [--rounds 5] [--prompt 32] [--new-tokens 32]
        [--page]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from peer_folders import genai_folder

Loop = Callable[[np.ndarray, int, Callable[[], None]], None]


def ours(folder: Path, threads: int, spinning: bool | None) -> Loop:
    """Our native ORT loop on the folder's graph (spinning None: the backend's rule)."""
    import onnxruntime as ort

    from harness.native.onnxruntime_backend import SPINNING_ENTRY, session_options
    from harness.prepare.folders import past_shape
    from harness.prepare.greedy import greedy, shares_kv_buffer

    graph = folder / "model.onnx"
    options, facts = session_options(threads)
    if spinning is not None:  # forced: what the backend's rule would otherwise decide
        options.add_session_config_entry(SPINNING_ENTRY, "1" if spinning else "0")
        facts |= {"spinning": spinning, "spinning_source": "forced by the bench"}
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    shape, share = past_shape(graph), shares_kv_buffer(graph)  # as OrtGenerator runs it
    print(f"  ours{'' if spinning is None else '-spin'}: {json.dumps(facts)}", flush=True)

    def run(ids: np.ndarray, new_tokens: int, stamp: Callable[[], None]) -> None:
        prompt = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        greedy(session, prompt, new_tokens, stamp, shape=shape, share=share)

    return run


def genai(folder: Path, threads: int) -> Loop:
    """onnxruntime-genai's own loop, its decoder session at `threads` intra-op threads."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    model = og.Model(config)

    def run(ids: np.ndarray, new_tokens: int, stamp: Callable[[], None]) -> None:
        params = og.GeneratorParams(model)
        length = ids.shape[1] + new_tokens
        params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=1)
        generator = og.Generator(model, params)
        generator.append_tokens(ids.astype(np.int32))
        for _ in range(new_tokens):
            generator.generate_next_token()
            stamp()

    return run


def genai_row(folder: Path, threads: int) -> Loop:
    """Our onnxruntime-genai engine, loaded as a worker loads it."""
    from harness.native.base import LoadRequest
    from harness.native.onnxruntime_genai_backend import BACKEND
    from harness.prepare.specs import spec_from_path

    spec = spec_from_path(folder, None)
    session = BACKEND.load(LoadRequest(spec, None, "q4", threads=threads), BACKEND.targets()[0])

    def run(ids: np.ndarray, new_tokens: int, stamp: Callable[[], None]) -> None:
        session.generate(session.prepare({"input_ids": ids, "attention_mask": np.ones_like(ids)}), new_tokens, stamp)

    return run


def timed(loop: Loop, ids: np.ndarray, new_tokens: int) -> tuple[float, float, float]:
    """(TTFT ms, decode tokens/s, the 1-minute load average right after) of one generation: the machine is
    shared, so each figure carries the load it was measured under."""
    stamps: list[float] = []
    start = time.perf_counter()
    loop(ids, new_tokens, lambda: stamps.append(time.perf_counter()))
    ttft = (stamps[0] - start) * 1000
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return ttft, decode, os.getloadavg()[0]


def rounds(loops: dict[str, Loop], ids: np.ndarray, new_tokens: int, count: int) -> dict[str, list[tuple]]:
    """Every loop once per round, in a rotating order; one untimed generation each first."""
    for loop in loops.values():
        loop(ids, new_tokens, lambda: None)
    found: dict[str, list[tuple]] = {name: [] for name in loops}
    names = list(loops)
    for index in range(count):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            found[name].append(timed(loops[name], ids, new_tokens))
    return found


def summary(found: dict[str, list[tuple]], title: str) -> None:
    load = os.getloadavg()[0]  # "quiet" means no busy process of ours: the machine's other load is this
    print(f"\n{title} (load average {load:.1f} on {os.cpu_count()} CPUs at the end)")
    medians = {}
    for name, samples in found.items():
        ttft = statistics.median(s[0] for s in samples)
        decode = statistics.median(s[1] for s in samples)
        medians[name] = (ttft, decode)
        spread = f"{min(s[1] for s in samples):.0f}-{max(s[1] for s in samples):.0f}"
        loads = f"{min(s[2] for s in samples):.1f}-{max(s[2] for s in samples):.1f}"
        print(f"  {name:10s} TTFT {ttft:7.1f} ms   decode {decode:6.1f} tok/s (rounds {spread}; load {loads})")
    base = medians["genai"]
    for name in medians:
        if name != "genai":
            ttft, decode = medians[name]
            ratios = f"decode {decode / base[1]:.2f} (goal ≥ 0.9)   TTFT {ttft / base[0]:.2f} (goal ≤ 1.1)"
            print(f"  {name} ÷ genai: {ratios}")


def harness_rows(folder: Path, threads: int, prompt: int, new_tokens: int) -> None:
    """One `accelharness run` on the folder: native ORT and the onnxruntime-genai row at `threads`, and the
    page on wasm at 1 thread (not interleaved with the rounds above: the harness's own rows, as a user gets)."""
    import duckdb

    with tempfile.TemporaryDirectory(prefix="peers-") as directory:
        db = Path(directory) / "peers.duckdb"
        command = [sys.executable, "-m", "harness.cli", "run", "--mode", "generate", "--model-path", str(folder),
                   "--engines", "onnxruntime,onnxruntime-genai", "--hardware", "cpu", "--web-hardware", "wasm",
                   "--native-threads", str(threads), "--threads", "1", "--sequence-lengths", str(prompt),
                   "--new-tokens", str(new_tokens), "--iterations", "5", "--warmup", "1", "--min-duration", "0",
                   "--db", str(db), "--output-dir", directory]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"\naccelharness run failed ({done.returncode}): {done.stderr.strip()[-500:]}")
            return
        found = duckdb.connect(str(db), read_only=True).execute(
            "SELECT engine, provider, status, ttft_ms, decode_tokens_per_s, load_avg_1m FROM results "
            "ORDER BY engine, provider"
        )
        print("\nthe harness's rows (accelharness run, one busy core: no)")
        for engine, provider, status, ttft, decode, load in found.fetchall():
            figures = f"TTFT {ttft:7.1f} ms   decode {decode:6.1f} tok/s" if ttft is not None else ""
            print(f"  {engine}:{provider} {status} {figures} (load {load:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--page", action="store_true", help="also one `accelharness run` with the page on wasm")
    args = parser.parse_args()
    folder = genai_folder()
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    ids = np.random.default_rng(vocab).integers(100, vocab, size=(1, args.prompt), dtype=np.int64)
    print(f"{folder}: prompt {args.prompt}, {args.new_tokens} new tokens, {args.threads} threads, {args.rounds} rounds")
    loops = lambda: {  # noqa: E731  made in each phase: the spinning rule reads the machine's load at the load
        "ours": ours(folder, args.threads, None),
        "ours-spin": ours(folder, args.threads, True),
        "genai": genai(folder, args.threads),
        "genai-row": genai_row(folder, args.threads),
    }
    summary(rounds(loops(), ids, args.new_tokens, args.rounds), "no busy process beside it")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        summary(rounds(loops(), ids, args.new_tokens, args.rounds), "one busy core beside it")
    finally:
        busy.kill()
        busy.wait()
    if args.page:
        harness_rows(folder, args.threads, args.prompt, args.new_tokens)


if __name__ == "__main__":
    main()
