"""A suite on this machine: device groups side by side, each running its targets one after another.

The first failure, or Ctrl-C, stops every group: a stop is never recorded as an outcome.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from harness.browser.execute import execute_web
from harness.core.records import Result, Target
from harness.run.isolation import Stopped, stop_when
from harness.run.native import execute_native
from harness.run.recording import Body, Emit
from harness.suite.plan import WEB_TARGET_HARDWARE, SuitePlan


def _group_body(plan: SuitePlan, targets: list[Target]) -> Body:
    """One device group's work: its native targets, then (on the host group) the browser."""
    bodies = []
    if plan.native is not None:
        mine = [(t, a) for t, a in plan.native.targets if t in targets]
        if mine:
            bodies.append(execute_native(dataclasses.replace(plan.native, targets=mine)))
    if plan.web is not None and any(t.hardware in WEB_TARGET_HARDWARE for t in targets):
        bodies.append(execute_web(plan.web))

    def body(emit: Emit) -> None:
        for each in bodies:
            each(emit)

    return body


def _parallel(bodies: list[Body]) -> Body:
    """Run the groups' bodies side by side, each in its own thread.

    The first failure, or Ctrl-C, stops every group: their workers are killed, nothing more is
    recorded (a stop is never an outcome), and every thread is joined before the failure goes on,
    so the run is closed `interrupted` with no thread still writing, and --resume runs exactly the
    cases that have no row."""
    if len(bodies) == 1:
        return bodies[0]

    def body(emit: Emit) -> None:
        stop = threading.Event()

        def emit_until_stopped(result: Result) -> None:
            if stop.is_set():  # e.g. a browser the terminal's Ctrl-C also reached: not this case's outcome
                raise Stopped
            emit(result)

        def group(each: Body) -> None:
            with stop_when(stop):
                each(emit_until_stopped)

        pool = ThreadPoolExecutor(max_workers=len(bodies), thread_name_prefix="device-group")
        futures = [pool.submit(group, each) for each in bodies]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)  # Ctrl-C lands here, in the main thread
        finally:
            stop.set()
            _join(pool)
        failures = [f.exception() for f in futures if not isinstance(f.exception(), Stopped | None)]
        if failures:
            raise failures[0]  # type: ignore[misc]

    return body


def _join(pool: ThreadPoolExecutor) -> None:
    """Wait for every group's thread; a second Ctrl-C does not abandon them (they are already stopping)."""
    while True:
        try:
            pool.shutdown(wait=True)
            return
        except KeyboardInterrupt:
            continue


def local_body(plan: SuitePlan) -> Body:
    """The suite on this machine: each device group's work in its own thread (one group when the
    config says parallel = false)."""
    return _parallel([_group_body(plan, targets) for targets in plan.groups().values()])
