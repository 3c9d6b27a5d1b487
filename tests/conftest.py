"""Shared fixtures. Every test uses real parts: DuckDB files, worker processes, ORT, OpenVINO, torch."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# One export/input cache for the whole session (set before any worker is spawned, so children
# inherit it): the first test to need bert-tiny exports it, later ones hit the cache.
os.environ.setdefault("ACCELHARNESS_CACHE_DIR", tempfile.mkdtemp(prefix="accelharness-test-cache-"))
os.environ.pop("ACCELHARNESS_INJECT_FAULT", None)

CLI = [sys.executable, "-m", "harness.cli"]
QUICK = ["--iterations", "5", "--warmup", "1", "--min-duration", "0"]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (in `cwd`, where relative default paths such as the DB land)."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "bench.duckdb"
