"""Workers that crash, hang or run out of memory: real child processes, real signals.

Each fault runs both ways a worker starts: spawned, and forked from the server that has torch
imported (uses_torch=True).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.isolation import run_isolated

START = pytest.mark.parametrize("uses_torch", [False, True], ids=["spawned", "forked"])


def crash_after_one(_: object) -> Iterator[str]:
    yield "first"
    ctypes.string_at(0)  # segfault
    yield "never"


def abort_now(_: object) -> Iterator[str]:
    import os

    yield "first"
    os.abort()


def hang_after_one(_: object) -> Iterator[str]:
    yield "first"
    time.sleep(600)
    yield "never"


def raise_memory_error(_: object) -> Iterator[str]:
    raise MemoryError("cannot allocate 8 GiB")
    yield "never"


def finish(payload: int) -> Iterator[int]:
    yield from range(payload)


@START
def test_segfault_keeps_what_was_reported_and_names_the_signal(uses_torch: bool) -> None:
    items: list[str] = []
    outcome = run_isolated(crash_after_one, None, 60, items.append, uses_torch=uses_torch)
    assert items == ["first"]
    assert outcome.status == "error"
    assert "SIGSEGV" in outcome.message
    assert "Segmentation fault" in outcome.message  # faulthandler's report from the worker log


@START
def test_abort_is_reported_as_sigabrt(uses_torch: bool) -> None:
    items: list[str] = []
    outcome = run_isolated(abort_now, None, 60, items.append, uses_torch=uses_torch)
    assert items == ["first"] and outcome.status == "error" and "SIGABRT" in outcome.message


@START
def test_hang_is_killed_at_the_timeout(uses_torch: bool) -> None:
    items: list[str] = []
    started = time.monotonic()
    outcome = run_isolated(hang_after_one, None, 8, items.append, uses_torch=uses_torch)
    assert items == ["first"]
    assert outcome.status == "timeout" and "--timeout 8s" in outcome.message
    assert time.monotonic() - started < 60


@START
def test_memory_error_is_oom(uses_torch: bool) -> None:
    outcome = run_isolated(raise_memory_error, None, 60, lambda _: None, uses_torch=uses_torch)
    assert outcome.status == "oom" and "cannot allocate" in outcome.message


@START
def test_normal_completion(uses_torch: bool) -> None:
    items: list[int] = []
    assert run_isolated(finish, 3, 60, items.append, uses_torch=uses_torch).status == "finished"
    assert items == [0, 1, 2]


def what_the_worker_sees(_: object) -> Iterator[tuple[str | None, str, bool]]:
    yield os.environ.get("ACCELHARNESS_PROBE"), os.getcwd(), "torch" in sys.modules


@START
def test_worker_sees_the_callers_environment_and_directory_now(
    uses_torch: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server started with an older environment; the job must still see the current one."""
    run_isolated(finish, 1, 60, lambda _: None, uses_torch=uses_torch)  # the server (if any) starts here
    monkeypatch.setenv("ACCELHARNESS_PROBE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    seen: list[tuple[str | None, str, bool]] = []
    assert run_isolated(what_the_worker_sees, None, 60, seen.append, uses_torch=uses_torch).status == "finished"
    # A forked worker starts with torch imported; a spawned one does not pay for it.
    assert seen == [(str(tmp_path), str(tmp_path), uses_torch)]
