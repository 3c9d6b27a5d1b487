"""The real CLI app run inside the test's process (Typer's CliRunner on `harness.cli.app`), for refusals that never
reach a run: each case without the second of CPU a new Python and the harness's imports cost. A test function that
uses it keeps one case through `conftest.run_cli` (a real subprocess), which is what proves the process exits 2
without a traceback; the in-process cases check the same exit code, message and nothing written."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path


def cli_in_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`accelharness *args` run here, answered as `run_cli` answers (returncode, stdout, stderr)."""
    from typer.testing import CliRunner

    from harness.cli import app

    # The app's callback takes SIGINT and SIGTERM (harness.cli.stops): this process's handlers are put back.
    handlers = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
            done = CliRunner().invoke(app, list(args))
    finally:
        for each, handler in handlers.items():
            signal.signal(each, handler)
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception  # a crash is the test's failure, with its traceback, never an exit code to compare
    return subprocess.CompletedProcess(list(args), done.exit_code, done.stdout, done.stderr)
