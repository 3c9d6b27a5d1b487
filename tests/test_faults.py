"""Faults inside real workers of a real run: the failing job gets a correct row, the run goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import QUICK, run_cli
from test_native_run import rows


@pytest.mark.parametrize(
    ("fault", "status", "message"),
    [
        ("segfault", "error", "SIGSEGV"),
        ("abort", "error", "SIGABRT"),
        ("oom", "oom", "MemoryError"),
        ("hang", "timeout", "no result within --timeout 20s"),
    ],
)
def test_worker_fault_is_recorded_and_other_jobs_complete(tmp_path: Path, fault, status, message) -> None:
    db = tmp_path / "f.duckdb"
    done = run_cli(
        "native",
        "--model",
        "bert-tiny",
        "--engines",
        "torch,onnxruntime",
        "--batch-sizes",
        "1,2",
        "--sequence-lengths",
        "16",
        *QUICK,
        "--timeout",
        "20",
        "--db",
        str(db),
        "--output-dir",
        str(tmp_path),
        env={"ACCELHARNESS_INJECT_FAULT": f"{fault}:bert-tiny:onnxruntime"},
    )
    assert done.returncode == 0, done.stderr
    results = rows(db)
    failed = [r for r in results if r["engine"] == "onnxruntime"]
    assert [r["status"] for r in failed] == [status, status]
    assert all(message in r["error"] for r in failed), failed[0]["error"]
    assert all(r["iterations"] is None for r in failed)  # no number was invented for them
    assert [r["status"] for r in results if r["engine"] == "torch"] == ["ok", "ok"]
    assert rows(db, "SELECT status FROM runs")[0]["status"] == "completed"
