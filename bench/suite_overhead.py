"""Suite overhead and the export cache's worth: a 5-family tiny suite on torch-CPU + ORT-CPU, run twice.

Run 1 starts from an empty export cache, run 2 reuses it. For each run it prints the wall time,
the time the store says was measured work (every timed iteration + every first run + every
model load), and their ratio (target <= 1.3 with a warm cache); then run 2's wall time over
run 1's (target <= 0.5). Warmup is 0 so no work goes unrecorded in the denominator.

    .venv/bin/python bench/suite_overhead.py [--min-duration 2] [--iterations 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import duckdb

TINY_SUITE = """
name = "bench-suite-overhead"
batch_sizes = [1]
sequence_lengths = [32]
warmup_iterations = 0
benchmark_iterations = {iterations}
min_duration_s = {min_duration}
timeout = 900
[model_families]
embedding = ["bert-tiny"]
text_generation = ["gpt2-tiny"]
vision = ["vit-tiny"]
audio = ["wav2vec2-tiny"]
multimodal = ["clip-tiny"]
[hardware]
hardware_types = ["cpu"]
engines = ["torch", "onnxruntime"]
include_web_platforms = false
[run]
parallel = false
db = "{db}"
output_dir = "{out}"
"""


def measured_ms(db: Path, run_id: str) -> tuple[float, int]:
    """Σ timed iterations + first runs + loads of a run, and its number of ok results."""
    connection = duckdb.connect(str(db), read_only=True)
    samples, results = connection.execute(
        "SELECT (SELECT coalesce(sum(s.latency_ms), 0) FROM samples s JOIN results r USING (result_id) "
        "        WHERE r.run_id = $run), "
        "       (SELECT coalesce(sum(first_run_ms), 0) + coalesce(sum(load_ms), 0) FROM results WHERE run_id = $run)",
        {"run": run_id},
    ).fetchone()
    ok = connection.execute("SELECT count(*) FROM results WHERE run_id = ? AND status = 'ok'", [run_id]).fetchone()
    connection.close()
    return samples + results, ok[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-duration", type=float, default=2.0, help="seconds of timed iterations per case")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="accelharness-bench-suite-"))
    os.environ["ACCELHARNESS_CACHE_DIR"] = str(work / "cache")  # empty: run 1 exports everything
    from harness.suite.config import load_config
    from harness.suite.plan import plan_suite  # after the cache dir is chosen
    from harness.suite.run import run_suite

    config_path = work / "suite.toml"
    text = TINY_SUITE.format(iterations=args.iterations, min_duration=args.min_duration, db=work / "b.duckdb", out=work)
    config_path.write_text(text)
    config = load_config(config_path)
    walls = []
    for label in ("cold export cache", "warm export cache"):
        started = time.perf_counter()
        summary = run_suite(plan_suite(config))
        wall_s = time.perf_counter() - started
        walls.append(wall_s)
        work_ms, ok = measured_ms(config.db, summary.run_id)
        print(
            f"{label}: wall {wall_s:.1f} s, measured work {work_ms / 1000:.1f} s over {ok} ok results "
            f"→ overhead ratio {wall_s * 1000 / work_ms:.2f} (target <= 1.3); load avg {os.getloadavg()[0]:.1f}"
        )
    print(f"warm / cold wall time: {walls[1] / walls[0]:.2f} (target <= 0.5)")
    print(f"(store and reports in {work})")


if __name__ == "__main__":
    main()
