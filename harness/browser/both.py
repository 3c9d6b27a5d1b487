"""`accelharness run`: native backends, then the browser, as one run with one report.

from harness.browser.both import run_both
summary = run_both(BenchmarkRequest(models=["bert-tiny"], hardware=["cpu"]), WebRequest(models=["bert-tiny"]))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from harness.browser.run import WebPlan, WebRequest, execute_web, validate_web
from harness.core.records import Result
from harness.run.native import execute_native
from harness.run.plan import BenchmarkRequest, Plan, validate
from harness.run.recording import RunSummary, record_run


def run_both(
    native: BenchmarkRequest,
    web: WebRequest,
    on_result: Callable[[Result, str], None] | None = None,
    plans: tuple[Plan, WebPlan] | None = None,
    resume_run_id: str | None = None,
) -> RunSummary:
    """Native backends then the browser, as one run: one report puts their rows side by side.

    Both requests are validated before anything is written (unless their plans are given)."""
    native_plan, web_plan = plans or (validate(native), validate_web(web))
    bodies = [execute_native(native_plan), execute_web(web_plan)]
    arguments = both_arguments(native, web)
    return record_run(
        native.db_path, "run", arguments, bodies, on_result, native.outputs, None, resume_run_id, native.machine_label
    )


def both_arguments(native: BenchmarkRequest, web: WebRequest) -> dict[str, Any]:
    """What a combined run stores as its arguments (and --resume matches against)."""
    return {"native": asdict(native), "web": asdict(web)}
