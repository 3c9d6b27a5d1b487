"""Decode against each target's measured bandwidth ceiling: a 135M-parameter Llama (SmolLM2-135M's config, random
weights) in fp32 and q4, at KV-cache depths 0 and 512, natively (ONNX Runtime CPU, and torch eager, whose ceilings
are the same graphs run as torch ops; it runs no q4) and in the page (wasm).

Writes the checkpoint from its config (no hub), then one `accelharness run` on it; prints each target's ceilings
and, per precision and depth, tg tokens/s, the bytes a decode token reads (weights by type + KV cache), the
achieved GB/s and its fraction of that target's bandwidth ceiling (docs/measurement.md).

    timeout 5400 .venv/bin/python bench/roofline.py [--threads 2] [--depths 0,512] [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import duckdb

# HuggingFaceTB/SmolLM2-135M's config.json (its architecture; the weights here are random)
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048,
                "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-5}  # fmt: skip
# --smoke: the same script end to end on a Llama of a few MB (the script's own check, in minutes)
SMOKE = SMOLLM2_135M | {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip


def write_checkpoint(directory: Path, config: dict) -> int:
    """A LlamaForCausalLM of this shape with random weights, as safetensors; its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config))
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depths", default="0,512")
    parser.add_argument("--out", type=Path, default=Path("bench-roofline"))
    parser.add_argument("--smoke", action="store_true", help="a Llama of a few MB instead: the script's own check")
    args = parser.parse_args()
    checkpoint = args.out / ("llama-smoke-random" if args.smoke else "smollm2-135m-random")
    parameters = write_checkpoint(checkpoint, SMOKE if args.smoke else SMOLLM2_135M)
    db = args.out / "roofline.duckdb"
    command = [sys.executable, "-m", "harness.cli", "run", "--model-path", str(checkpoint), "--mode", "generate",
               "--hardware", "cpu", "--engines", "onnxruntime,torch", "--web-hardware", "wasm", "--threads",
               str(args.threads), "--precision", "fp32,q4", "--depths", args.depths, "--batch-sizes", "1",
               "--sequence-lengths", "32", "--new-tokens", "16", "--iterations", "3", "--warmup", "1",
               "--min-duration", "0", "--timeout", "1800", "--db", str(db), "--output-dir", str(args.out)]  # fmt: skip
    subprocess.run(command, check=True)
    connection = duckdb.connect(str(db), read_only=True)
    shape = "a smoke Llama" if args.smoke else "SmolLM2-135M's config"
    print(f"{shape}, random weights: {parameters / 1e6:.2f} M parameters; b1, prompt 32, tg16")
    for row in connection.execute(
        "SELECT hardware, engine || ':' || provider, kind, precision, value, spread, error FROM ceilings "
        "ORDER BY hardware, engine, kind"
    ).fetchall():
        hardware, provider, kind, cls, value, spread, error = row
        figure = f"{value:.2f} {'GB/s' if kind == 'bandwidth' else 'GFLOP/s'} (spread {spread:.0%})" if value else error
        print(f"  ceiling {hardware}/{provider} {kind} {cls}: {figure}")
    rows = connection.execute(
        "SELECT hardware, engine || ':' || provider, precision, depth, status, decode_tokens_per_s, bytes_per_token, "
        "achieved_gbps, bandwidth_fraction, details FROM results ORDER BY hardware, engine, precision, depth"
    ).fetchall()
    for hardware, provider, precision, depth, status, tg, moved, gbps, fraction, details in rows:
        weights = json.loads(details).get("weight_bytes", {})
        by_type = ", ".join(f"{kind} {size / 2**20:.2f} MiB" for kind, size in sorted(weights.items()) if size > 2**10)
        if status != "ok" or tg is None:
            print(f"  {hardware}/{provider} {precision} d{depth}: {status}")
            continue
        print(
            f"  {hardware}/{provider} {precision} tg16 @ d{depth}: {tg:.1f} tokens/s, {moved / 2**20:.1f} MiB/token "
            f"({by_type}), {gbps:.2f} GB/s = "
            + (f"{fraction:.1%} of the bandwidth ceiling" if fraction is not None else "no bandwidth ceiling")
        )


if __name__ == "__main__":
    main()
