"""What a thread count is, wherever one is chosen: the page's wasm threads (`--threads`) and the native
engines' intra-op threads (`--native-threads`). One option shape (a comma-separated list of counts from 1 to
MAX_THREADS), and one way a count is part of a target: a `:threads=N` suffix on its provider, so the rows of
1 and 2 threads are distinct targets (report columns, result keys) and wasm at N pairs with native at N."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.core.bounds import MAX_THREADS
from harness.core.options import option

# Targets are harness.core.records.Target, typed Any here: records imports labels, which imports this module.

THREADS_MARK = ":threads="


def threads_option(default: list[int] | None, *, flag: str, help: str, key: str | None = None) -> Any:
    """A request field taking thread counts: comma-separated, each from 1 to MAX_THREADS (None: no default
    list, the engine's own choice)."""
    factory = (lambda: list(default)) if default is not None else None
    spec: dict[str, Any] = {"factory": factory} if factory else {"default": None}
    return option(**spec, flag=flag, key=key, many=True, low=1, high=MAX_THREADS, help=help)


def threads_part(provider: str) -> str:
    """The `:threads=N` a provider carries ('' when none): labels that leave the provider out keep it."""
    _, mark, count = provider.rpartition(THREADS_MARK)
    return f"{mark}{count}" if mark and count.isdigit() else ""


def with_threads(provider: str, threads: int) -> str:
    """A provider that runs `threads` threads: `wasm:threads=2`, `CPUExecutionProvider:threads=2`."""
    return f"{provider}{THREADS_MARK}{threads}"


def threaded_target(target: Any, threads: int) -> Any:
    return dataclasses.replace(target, provider=with_threads(target.provider, threads))


def split_threads(target: Any) -> tuple[Any, int | None]:
    """A native target as its engine knows it (the provider without the suffix) and the thread count it was
    asked to run (None: the engine's default)."""
    base, mark, count = target.provider.rpartition(THREADS_MARK)
    if not mark or not count.isdigit():
        return target, None
    return dataclasses.replace(target, provider=base), int(count)
