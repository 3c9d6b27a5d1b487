"""The life of a run in the store, written once for native, web and combined runs.

A run row is opened, the hardware recorded, each body executes and emits Results that are
committed one by one as they arrive, and the run is closed as completed — or as interrupted if
anything (Ctrl-C included) escapes, after which the exception goes on. Then the reports and the
compatibility matrix are written from the store (harness.run.outputs).
"""

from __future__ import annotations

import errno
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.records import Ceiling, Control, Result
from harness.run.ceiling_reuse import CeilingBook
from harness.run.hardware import PlatformStatus, hardware_rows, platform_row
from harness.run.machine import machine_facts
from harness.run.outputs import Outputs, write_outputs
from harness.run.provenance import host_facts
from harness.store import StoreError, StoreWriteError, open_store

# a case's result, a drift-control measurement, a ceiling, or a browser platform as the browser that ran sees it
Emit = Callable[[Result | Control | Ceiling | PlatformStatus], None]
Body = Callable[[Emit], None]


@dataclass
class RunSummary:
    run_id: str
    db_path: Path
    counts: dict[str, int]
    reports: list[Path] = field(default_factory=list)
    report_error: str | None = None  # the results are stored, but writing the reports failed (disk full…)

    def write_reports(self, writer: Callable[[], list[Path]], output_dir: Path) -> None:
        """Write the reports; a failure (a full or read-only disk) is kept, the stored results stand."""
        try:
            self.reports = writer()
        except OSError as exc:
            remedy = "Free space" if exc.errno == errno.ENOSPC else "Fix that"  # a full disk, or anything else
            self.report_error = (
                f"run {self.run_id} is stored in {self.db_path}, but its reports could not be written to "
                f"{output_dir}: {exc}. {remedy}, then: accelharness report --run {self.run_id} "
                f"--output-dir {output_dir} --db {self.db_path}"
            )


def record_run(
    db_path: Path,
    command: str,
    arguments: dict[str, Any],
    bodies: list[Body],
    on_result: Callable[[Result, str], None] | None = None,
    outputs: Outputs | None = None,
    suite_id: str | None = None,
    resume_run_id: str | None = None,
    machine_label: str | None = None,
    engines: tuple[str, ...] | None = None,
    ceilings: Sequence[CeilingBook] = (),
) -> RunSummary:
    """Run each body under one run id; on_result(result, result_id) follows every commit.

    resume_run_id continues that run (its bodies must skip the keys it holds); bodies may emit
    from several threads (parallel device groups), so commits are serialised here. machine_label (else
    ACCELHARNESS_MACHINE_LABEL) names the machine in reports across machines. The hardware table holds the
    native platforms the run's engines serve (`engines`; None: those this process probed), probed at its
    start, and each browser platform the run drove, as that browser's own page saw it (emitted by the
    browser body; a platform not run is not probed). Each of `ceilings` (its plans' books) is given the earlier
    ceilings this run may take (harness.run.ceiling_reuse) before a body runs."""
    host = host_facts()
    counts: Counter[str] = Counter()
    commit_lock = threading.Lock()  # every write: each result, closing the run, closing the file
    with open_store(Path(db_path)) as store:
        if resume_run_id is None:
            machine = machine_facts(machine_label, store.machine_salt())
            run_id = store.start_run(command, arguments, host, suite_id, machine)
            store.add_hardware(run_id, hardware_rows(engines))
        else:
            run_id = resume_run_id
            store.reopen_run(run_id)
        closed = threading.Event()
        platforms = {row["platform"] for row in store.hardware_rows(run_id)}  # one row each, resumed or not
        for book in ceilings:
            book.load(store, run_id)

        def emit(result: Result | Control | Ceiling | PlatformStatus) -> None:
            if isinstance(result, PlatformStatus):
                with commit_lock:
                    if not closed.is_set() and result.platform not in platforms:
                        platforms.add(result.platform)
                        store.add_hardware(run_id, [platform_row(result)])
                return
            if isinstance(result, Control | Ceiling):
                with commit_lock:
                    if not closed.is_set():  # a late control or ceiling is not worth failing a body for
                        (store.add_control if isinstance(result, Control) else store.add_ceiling)(run_id, result)
                return
            result.details.setdefault("load_avg_at_run_start", host["load_avg_at_start"])
            with commit_lock:
                if closed.is_set():  # a body's thread outlived the run: never write into a closed run
                    raise StoreError(f"run {run_id} is closed; the result for {result.key} was not stored")
                result_id = store.add_result(run_id, result, host["git_sha"])
                counts[result.status] += 1
                if on_result is not None:
                    on_result(result, result_id)

        def close(status: str) -> None:
            with commit_lock:
                closed.set()
                try:
                    store.finish_run(run_id, status)
                finally:
                    store.close()

        try:
            for body in bodies:
                body(emit)
        except StoreWriteError as failed:  # a full disk: marking the run is one small write that may still fit
            try:
                close("interrupted")
            except StoreWriteError:
                failed.args = (f"{failed}; the run could not be marked interrupted either and stays running",)
            raise
        except BaseException:
            close("interrupted")
            raise
        close("completed")
    summary = RunSummary(run_id, Path(db_path), dict(counts))
    if outputs is not None:
        summary.write_reports(lambda: write_outputs(Path(db_path), run_id, outputs), outputs.directory)
    return summary


def resume_point(db_path: Path, command: str, arguments: dict[str, Any], plans: list[Any]) -> str | None:
    """--resume for native/web/run: the latest run of this command with the same arguments, if it did
    not complete; each plan then skips the result keys that run holds (plan.done). None: start anew."""
    if not Path(db_path).exists():
        return None
    with open_store(Path(db_path), read_only=True) as store:
        run_id = store.unfinished_run_like(command, arguments)
        done = frozenset(store.result_keys(run_id)) if run_id else frozenset()
    for plan in plans:
        plan.done = done
    return run_id
