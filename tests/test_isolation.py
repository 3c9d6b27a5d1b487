"""Workers that crash, hang or run out of memory: real child processes, real signals."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator

from harness.isolation import run_isolated


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


def test_segfault_keeps_what_was_reported_and_names_the_signal() -> None:
    items: list[str] = []
    outcome = run_isolated(crash_after_one, None, 60, items.append)
    assert items == ["first"]
    assert outcome.status == "error"
    assert "SIGSEGV" in outcome.message
    assert "Segmentation fault" in outcome.message  # faulthandler's report from the worker log


def test_abort_is_reported_as_sigabrt() -> None:
    items: list[str] = []
    outcome = run_isolated(abort_now, None, 60, items.append)
    assert items == ["first"] and outcome.status == "error" and "SIGABRT" in outcome.message


def test_hang_is_killed_at_the_timeout() -> None:
    items: list[str] = []
    started = time.monotonic()
    outcome = run_isolated(hang_after_one, None, 8, items.append)
    assert items == ["first"]
    assert outcome.status == "timeout" and "--timeout 8s" in outcome.message
    assert time.monotonic() - started < 60


def test_memory_error_is_oom() -> None:
    outcome = run_isolated(raise_memory_error, None, 60, lambda _: None)
    assert outcome.status == "oom" and "cannot allocate" in outcome.message


def test_normal_completion() -> None:
    items: list[int] = []
    assert run_isolated(finish, 3, 60, items.append).status == "finished"
    assert items == [0, 1, 2]
