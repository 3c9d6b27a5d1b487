"""Run a generator function in a child process under a hard time limit.

Whatever the child yields reaches the parent as it happens (the parent is the single DuckDB
writer), so a child that later crashes, hangs or is killed loses nothing it already reported.
The child's stdout/stderr go to a log file whose tail explains a crash (faulthandler writes
the Python stack of a segfault there).

Jobs that import torch anyway (a torch-engine run, preparing a spec model) are forked from a fork
server that imported torch and transformers once; every other job is a freshly spawned interpreter,
so an ONNX Runtime or OpenVINO worker's memory never includes torch. Either way each job is its own
process: a crash, hang or OOM takes down that job only.

Each worker leads its own process group, so it is killed with everything an engine started in it
(on a timeout, after a short grace once it is done, or when it or the CLI dies), and the terminal's
Ctrl-C reaches the CLI only: the CLI decides what an interrupt stops, and an interrupt is never a
job's outcome. Workers start with a bare `__main__`: they never re-run the caller's script.
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from harness.core.failures import classify

LOG_TAIL_LINES = 12
# What the fork server imports once: a spawned worker spent ~2.5 s of every job importing these. The
# server starts only for a job that imports torch: a torch-engine worker, or a prepare that exports
# (harness.prepare.prepared.needs_torch; a warm-cache prepare spawns). Not onnxscript: only an export
# needs it (torch.onnx imports it there), and it cost as much again as torch in every run, cached or not;
# not onnx either: a torch-engine worker never imports it, an export imports it where it writes the file.
# transformers stays: the torch engine and every export build their module with it, through
# transformers.modeling_utils (PreTrainedModel): 1.9 s of CPU that every forked job paid again (a torch job's
# load_ms of bert-tiny was 2.0 s), imported once here instead.
TORCH_PRELOAD = [
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "harness.prepare.prepared",
    "harness.run.worker",
    "harness.native.torch_session",
]
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
GROUP_WATCH_SIGNAL = signal.SIGUSR1  # what the kernel sends a worker's group watcher when the worker dies
EXIT_GRACE_S = 5.0  # after "done", how long a worker may take to exit before its group is killed


@dataclass(frozen=True)
class Outcome:
    status: str  # finished | timeout | error | oom | unsupported
    message: str | None = None


class Stopped(BaseException):
    """The run is stopping (Ctrl-C, or another device group failed): the job's worker was killed and
    nothing is recorded for what it had not reported, so --resume runs it. Never an outcome; a
    BaseException, so no `except Exception` on the way up records it."""


_thread = threading.local()  # .stop: the Event that ends this thread's jobs (see stop_when)


@contextmanager
def stop_when(event: threading.Event) -> Iterator[None]:
    """Within this block, the calling thread's worker is killed as soon as `event` is set and
    run_isolated raises Stopped (harness.suite.plan stops its other device groups this way)."""
    _thread.stop = event
    try:
        yield
    finally:
        del _thread.stop


def stopping() -> bool:
    """Whether the calling thread's jobs have been told to stop."""
    event = getattr(_thread, "stop", None)
    return event is not None and event.is_set()


def die_with_parent() -> None:
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


def _lead_own_group() -> None:
    """Make this worker the leader of a new process group, and on Linux fork a watcher that kills
    the group when the worker dies, however it dies (a timeout kill, a crash, or the kernel's
    PR_SET_PDEATHSIG when the CLI is killed): what an engine started (a compiler pool, a helper
    server) is in the group and dies with the job instead of outliving it."""
    os.setpgid(0, 0)
    worker = os.getpid()
    if sys.platform.startswith("linux") and os.fork() == 0:  # one thread here yet: fork is safe
        _watch_group(worker)


def _watch_group(worker: int) -> NoReturn:
    """The watcher: holds no file of the worker's (its pipe reaches EOF when the worker dies), waits
    for the kernel's word that the worker is gone, then SIGKILLs the whole group, itself included."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {GROUP_WATCH_SIGNAL})
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, GROUP_WATCH_SIGNAL)
        if os.getppid() == worker:  # else the worker died before prctl took effect
            signal.sigwait({GROUP_WATCH_SIGNAL})
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _child_main(
    fn: Callable[[Any], Iterator[Any]], payload: Any, conn: Any, log_path: str, environment: dict[str, str], cwd: str
) -> None:
    die_with_parent()
    _lead_own_group()
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
    except KeyboardInterrupt:  # a SIGINT sent to this worker itself: it stops the run, it is not this job's outcome
        conn.send(("interrupted", None))
    except BaseException as exc:  # report every other failure, then exit
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


CGROUP_ROOT = Path("/sys/fs/cgroup")
OomCount = tuple[Path, int]  # the file the kernel counts OOM kills in, and its count


def _oom_kill_files() -> list[Path]:
    """Where the kernel counts OOM kills of this process's workers (they share its cgroup), most
    specific first: the memory cgroup's memory.events (v2) or memory.oom_control (v1), or the
    mount's root when the cgroup's own directory is not visible; then the machine's /proc/vmstat."""
    files = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the one unified hierarchy
            files += [CGROUP_ROOT / path.lstrip("/") / "memory.events", CGROUP_ROOT / "memory.events"]
        elif "memory" in controllers.split(","):
            mount = CGROUP_ROOT / "memory"
            files += [mount / path.lstrip("/") / "memory.oom_control", mount / "memory.oom_control"]
    return [*files, Path("/proc/vmstat")]


def _read_oom_kills(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_kill_count() -> OomCount | None:
    """The kernel's OOM-kill count that covers this process's workers; None where none is readable."""
    for path in _oom_kill_files():
        if (count := _read_oom_kills(path)) is not None:
            return path, count
    return None


def _sigkill_outcome(before: OomCount | None, suffix: str) -> Outcome:
    """A SIGKILL is `oom` only when the kernel counted an OOM kill during the job: a user's kill -9,
    a scheduler's cancel or systemd-oomd send the same signal."""
    after = _read_oom_kills(before[0]) if before else None
    if before is None or after is None:
        why = "possibly out of memory: no OOM-kill count is readable here to tell"
        return Outcome("error", f"worker killed by SIGKILL ({why}){suffix}")
    path, count = before
    if after > count:
        return Outcome(
            "oom", f"worker killed by the kernel's out-of-memory killer (oom_kill in {path}: {count} → {after}){suffix}"
        )
    return Outcome(
        "error",
        f"worker killed by SIGKILL from another process, not the kernel's out-of-memory killer (oom_kill in "
        f"{path} stayed {count}): e.g. kill -9, a job scheduler's cancel, or a userspace OOM daemon such as "
        f"systemd-oomd{suffix}",
    )


def describe_exit(exitcode: int | None, log_path: Path, oom_before: OomCount | None) -> Outcome:
    tail = _log_tail(log_path)
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        suffix = f"; worker log:\n{tail}" if tail else ""
        if name == "SIGKILL":
            return _sigkill_outcome(oom_before, suffix)
        return Outcome("error", f"worker died with {name} (exit code {exitcode}){suffix}")
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


_BARE_MAIN = types.ModuleType("__main__")  # no __file__, no __spec__: nothing for a child to re-run
_START_LOCK = threading.Lock()


def _start(process: multiprocessing.process.BaseProcess) -> None:
    """Start the worker without the caller's main module.

    multiprocessing's spawn and forkserver children re-run the parent's `__main__` (as `__mp_main__`)
    before they unpickle their target: a plain `python bench.py` that calls run_native without an
    `if __name__ == "__main__"` guard would run the whole benchmark again in every worker (and meet
    the DB lock), and a script read from stdin has no file to re-run. A worker runs harness
    functions only, so it is started while `__main__` is a bare module: the preparation data then
    names no main module, and nothing of the caller's is imported."""
    with _START_LOCK:  # device-group threads start workers concurrently
        main = sys.modules["__main__"]
        sys.modules["__main__"] = _BARE_MAIN
        try:
            process.start()
        finally:
            sys.modules["__main__"] = main


def _kill_group(process: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL the worker's process group (the worker, its group watcher, whatever it started); the
    worker alone if it has not made its group yet."""
    assert process.pid is not None
    try:
        os.killpg(process.pid, signal.SIGKILL)  # a group with the worker's id exists only if the worker made it
    except ProcessLookupError:
        if process.is_alive():
            process.kill()


def _follow(
    process: multiprocessing.process.BaseProcess,
    receiver: Any,
    timeout_s: float,
    on_item: Callable[[Any], None],
    limit: str = "--timeout",
) -> Outcome | None:
    """Pass the worker's items on until it is done, fails, hangs past the deadline or dies (None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if stopping():
            raise Stopped
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Outcome("timeout", f"no result within {limit} {timeout_s:g}s; worker killed")
        if not receiver.poll(min(remaining, 0.25)):
            if not process.is_alive() and not receiver.poll():
                return None
            continue
        try:
            kind, value = receiver.recv()
        except EOFError:
            return None
        if kind == "item":
            on_item(value)
            deadline = time.monotonic() + timeout_s
        elif kind == "done":
            return Outcome("finished")
        elif kind == "interrupted":
            raise KeyboardInterrupt  # someone sent the worker SIGINT: the run stops, resumable
        else:
            status, message = value
            return Outcome(status, message)


def run_isolated(
    fn: Callable[[Any], Iterator[Any]],
    payload: Any,
    timeout_s: float,
    on_item: Callable[[Any], None],
    *,
    uses_torch: bool = False,
    limit: str = "--timeout",
) -> Outcome:
    """Run fn(payload) in a child process; on_item gets each yielded item in the parent.

    The time limit is per item: the deadline moves on each time the child reports progress,
    so a long but progressing job is not killed while a hang or a stuck load is.
    `uses_torch`: the job imports torch, so fork it from the server that has torch imported. `limit`: the
    option timeout_s came from, as a timeout's message names it.
    Ctrl-C (KeyboardInterrupt) or a stop_when() event kills the worker's group and propagates.
    """
    if stopping():
        raise Stopped
    context = _context(uses_torch)
    handle, log_name = tempfile.mkstemp(prefix="accelharness-worker-", suffix=".log")
    os.close(handle)
    log_path = Path(log_name)
    try:
        receiver, sender = context.Pipe(duplex=False)
        arguments = (fn, payload, sender, log_name, dict(os.environ), os.getcwd())
        process = context.Process(target=_child_main, args=arguments, daemon=True)
        oom_before = oom_kill_count()
        outcome = None
        try:
            _start(process)
            sender.close()  # the worker holds the only writing end: its death is EOF here
            outcome = _follow(process, receiver, timeout_s, on_item, limit)
        finally:
            sender.close()
            if process.pid is not None:  # started
                if outcome is not None and outcome.status == "finished":  # let it exit on its own first
                    multiprocessing.connection.wait([process.sentinel], EXIT_GRACE_S)
                _kill_group(process)  # also what it started, even once it has exited
                process.join(timeout=30)
            receiver.close()
        return outcome or describe_exit(process.exitcode, log_path, oom_before)
    finally:
        log_path.unlink(missing_ok=True)
