"""A real model's first run (not a test): a 135M-parameter Llama from a cold export cache, with the default
--timeout, natively and on wasm.

SmolLM2-135M's config (30 layers, hidden 576, 9 heads of which 3 key/value, vocabulary 49,152) with random
weights, saved as an HF folder (no hub: the config is written here). A fresh ACCELHARNESS_CACHE_DIR makes
the export cold. Runs

    accelharness run --mode generate --model-path DIR --web-hardware wasm --hardware cpu --engines onnxruntime

with every other option at its default, and prints each phase's time as the CLI showed it (the preparation's
phases, then each stored row) and each row's status, TTFT and decode tokens/s. Issue 32's first run exported
the model twice inside the job's --timeout and timed out under load.

    timeout 3600 .venv/bin/python bench/cold_generate.py [--out DIR] [--new-tokens 16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

SMOLLM2_135M = {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192, "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


def write_model(directory: Path) -> int:
    """The Llama with random weights (seed 0), saved once; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
    if not (directory / "config.json").is_file():
        model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "accelharness" / "bench" / "cold")
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    model = args.out / "llama-135m-random"
    parameters = write_model(model)
    db = args.out / f"cold-{int(time.time())}.duckdb"
    command = [sys.executable, "-m", "harness.cli", "run", "--mode", "generate", "--model-path", str(model),
               "--web-hardware", "wasm", "--hardware", "cpu", "--engines", "onnxruntime",
               "--new-tokens", str(args.new_tokens), "--db", str(db),
               "--output-dir", str(args.out / "reports")]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cold-cache-") as cache:
        env = {**os.environ, "ACCELHARNESS_CACHE_DIR": cache}
        print(f"{parameters / 1e6:.0f} M parameters, cold cache {cache}\n$ {' '.join(command[1:])}", flush=True)
        started = last = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert process.stdout is not None
        for line in process.stdout:  # not a terminal: a line per phase and per stored row
            if line.startswith(("preparing ", "[")):
                now = time.perf_counter()
                print(f"  +{now - last:7.1f} s (at {now - started:7.1f} s)  {line.rstrip()}", flush=True)
                last = now
        process.wait()
        print(f"exit {process.returncode} after {time.perf_counter() - started:.0f} s")
    rows = duckdb.connect(str(db), read_only=True).execute(
        "SELECT engine, provider, status, ttft_ms, decode_tokens_per_s, error, load_avg_1m, "
        "details->'export' FROM results ORDER BY engine"
    )
    for engine, provider, status, ttft, decode, error, load, export in rows.fetchall():
        figures = f"TTFT {ttft:.0f} ms, decode {decode:.1f} tok/s" if ttft is not None else (error or "")[:160]
        print(f"  {engine} {provider}: {status}  {figures}  (load average {load:.1f})")
        print(f"    export: {export}")  # the plain export's exporter null: not made; the past's export_s


if __name__ == "__main__":
    main()
