"""`accelharness run`: native backends, then the browser, as one run with one report.

from harness.browser.both import run_both
summary = run_both(BenchmarkRequest(models=["bert-tiny"], hardware=["cpu"]), WebRequest(models=["bert-tiny"]))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from harness.browser.execute import execute_web
from harness.browser.run import WebPlan, WebRequest, validate_web
from harness.core.records import Result
from harness.native import DEFAULT_ENGINES, ENGINES
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
    native = native_beside(native, web)
    native_plan, web_plan = plans or (validate(native), validate_web(web))
    bodies = [execute_native(native_plan), execute_web(web_plan)]
    arguments = both_arguments(native, web)
    return record_run(native.db_path, "run", arguments, bodies, on_result, native.outputs, None, resume_run_id,
                      native.machine_label, ceilings=[native_plan.ceilings, web_plan.ceilings])  # fmt: skip


def native_beside(native: BenchmarkRequest, web: WebRequest) -> BenchmarkRequest:
    """The native request of a run whose page runs a runtime that is also a native engine (llama.cpp: wllama in the
    page, its native build beside it): without --engines, the default engines and that one, so its page rows have
    their native counterpart on the same file in the same run (page ÷ native); named --engines are kept as given."""
    if native.engines is not None or (native.model_path is not None and Path(native.model_path).suffix == ".gguf"):
        return native  # named, or a GGUF's: the engines that run one (harness.run.plan.validate)
    also = [runtime for runtime in web.runtimes if runtime in ENGINES and runtime not in DEFAULT_ENGINES]
    return replace(native, engines=[*DEFAULT_ENGINES, *also]) if also else native


def both_arguments(native: BenchmarkRequest, web: WebRequest) -> dict[str, Any]:
    """What a combined run stores as its arguments (and --resume matches against)."""
    return {"native": asdict(native), "web": asdict(web)}
