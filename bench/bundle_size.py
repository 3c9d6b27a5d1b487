"""Bundle size and import time for a store of many results with samples (issue 26's closing note).

Builds a store of --results results (default 10,000) with --samples latency samples each (default
100), in runs of 1,000, through the store's own schema and content hash (the rows are made here: this
measures the bundle machinery, not a model). Then, timing each with a wall clock: `export --bundle`
of every run, `import` into a fresh store, and the same import again (a no-op). Prints the store's
size, the bundle's size and the three times.

    .venv/bin/python bench/bundle_size.py [--results 10000] [--samples 100] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from harness.bundle.export import export_bundle
from harness.bundle.importer import import_bundles
from harness.store import hash_results_sql, open_store

RUN_SIZE = 1000


def build_store(path: Path, results: int, samples: int) -> None:
    """`results` ok rows of bert-tiny-like cases on four targets, each with `samples` latencies."""
    rng = np.random.default_rng(26)
    with open_store(path) as store:
        for start in range(0, results, RUN_SIZE):
            run_id = store.start_run("bench", {}, {"cpu_model": "bench CPU", "memory_gb": 16.0})
            count = min(RUN_SIZE, results - start)
            ids = [uuid.uuid4().hex for _ in range(count)]
            latencies = rng.lognormal(0.0, 0.1, size=(count, samples))
            rows = pa.table({
                "result_id": ids, "run_id": [run_id] * count, "result_key": [f"k{start + i}" for i in range(count)],
                "created_at": [datetime.now(UTC).replace(tzinfo=None)] * count,
                "model": [f"model-{(start + i) % 50}" for i in range(count)], "family": ["embedding"] * count,
                "weights": ["random"] * count, "hardware": ["cpu"] * count,
                "engine": [("onnxruntime", "torch", "openvino", "jax")[i % 4] for i in range(count)],
                "batch_size": [1 + (i // 4) % 8 for i in range(count)], "seq_len": [32] * count,
                "requested_precision": ["fp32"] * count, "precision": ["fp32"] * count, "status": ["ok"] * count,
                "iterations": [samples] * count, "latency_p50_ms": np.median(latencies, axis=1),
                "latency_mean_ms": latencies.mean(axis=1), "details": ["{}"] * count,
            })  # fmt: skip
            sample_rows = pa.table({
                "result_id": np.repeat(ids, samples), "iteration": np.tile(np.arange(samples, dtype=np.int32), count),
                "latency_ms": latencies.ravel(),
            })  # fmt: skip
            connection = store.connection
            connection.register("new_results", rows)
            connection.register("new_samples", sample_rows)
            connection.execute("INSERT INTO results BY NAME SELECT * FROM new_results")
            connection.execute("INSERT INTO samples BY NAME SELECT * FROM new_samples")
            store.finish_run(run_id, "completed")
        store.connection.execute(hash_results_sql())
    with open_store(path) as store:  # checkpointed: the file holds every row
        store.connection.execute("CHECKPOINT")


def timed(step: str, action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    seconds = time.perf_counter() - started
    print(f"{step}: {seconds:.2f} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=None)
    options = parser.parse_args()
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="accelharness-bundle-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    source, bundle, target = workdir / "source.duckdb", workdir / "all.bundle", workdir / "imported.duckdb"
    timed(f"build a store of {options.results:,} results x {options.samples} samples", lambda: build_store(
        source, options.results, options.samples))  # fmt: skip
    timed("export --bundle (every run)", lambda: export_bundle(source, bundle))
    timed("import into a fresh store", lambda: import_bundles(target, [bundle]))
    timed("import again (nothing new)", lambda: import_bundles(target, [bundle]))
    with open_store(target, read_only=True) as store:
        held = store.query("SELECT (SELECT count(*) FROM results) AS results, (SELECT count(*) FROM samples) AS s")[0]
    print(f"store: {source.stat().st_size / 2**20:.1f} MiB; bundle: {bundle.stat().st_size / 2**20:.1f} MiB "
          f"({bundle.stat().st_size / options.results:.0f} bytes per result); imported {held['results']:,} "
          f"results, {held['s']:,} samples")  # fmt: skip


if __name__ == "__main__":
    main()
