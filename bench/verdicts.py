"""How often is a verdict wrong on this machine? False alarms and power of `compare` and `ab`.

Per pair, through the real CLI, on bert-tiny and vit-tiny with torch and ONNX Runtime on the CPU
(four cases), with one threshold:
  (a) two identical `accelharness native` runs back to back, then `compare previous latest`:
      a false alarm is a case called `regressed` or `improved`. Counted twice: as the verdicts
      would be without the drift control (a `drift` case counts as the alarm it replaced), and as
      `compare` gives them now.
  (b) the same model on both sides of `accelharness ab`: a false alarm is anything but `unchanged`
      (`noisy` included: the job could not say "no change").
  (c) `accelharness ab` with B = the same architecture with one more layer (5 -> 6: ~20% more
      work): power is the share of cases called `regressed`.

    .venv/bin/python bench/verdicts.py [--pairs 10] [--threshold 10%] [--workdir bench-verdicts]

Each pair's verdicts are appended to WORKDIR/verdicts.jsonl (with the load average), so an
interrupted benchmark is scored from what it finished (--score-only). Nothing else should run on
the machine meanwhile: a false alarm caused by this benchmark's own neighbours is still a false alarm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

MODELS = ("bert-tiny", "vit-tiny")
ENGINES = "torch,onnxruntime"
ALARMS = ("regressed", "improved")
# The architectures of bert-tiny and vit-tiny with 5 and 6 layers: B does one layer (~20%) more work.
DEEPER = {
    "bert": {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 128, "num_attention_heads": 2,
             "intermediate_size": 512, "vocab_size": 30522},
    "vit": {"model_type": "vit", "architectures": ["ViTModel"], "hidden_size": 64, "num_attention_heads": 2,
            "intermediate_size": 128, "image_size": 64},
}  # fmt: skip
LAYERS = (5, 6)


def cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "harness.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def model_dirs(workdir: Path) -> dict[str, tuple[Path, Path]]:
    """Per architecture, the HF model directories (config only: seeded weights) with 5 and 6 layers."""
    dirs = {}
    for name, config in DEEPER.items():
        pair = []
        for layers in LAYERS:
            directory = workdir / f"{name}-{layers}l"
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "config.json").write_text(json.dumps(config | {"num_hidden_layers": layers}))
            pair.append(directory)
        dirs[name] = (pair[0], pair[1])
    return dirs


def compare_pair(db: Path, threshold: str) -> list[dict]:
    """(a): two identical native runs, then compare; each case's verdict and what it was before drift."""
    for _ in range(2):
        cli("native", "--model", ",".join(MODELS), "--hardware", "cpu", "--engines", ENGINES, "--db", str(db),
            "--output-dir", str(db.parent / "reports"))  # fmt: skip
    out = db.parent / "compare.json"
    cli("compare", "previous", "latest", "--threshold", threshold, "--format", "json", "--out", str(out),
        "--db", str(db))  # fmt: skip
    found = []
    for row in json.loads(out.read_text())["rows"]:
        # a `drift` verdict replaced the regressed/improved the ratio alone gave (its note says which)
        before = row["note"].split(" ×", 1)[0] if row["verdict"] == "drift" else row["verdict"]
        found.append({"method": "compare", "case": f"{row['model']} {row['target']}", "verdict": row["verdict"],
                      "without_control": before, "ratio": row["ratio"], "control": row["control_ratio"]})  # fmt: skip
    return found


def ab_pair(db: Path, method: str, a: str, b: str, threshold: str) -> list[dict]:
    """(b) and (c): one ab run of A against B on both engines."""
    out = db.parent / f"{method}.json"
    cli("ab", "--a", a, "--b", b, "--hardware", "cpu", "--engines", ENGINES, "--threshold", threshold,
        "--format", "json", "--out", str(out), "--db", str(db))  # fmt: skip
    return [
        {"method": method, "case": f"{row['model']} {row['target']}", "verdict": row["verdict"], "ratio": row["ratio"]}
        for row in json.loads(out.read_text())["rows"]
    ]


def run_pair(number: int, workdir: Path, threshold: str, dirs: dict[str, tuple[Path, Path]]) -> list[dict]:
    db = workdir / f"pair{number}" / "store.duckdb"
    db.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    rows = compare_pair(db, threshold)
    for model in MODELS:
        rows += ab_pair(db, "ab-identical", model, model, threshold)
    for a, b in dirs.values():
        rows += ab_pair(db, "ab-one-more-layer", str(a), str(b), threshold)
    return [row | {"pair": number, "load_avg_1m": load} for row in rows]


def share(rows: list[dict], key: str, wanted: tuple[str, ...]) -> str:
    hits = sum(r[key] in wanted for r in rows)
    return f"{hits}/{len(rows)} ({hits / len(rows):.0%})" if rows else "—"


def score(rows: list[dict], threshold: str) -> None:
    by_method = {m: [r for r in rows if r["method"] == m] for m in ("compare", "ab-identical", "ab-one-more-layer")}
    pairs = len({r["pair"] for r in rows})
    loads = [r["load_avg_1m"] for r in rows]
    print(f"{pairs} pairs, threshold {threshold}, load average at pair start {min(loads):.2f}-{max(loads):.2f}\n")
    print("| measure | what | cases | result |")
    print("|---|---|---:|---|")
    compare_rows = by_method["compare"]
    print(f"| false alarms | compare, without drift control | {len(compare_rows)} | "
          f"{share(compare_rows, 'without_control', ALARMS)} |")  # fmt: skip
    with_control = share(compare_rows, "verdict", ALARMS)
    print(f"| false alarms | compare, with drift control | {len(compare_rows)} | {with_control} |")
    identical = by_method["ab-identical"]
    not_unchanged = tuple({r["verdict"] for r in identical} - {"unchanged"})
    print(f"| false alarms | ab, identical variants (anything but unchanged) | {len(identical)} | "
          f"{share(identical, 'verdict', not_unchanged)} |")  # fmt: skip
    deeper = by_method["ab-one-more-layer"]
    ratios = [r["ratio"] for r in deeper if r["ratio"]]
    span = f", measured ratios {min(ratios):.2f}-{max(ratios):.2f}" if ratios else ""
    power = share(deeper, "verdict", ("regressed",))
    print(f"| power | ab, B = one more layer (5 -> 6){span} | {len(deeper)} | {power} |")
    for method, found in by_method.items():
        print(f"\n{method} verdicts: {dict(Counter(r['verdict'] for r in found))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--threshold", default="10%")
    parser.add_argument("--workdir", type=Path, default=Path("bench-verdicts"))
    parser.add_argument("--score-only", action="store_true", help="Score the pairs WORKDIR already holds.")
    args = parser.parse_args()
    results = args.workdir / "verdicts.jsonl"
    if not args.score_only:
        args.workdir.mkdir(parents=True, exist_ok=True)
        dirs = model_dirs(args.workdir)
        done = len({json.loads(line)["pair"] for line in results.read_text().splitlines()}) if results.exists() else 0
        for number in range(done, args.pairs):
            started = time.monotonic()
            rows = run_pair(number, args.workdir, args.threshold, dirs)
            with results.open("a") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)
            print(f"pair {number}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    score([json.loads(line) for line in results.read_text().splitlines()], args.threshold)


if __name__ == "__main__":
    main()
