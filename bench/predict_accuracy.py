"""How right is `predict`? Leave-one-model-out latency error of the operator predictor and the log-linear fit.

Profiles ONNX Runtime CPU and OpenVINO CPU on the base-size specs that fit this machine, at batch 1
and 2 and sequence 32 and 128 (images and audio have no sequence), through the real CLI
(`accelharness native --profile`, stored in its own DuckDB file), then scores both predictors on
the same stored results: each model's rows are predicted by a fit that saw no row of that model,
exactly the situation of a prediction for an unmeasured model. Prints a Markdown table per target
(the one in docs/deciding.md) and each model's held-out error.

    .venv/bin/python bench/predict_accuracy.py [--db bench-predict.duckdb] [--no-collect]

Collection resumes (`--resume`) when stopped; once it is complete, score again with --no-collect.
Measuring again (all models, or some with --models) adds a run to the store, and each case is
scored on its latest profiled result: re-measure the models a burst of load on the machine spoiled
(the rows' load_avg_1m and latency_cv show them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from harness.analysis.op_predict import fit_targets
from harness.analysis.predict_model import compare_methods

MODELS = (
    "bert-base-uncased",
    "distilbert-base-uncased",
    "roberta-base",
    "all-minilm-l6-v2",
    "vit-base-patch16-224",
    "resnet-50",
    "gpt2",
    "flan-t5-small",
    "wav2vec2-base",
    "whisper-base",
)


def collect(db: Path, models: list[str], output_dir: Path) -> None:
    """One native run over every model and case, profiled; an unfinished earlier one is continued."""
    command = [
        sys.executable, "-m", "harness.cli", "native", "--model", ",".join(models),
        "--hardware", "cpu,openvino", "--engines", "onnxruntime,openvino",
        "--batch-sizes", "1,2", "--sequence-lengths", "32,128",
        "--warmup", "2", "--iterations", "10", "--min-duration", "0", "--timeout", "900",
        "--profile", "--db", str(db), "--output-dir", str(output_dir),
    ]  # fmt: skip
    subprocess.run([*command, "--resume"], check=True)


def score(db: Path) -> None:
    print("| target | results | models | operators (LOMO MAPE) | log-linear (LOMO MAPE) |")
    print("|---|---:|---:|---:|---:|")
    for errors in compare_methods(db):
        hardware, engine, provider, precision = errors.target
        cells = [f"{value:.1%}" if value is not None else "—" for value in (errors.operators, errors.log_linear)]
        print(f"| {hardware}/{engine}:{provider} {precision} | {errors.rows} | {errors.models} | {' | '.join(cells)} |")
    for target, found in fit_targets(db).items():
        per_model: dict[str, list[float]] = defaultdict(list)
        for observation, guess in found.held_out:
            per_model[observation.model].append((guess - observation.latency_ms) / observation.latency_ms)
        signed = ", ".join(f"{model} {np.mean(errors):+.0%}" for model, errors in sorted(per_model.items()))
        print(f"\n{'/'.join(target)}: mean signed held-out error per model: {signed or found.why_not}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", type=Path, default=Path("bench-predict.duckdb"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-collect", action="store_true", help="Only score what the store holds.")
    args = parser.parse_args()
    if not args.no_collect:
        collect(args.db, args.models.split(","), args.db.with_suffix(".out"))
    print(f"load average {os.getloadavg()[0]:.2f} when scored; store {args.db}\n")
    score(args.db)


if __name__ == "__main__":
    main()
