"""Shared fixtures. Every test uses real parts: DuckDB files, worker processes, ORT, OpenVINO, torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest

# One export/input cache for the whole session (set before any worker is spawned, so children
# inherit it, pytest-xdist's workers included): the first test to need bert-tiny exports it, later
# ones hit the cache. Exports are renamed into place, so two workers exporting at once is safe.
if "ACCELHARNESS_CACHE_DIR" not in os.environ:  # `make test` gives both of its passes one
    os.environ["ACCELHARNESS_CACHE_DIR"] = tempfile.mkdtemp(prefix="accelharness-test-cache-")
os.environ.pop("ACCELHARNESS_INJECT_FAULT", None)
# Ceilings (harness.run.ceilings) only where a test reads them: test_roofline.py turns them back on.
os.environ["ACCELHARNESS_NO_CEILINGS"] = "1"
# ... and bandwidth_large (~1 s a target) only where a test reads it: test_roofline.py and test_bandwidth_large.py.
os.environ["ACCELHARNESS_NO_BANDWIDTH_LARGE"] = "1"
# A shell without job control starts a background job (`make test &` in a script) with SIGINT
# ignored, and every process it starts inherits that: the Ctrl-C tests would send SIGINTs that no
# process hears, and wait out their timeouts. A handler, unlike "ignored", is not inherited across
# exec: this process and each one it starts (each Python installs its own) take Ctrl-C as a terminal's.
signal.signal(signal.SIGINT, signal.default_int_handler)

CLI = [sys.executable, "-m", "harness.cli"]
# The timing tests' one CPU: the last this process may use (on a VM the first usually takes more interrupts). Two
# sides measured on one CPU see the same core, the same drift and the same interruptions; on the VM's two vCPUs at
# once identical work differed by up to 45% (one vCPU slower under neighbours' load), pinned to one by 0-1%.
ONE_CPU = {max(os.sched_getaffinity(0))}


@contextmanager
def on_one_cpu() -> Iterator[None]:
    """This process, and every process and thread it starts meanwhile (they inherit the mask), on ONE_CPU."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, ONE_CPU)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


QUICK = ["--iterations", "5", "--warmup", "0", "--min-duration", "0"]  # --warmup 0: no page warm-up floor (4 s a case)


def run_cli_process(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (in `cwd`, where relative default paths such as the DB land)."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd
    )


@cache
def shares_a_module_fixture(module: Path) -> bool:
    """Whether a test module defines a module-scoped fixture (a measured run, a cluster, a build)."""
    return 'scope="module"' in module.read_text(encoding="utf-8")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a shared fixture first (each is one long unit of work under pytest -n), in file order."""
    items.sort(key=lambda item: not shares_a_module_fixture(item.path))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n`: a module with a module-scoped fixture runs whole on one worker, so its fixture is
    built once; every other test is its own unit, so the two workers stay evenly loaded.
    (xdist's own --dist loadgroup cannot do this under pytest 9: the group tag it puts on nodeids no
    longer reaches them.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if Path(module).name.startswith("test_firefox"):  # one worker: each checks no Firefox of ours is left
                return "firefox"
            return module if shares_a_module_fixture(config.rootpath / module) else nodeid

    return SharedFixtureScheduling(config, log)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "bench.duckdb"


def stored_rows(db: Path) -> list[dict[str, Any]]:
    """Every results row of a store as a dict, its details parsed."""
    import json

    import duckdb

    with duckdb.connect(str(db), read_only=True) as connection:
        cursor = connection.execute("SELECT * FROM results")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return [r | {"details": json.loads(r["details"])} for r in rows]


def store_at_version(path: Path, version: int) -> Any:
    """An open DuckDB connection to a new store as accelharness wrote it at schema `version` (an older store, for
    the tests of migrating and reading one); the caller adds its rows and closes it."""
    import duckdb

    from harness.store import MIGRATIONS, SCHEMA

    connection = duckdb.connect(str(path))
    connection.execute(SCHEMA)
    for each in range(2, version + 1):
        for statement in MIGRATIONS[each]:
            connection.execute(statement)
    connection.execute("INSERT INTO schema_version VALUES (?, now())", [version])
    return connection


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI's Typer app called in this process (Click's CliRunner), in `cwd`: exit code, stdout and stderr as
    `run_cli_process` returns them, without a Python start (~0.8 s of CPU each). Its runs start their workers as a
    CLI process does, from this process: the fork server (multiprocessing's, one per process) is started by the
    first run that needs torch, and each forked job takes the environment and directory of the call (isolation.py).
    An exception the app did not turn into an exit code is appended to stderr (a traceback a user would see).
    A test of what only a process has (its exit without a traceback, signals, limits, an environment read at
    import) calls `run_cli_process`."""
    import traceback

    from typer.testing import CliRunner

    from harness.cli import app

    here = Path.cwd()
    handlers = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
    os.chdir(cwd or here)
    try:
        result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=True)
    finally:
        os.chdir(here)
        for each, handler in handlers.items():  # the app takes SIGINT and SIGTERM as a CLI process does
            signal.signal(each, handler)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, stderr)
