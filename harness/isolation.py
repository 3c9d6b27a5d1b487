"""Run a generator function in a child process under a hard time limit.

Whatever the child yields reaches the parent as it happens (the parent is the single DuckDB
writer), so a child that later crashes, hangs or is killed loses nothing it already reported.
The child's stdout/stderr go to a log file whose tail explains a crash (faulthandler writes
the Python stack of a segfault there).

Jobs that import torch anyway (a torch-engine run, preparing a spec model) are forked from a fork
server that imported torch and transformers once; every other job is a freshly spawned interpreter,
so an ONNX Runtime or OpenVINO worker's memory never includes torch. Either way each job is its own
process: a crash, hang or OOM takes down that job only.
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 12
# What the fork server imports once: a spawned worker spent ~2.5 s of every job importing these.
TORCH_PRELOAD = [
    "torch",
    "transformers",
    "onnx",
    "onnxscript",
    "harness.prepare",
    "harness.worker",
    "harness.native.torch_backend",
]
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# How the engines say a graph holds an operator they have no kernel or conversion for (lower case):
# a fact about the engine, recorded as `unsupported`, not a crash.
UNSUPPORTED_OPERATOR = (
    "is not a registered function/op",  # ONNX Runtime, unknown op or domain
    "could not find an implementation for",  # ONNX Runtime, no kernel for this op/type on the EP
    "no conversion rule found for operations",  # OpenVINO's ONNX frontend
)


@dataclass(frozen=True)
class Outcome:
    status: str  # finished | timeout | error | oom | unsupported
    message: str | None = None


def classify(exc: BaseException) -> tuple[str, str]:
    """The status and one-paragraph message a failure is recorded with."""
    from harness.native.base import UnsupportedError

    message = "".join(traceback.format_exception_only(exc)).strip()[:2000]
    text = message.lower()
    if isinstance(exc, MemoryError) or "outofmemory" in type(exc).__name__.lower() or "out of memory" in text:
        return "oom", message
    if isinstance(exc, UnsupportedError) or type(exc).__name__ == "NotImplemented":
        return "unsupported", message
    if any(pattern in text for pattern in UNSUPPORTED_OPERATOR):
        return "unsupported", message
    return "error", message


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this worker when its parent dies, so a kill -9 of the CLI leaves
    no orphan worker running (or hanging) on the benchmark machine.

    A forked worker's parent is the fork server, which exits once no process holds its "alive" pipe:
    the worker closes its inherited copy, so the CLI's death ends the server and then the worker."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        server = getattr(sys.modules.get("multiprocessing.forkserver"), "_forkserver", None)
        alive_fd = getattr(server, "_forkserver_alive_fd", None)
        if alive_fd is not None:  # set only in a process the fork server started
            os.close(alive_fd)
            server._forkserver_alive_fd = None  # type: ignore[union-attr]
        parent = multiprocessing.parent_process()
        if parent is not None and not parent.is_alive():  # the CLI died before prctl took effect
            os._exit(1)


def _child_main(
    fn: Callable[[Any], Iterator[Any]], payload: Any, conn: Any, log_path: str, environment: dict[str, str], cwd: str
) -> None:
    _die_with_parent()
    # A forked worker inherits the fork server's environment and directory, not the CLI's current ones.
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    log = open(log_path, "w", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(log)
    try:
        for item in fn(payload):
            conn.send(("item", item))
        conn.send(("done", None))
    except BaseException as exc:  # report every failure, including KeyboardInterrupt, then exit
        traceback.print_exc()
        conn.send(("failed", classify(exc)))
    finally:
        conn.close()


def _log_tail(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _describe_exit(exitcode: int | None, log_path: Path) -> Outcome:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        tail = _log_tail(log_path)
        suffix = f"; worker log:\n{tail}" if tail else ""
        if name == "SIGKILL":
            return Outcome("oom", f"worker killed by SIGKILL (the kernel's out-of-memory killer sends this){suffix}")
        return Outcome("error", f"worker died with {name} (exit code {exitcode}){suffix}")
    tail = _log_tail(log_path)
    return Outcome("error", f"worker exited with code {exitcode} before finishing" + (f":\n{tail}" if tail else ""))


def start_method(uses_torch: bool) -> str:
    """How a job's worker starts (multiprocessing's name), recorded with its results."""
    return "forkserver" if uses_torch and "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _context(uses_torch: bool) -> multiprocessing.context.BaseContext:
    method = start_method(uses_torch)
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(TORCH_PRELOAD)  # read when the server starts, on the first job
    return context


def run_isolated(
    fn: Callable[[Any], Iterator[Any]],
    payload: Any,
    timeout_s: float,
    on_item: Callable[[Any], None],
    *,
    uses_torch: bool = False,
) -> Outcome:
    """Run fn(payload) in a child process; on_item gets each yielded item in the parent.

    The time limit is per item: the deadline moves on each time the child reports progress,
    so a long but progressing job is not killed while a hang or a stuck load is.
    `uses_torch`: the job imports torch, so fork it from the server that has torch imported.
    """
    context = _context(uses_torch)
    receiver, sender = context.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile(prefix="accelharness-worker-", suffix=".log", delete=False) as log_file:
        log_path = Path(log_file.name)
    arguments = (fn, payload, sender, str(log_path), dict(os.environ), os.getcwd())
    process = context.Process(target=_child_main, args=arguments, daemon=True)
    process.start()
    sender.close()
    deadline = time.monotonic() + timeout_s
    outcome: Outcome | None = None
    try:
        while outcome is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome = Outcome("timeout", f"no result within --timeout {timeout_s:g}s; worker killed")
                break
            if not receiver.poll(min(remaining, 0.25)):
                if not process.is_alive() and not receiver.poll():
                    break
                continue
            try:
                kind, value = receiver.recv()
            except EOFError:
                break
            if kind == "item":
                on_item(value)
                deadline = time.monotonic() + timeout_s
            elif kind == "done":
                outcome = Outcome("finished")
            else:
                status, message = value
                outcome = Outcome(status, message)
    finally:
        if process.is_alive() and (outcome is None or outcome.status != "finished"):
            process.kill()
        process.join(timeout=30)
        receiver.close()
    if outcome is None:
        outcome = _describe_exit(process.exitcode, log_path)
    log_path.unlink(missing_ok=True)
    return outcome
