"""`accelharness web`'s run: the browsers' parts of a plan, one after the other: the Chromium family through
Playwright (harness.browser.run), then each browser launched outside it (harness.browser.launched: Firefox, Safari).

from harness.browser.execute import run_web
from harness.browser.run import WebRequest
summary = run_web(WebRequest(models=["bert-tiny"], hardware=["wasm"], threads=[1, 2], browsers=["chromium", "firefox"]))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict

from harness.browser.launched import run_launched
from harness.browser.run import WebPlan, WebRequest, prepare_spec, run_playwright, validate_web
from harness.core.records import Result
from harness.run.recording import Body, Emit, RunSummary, record_run


def execute_web(plan: WebPlan, faults: Mapping[str, str] | None = None) -> Body:
    """The browser part of a run, as a body for harness.run.recording.record_run."""

    def body(emit: Emit) -> None:
        from harness.web.driver import run_sync

        models = [prepare_spec(plan, spec) for spec in plan.specs if plan.has_work(spec)]
        if any(s.device is None for s in plan.settings):
            run_sync(run_playwright(plan, models, emit, faults or {}))
        for choice in plan.launched:  # Firefox, Safari: the served page, one browser after the other
            run_sync(run_launched(plan, choice, models, emit, faults or {}))

    return body


def run_web(
    request: WebRequest,
    on_result: Callable[[Result, str], None] | None = None,
    plan: WebPlan | None = None,
    faults: Mapping[str, str] | None = None,
    resume_run_id: str | None = None,
) -> RunSummary:
    """Benchmark the request in the browser; every result is committed as it completes.

    faults is test-only: {provider: 'throw' | 'hang' | 'stall' | 'kill'} makes that provider's page
    jobs fail on purpose so the recovery paths can be tested. Ctrl-C marks the run 'interrupted'.
    """
    plan = plan or validate_web(request)
    bodies = [execute_web(plan, faults)]
    return record_run(
        request.db_path,
        "web",
        asdict(request),
        bodies,
        on_result,
        request.outputs,
        None,
        resume_run_id,
        request.machine_label,
        ceilings=[plan.ceilings],
    )
