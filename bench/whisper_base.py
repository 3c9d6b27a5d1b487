"""whisper-base's speech figures natively (torch, ONNX Runtime CPU) and in the page (wasm): openai/whisper-base's
config with random weights (models/whisper.toml; no hub: the harness seeds them), hearing the first 5 s of
espeak-ng's spoken passage (harness.prepare.audio), greedy generation of 16 tokens.

One `accelharness run`; prints per target the encoder's ms, TTFT, decode tokens/s, the real-time factor (audio
seconds over the median generation's seconds), the token check and the 1-minute load average each row ran under
(docs/benchmarks.md).

    timeout 3000 .venv/bin/python bench/whisper_base.py [--model whisper-base] [--audio-seconds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="whisper-base", help="whisper-tiny: the script's own check, in minutes")
    parser.add_argument("--audio-seconds", default="5")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-whisper-base"))
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is not installed (apt-get install espeak-ng): the figures would be of noise, not speech")
    db = args.out / "whisper.duckdb"
    command = [sys.executable, "-m", "harness.cli", "run", "--model", args.model, "--mode", "generate",
               "--hardware", "cpu", "--engines", "torch,onnxruntime", "--web-hardware", "wasm", "--threads",
               str(args.threads), "--audio-seconds", args.audio_seconds, "--new-tokens", "16", "--batch-sizes", "1",
               "--sequence-lengths", "8", "--iterations", "3", "--warmup", "1", "--min-duration", "0",
               "--no-ceilings", "--timeout", "1800", "--db", str(db), "--output-dir", str(args.out)]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    connection = duckdb.connect(str(db), read_only=True)
    rows = connection.execute(
        "SELECT hardware, engine, provider, audio_seconds, status, encoder_ms, ttft_ms, decode_tokens_per_s, "
        "real_time_factor, latency_p50_ms, load_avg_1m, weights, details FROM results ORDER BY engine, audio_seconds"
    ).fetchall()
    for hardware, engine, provider, seconds, status, encoder, ttft, tg, rtf, p50, load, weights, details in rows:
        facts = json.loads(details)
        print(f"{args.model} ({weights} weights) {hardware}/{engine} {provider or ''} @ {seconds} s audio: {status}")
        print(f"  heard: {facts.get('audio_input')}")
        print(f"  encoder {_ms(encoder)}, TTFT {_ms(ttft)}, tg16 {tg and f'{tg:.1f} tokens/s'}, generation p50 "
              f"{_ms(p50)}, RTF {rtf and f'{rtf:.2f}x'}, load avg {load and f'{load:.2f}'}")  # fmt: skip
        print(f"  tokens: {facts.get('token_parity', 'not checked')}")


def _ms(value: float | None) -> str:
    return "NULL" if value is None else f"{value:.1f} ms"


if __name__ == "__main__":
    main()
