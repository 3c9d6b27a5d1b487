"""Workers that crash, hang or run out of memory: real child processes, real signals.

Each fault runs both ways a worker starts: spawned, and forked from the server that has torch
imported (uses_torch=True).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness.run.isolation import run_isolated

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


def report_pid_then_hang(_: object) -> Iterator[int]:
    yield os.getpid()
    time.sleep(600)


@START
def test_sigkill_from_another_process_is_error_not_oom(uses_torch: bool) -> None:
    """kill -9 of a worker (a user, a scheduler's cancel) is not the kernel's OOM killer: `error`, saying so."""
    outcome = run_isolated(
        report_pid_then_hang, None, 60, lambda pid: os.kill(pid, signal.SIGKILL), uses_torch=uses_torch
    )
    assert outcome.status == "error", outcome.message
    assert "SIGKILL" in outcome.message and "not the kernel's out-of-memory killer" in outcome.message


def allocate_until_killed(_: object) -> Iterator[str]:
    yield "allocating"
    hoard = []
    while True:
        hoard.append(bytearray(64 * 2**20))  # zero-filled: every page is touched


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A child memory cgroup (v1 or v2) limited to 768 MiB; its cgroup.procs. Needs a writable cgroupfs."""
    created = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, limit_file = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"
        elif controllers == "":
            base, limit_file = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
        else:
            continue
        try:
            created = base / f"accelharness-test-{os.getpid()}"
            created.mkdir()
            (created / limit_file).write_text(str(768 * 2**20))
            (created / "cgroup.procs").stat()
            break
        except OSError:
            if created is not None and created.exists():
                created.rmdir()
            created = None
    if created is None:
        pytest.skip("no writable memory cgroup here to run a job out of memory in")
    try:
        yield created / "cgroup.procs"
    finally:
        deadline = time.monotonic() + 30
        while (created / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        created.rmdir()


def test_kernel_oom_kill_is_oom(memory_cgroup: Path) -> None:
    """A worker the kernel's OOM killer ends (its cgroup's oom_kill count rises) is `oom`."""
    script = (
        "import os, sys\n"
        f"open({str(memory_cgroup)!r}, 'w').write(str(os.getpid()))\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from harness.run.isolation import run_isolated\n"
        "from test_isolation import allocate_until_killed\n"
        "outcome = run_isolated(allocate_until_killed, None, 120, lambda _: None)\n"
        "print(outcome.status)\n"
        "print(outcome.message)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    status, message = done.stdout.split("\n", 1)
    assert status == "oom", message
    assert "out-of-memory killer (oom_kill in " in message


def start_a_child_then(then: str) -> Iterator[int]:
    """As an engine might (a compiler pool, a helper server): start a process, then hang or finish."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield child.pid
    if then == "hang":
        time.sleep(600)


@START
@pytest.mark.parametrize("then", ["hang", "finish"])
def test_what_a_worker_started_dies_with_it(uses_torch: bool, then: str) -> None:
    """The worker's whole process group is killed: at the timeout, and after a short grace once it is done."""
    pids: list[int] = []
    outcome = run_isolated(start_a_child_then, then, 8, pids.append, uses_torch=uses_torch)
    assert outcome.status == ("timeout" if then == "hang" else "finished"), outcome.message
    child = psutil.Process(pids[0]) if psutil.pid_exists(pids[0]) else None
    _, alive = psutil.wait_procs([child] if child else [], timeout=10)
    try:
        assert not alive, f"the worker's child {pids[0]} outlived it"
    finally:
        for process in alive:
            process.kill()


def readme_api_example() -> str:
    """The manual's Python API example (docs/python-api.md), with a quick workload (ONNX Runtime only, 3
    iterations)."""
    section = (Path(__file__).parents[1] / "docs" / "python-api.md").read_text()
    example = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 10)]
    assert "iterations=50," in example and "run_native(" in example and "__main__" not in example
    return example.replace("iterations=50,", 'engines=["onnxruntime"], iterations=3, warmup=0, min_duration_s=0,')


@pytest.mark.parametrize("way", ["script", "stdin", "command"])
def test_readme_api_example_runs_as_written(tmp_path: Path, way: str) -> None:
    """`python bench.py` with no `if __name__ == "__main__"` guard, the same fed on stdin, and a notebook-like
    `python -c`: workers never re-run the caller's main module, so every row is measured, none is an error."""
    script = tmp_path / "bench.py"
    script.write_text(readme_api_example())
    command = {"script": [sys.executable, "bench.py"], "stdin": [sys.executable, "-"]}
    command["command"] = [sys.executable, "-c", script.read_text()]
    with script.open() as stdin:
        done = subprocess.run(command[way], stdin=stdin, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "{'ok': 2}" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "reports").is_dir()


def test_the_calling_process_never_imports_torch(tmp_path: Path) -> None:
    """A run with torch among its engines probes the machine in a worker and reads torch's results as
    plain data: torch (1 s) and transformers (0.5 s) stay out of the caller's process, every run. A run
    without torch, its export cached, starts no torch fork server at all (its probe and its prepare spawn
    plain workers). A run stores the platforms its engines serve only: torch-only, no openvino row."""
    script = (
        "import sys, multiprocessing.forkserver as fs\nfrom pathlib import Path\n"
        "from harness import BenchmarkRequest, run_native\nfrom harness.store import open_store\n"
        "def run(engines, db):\n"
        "    summary = run_native(BenchmarkRequest(models=['bert-tiny'], engines=engines, iterations=3, warmup=0, "
        "min_duration_s=0, db_path=Path(db), output_dir=None))\n"
        "    with open_store(Path(db), read_only=True) as store:\n"
        "        platforms = sorted(r['platform'] for r in store.hardware_rows(summary.run_id))\n"
        "    print(summary.counts, platforms, fs._forkserver._forkserver_pid is not None)\n"
        "run(['torch', 'onnxruntime'], 't.duckdb')\n"  # also exports bert-tiny if no earlier test has
        "fs._forkserver._stop()\n"
        "run(['onnxruntime'], 'ort.duckdb')\nrun(['torch'], 'torch.duckdb')\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    both, ort_only, torch_only, imported = done.stdout.strip().splitlines()[-4:]
    assert torch_only == "{'ok': 1} ['cpu', 'cuda', 'mps', 'rocm'] True", done.stdout
    assert ort_only.startswith("{'ok': 1} ['cpu', 'cuda', 'directml', 'mps', 'openvino'") and ort_only.endswith(
        "] False"
    ), done.stdout
    assert both.startswith("{'ok': 2} ") and both.endswith(" True"), done.stdout
    assert imported == "[]", done.stdout + done.stderr
