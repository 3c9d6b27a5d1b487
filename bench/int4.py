"""q4 and q4f16 (int4 weight-only MatMulNBits) against fp32 and int8 on a llama of a few hundred MB,
natively and on wasm.

Writes a LLaMA checkpoint with random weights from a config (no hub), then one `accelharness run` on
it: native ONNX Runtime CPU and onnxruntime-web wasm, fp32, int8, q4 and q4f16, batch 1 and seq 128.
Prints, per target and precision, the p50 latency, the model file's size (graph + external data), the
parity against torch fp32 and what the weight MatMuls computed in.

    timeout 3600 .venv/bin/python bench/int4.py [--hidden 1024] [--layers 8] [--threads 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import duckdb


def write_checkpoint(directory: Path, hidden: int, layers: int) -> int:
    """A LlamaForCausalLM with random weights saved as safetensors; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, vocab_size=32000,
                         max_position_embeddings=2048)  # fmt: skip
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench-int4"))
    args = parser.parse_args()
    checkpoint = args.out / "llama-random"
    parameters = write_checkpoint(checkpoint, args.hidden, args.layers)
    db = args.out / "int4.duckdb"
    command = [sys.executable, "-m", "harness.cli", "run", "--model-path", str(checkpoint), "--hardware", "cpu",
               "--web-hardware", "wasm", "--threads", str(args.threads), "--precision", "fp32,int8,q4,q4f16",
               "--batch-sizes", "1", "--sequence-lengths", "128", "--iterations", "10", "--warmup", "2",
               "--min-duration", "0", "--timeout", "1800", "--db", str(db), "--output-dir", str(args.out)]  # fmt: skip
    subprocess.run(command, check=True)
    rows = duckdb.connect(str(db), read_only=True).execute(
        "SELECT engine, provider, precision, status, latency_p50_ms, max_abs_diff, max_rel_diff, details "
        "FROM results WHERE engine != 'torch' ORDER BY engine, precision"
    )
    found = [(*row[:7], json.loads(row[7])) for row in rows.fetchall()]
    # the page's rows carry the file's size (graph + external data); native ORT runs the same file
    sizes = {row[2]: row[7]["model_bytes"] for row in found if row[7].get("model_bytes")}
    print(f"llama random, {parameters / 1e6:.0f} M parameters, b1 s128")
    for engine, provider, precision, status, p50, diff, rel, facts in found:
        nan = float("nan")
        print(
            f"{engine:16} {provider:36} {precision:6} {status:9} p50 {p50 or nan:9.2f} ms  |diff| {diff or nan:.3g} "
            f"({rel or nan:.3g} of max|ref|, tolerance {facts.get('parity_tolerance', nan):.3g})  "
            f"file {sizes.get(precision, 0) / 2**20:.0f} MB  compute {facts.get('compute_precision')}"
        )


if __name__ == "__main__":
    main()
