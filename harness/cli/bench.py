"""The commands that benchmark: native, web and run (both halves as one run). They parse, validate and
call the API; no benchmarking logic lives here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from harness.browser.run import LAUNCH, WebRequest
from harness.browser.serve import SERVING, ServeRequest, ServeSwitch
from harness.cli.common import (
    console,
    errors,
    fail,
    given,
    request_values,
    with_options,
)
from harness.cli.progress import print_summary, run_with_progress
from harness.cli.stops import interrupted, stopped
from harness.core.options import Shared, check, declared
from harness.run.native import run_native
from harness.run.plan import BenchmarkRequest, RequestError, RunOptions, validate
from harness.run.recording import resume_point
from harness.store import StoreError, StoreWriteError

# The run options every benchmark command takes: each field of harness.run.plan.RunOptions (flag, help, bound
# and choices written there once), in field order. A field added there is an option of native, web and run.
SHARED = tuple(declared(RunOptions))
NATIVE = ("hardware", "engines", "native_threads")  # BenchmarkRequest's own
RESUME = ("resume",)  # every benchmark command's (and suite's) --resume: harness.core.options.Shared's
# WebRequest's own: how the browser is launched or reached, on `web` and `run` alike (--hardware is the browser
# EPs: `web --hardware`, `run --web-hardware`)
BROWSER = LAUNCH


def pick(options: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: options[name] for name in names}


def shared_values(ctx: typer.Context, options: dict[str, Any]) -> dict[str, Any]:
    """The run options, parsed (--new-tokens without generate is refused: it would do nothing)."""
    values = request_values(BenchmarkRequest, pick(options, SHARED))
    if "generate" not in values["modes"] and given(ctx, "new_tokens"):
        modes = ",".join(values["modes"])
        raise fail(f"--new-tokens applies to --mode generate only (got --mode {modes}); add generate or drop it")
    return values


@with_options(BenchmarkRequest, NATIVE + SHARED)
@with_options(Shared, RESUME)
def native(ctx: typer.Context, *, resume: bool, **options: Any) -> None:
    """Benchmark models on native backends (torch, ONNX Runtime, OpenVINO)."""
    request = BenchmarkRequest(**request_values(BenchmarkRequest, pick(options, NATIVE)), **shared_values(ctx, options))
    try:
        plan = validate(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(request.db_path, "native", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_native(request, on_result, plan, run_id))


@with_options(ServeRequest, SERVING)
@with_options(WebRequest, ("hardware", "runtimes", *SHARED, *BROWSER))
@with_options(Shared, RESUME)
@with_options(ServeSwitch)
def web(ctx: typer.Context, *, serve: bool, resume: bool, **options: Any) -> None:
    """Benchmark the same ONNX files and inputs in Chromium via onnxruntime-web (wasm, webgpu, webnn): launched
    here (headless, or --headed; --gpu profile), remote (--browser-endpoint), or in any browser that opens the
    URL --serve prints."""
    from harness.browser.execute import run_web
    from harness.browser.run import validate_web

    page = request_values(WebRequest, pick(options, ("hardware", "runtimes")))
    hardware = page["hardware"]
    shared = shared_values(ctx, options)
    serving = given(ctx, *SERVING)
    if not serve and serving:
        raise fail(f"{', '.join(serving)}: options of --serve; add --serve or drop them")
    if serve:
        if given(ctx, "runtimes", "webllm_model"):
            raise fail("--runtimes, --webllm-model: a served device runs the page's own loop (onnxruntime-web) only; "
                       "run the other page runtimes in a launched or remote browser (web without --serve)")  # fmt: skip
        launch = given(ctx, *LAUNCH)
        if launch:
            raise fail(
                f"{', '.join(launch)}: these say how the harness launches or reaches a browser; with --serve each "
                "device brings its own (wasm runs at 1 thread and at the device's core count, WebNN at every "
                "device type)"
            )
        served = ServeRequest(hardware=hardware, **request_values(ServeRequest, pick(options, SERVING)), **shared)
        serve_devices(served, resume)
        return
    request = WebRequest(**page, **browser_values(ctx, options, hardware), **shared)
    try:
        plan = validate_web(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(request.db_path, "web", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_web(request, on_result, plan, resume_run_id=run_id))


def serve_devices(request: Any, resume: bool) -> None:
    """web --serve: validate, print the URL, serve until the run ends, then the summary."""
    from harness.browser.serve import COMMAND, ServeIncomplete, run_serve, validate_serve
    from harness.cli.serve import ServeDisplay

    try:
        plan = validate_serve(request)
    except RequestError as exc:
        raise fail(str(exc)) from None

    def left() -> str:
        return f"it holds {len(plan.done)} results; a device that comes back gets only the jobs it lacks"

    run_id = resumed(request.db_path, COMMAND, asdict(request), [plan], left) if resume else None
    display = ServeDisplay(request)
    try:
        summary = run_serve(request, display.on_result, plan, run_id, display.on_ready, display.on_event)
    except ServeIncomplete as exc:
        errors.print(f"[red]stopped:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except StoreWriteError as exc:  # a full disk: the run stopped, the answers so far are kept
        raise stopped(exc) from None
    except StoreError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        raise interrupted() from None
    print_summary(summary, display.rows)


@with_options(WebRequest, BROWSER)
@with_options(WebRequest, ("hardware", "runtimes"), prefix="web")
@with_options(BenchmarkRequest, NATIVE + SHARED)
@with_options(Shared, RESUME)
def run(ctx: typer.Context, *, resume: bool, **options: Any) -> None:
    """Native backends and the browser as one run: one report with both side by side."""
    from harness.browser.both import both_arguments, native_beside, run_both
    from harness.browser.run import validate_web

    shared = shared_values(ctx, options)
    native_request = BenchmarkRequest(**request_values(BenchmarkRequest, pick(options, NATIVE)), **shared)
    page = request_values(WebRequest, pick(options, ("web_hardware", "web_runtimes")), prefix="web")
    hardware = page["hardware"]
    web_request = WebRequest(**page, **browser_values(ctx, options, hardware, "web"), **shared)
    native_request = native_beside(native_request, web_request)
    try:  # the browser EPs and runtimes named by this command's flags, then each half as its own command checks it
        check(web_request, {name: declared(WebRequest)[name].prefixed("web") for name in ("hardware", "runtimes")})
        plans = (validate(native_request), validate_web(web_request))
    except RequestError as exc:
        raise fail(str(exc)) from None
    arguments = both_arguments(native_request, web_request)
    run_id = resumed(native_request.db_path, "run", arguments, list(plans)) if resume else None
    total = sum(p.total_results for p in plans)
    run_with_progress(total, lambda on_result: run_both(native_request, web_request, on_result, plans, run_id))


def browser_values(
    ctx: typer.Context, options: dict[str, Any], web_hardware: list[str], prefix: str | None = None
) -> dict[str, Any]:
    """How `web` and `run` launch (or reach) the browser, parsed: an option that would do nothing with the
    EPs chosen (their flag: `prefix`ed in `run`) is refused (--webnn-device without webnn; several --threads
    counts without wasm)."""
    values = request_values(WebRequest, pick(options, BROWSER))
    if "webnn" not in web_hardware and given(ctx, "webnn_device"):
        flag = declared(WebRequest)["hardware"].prefixed(prefix).flag
        raise fail(f"--webnn-device applies to webnn only (got {flag} {','.join(web_hardware)}); add webnn or drop it")
    threads = values["threads"]
    if len(set(threads)) > 1 and "wasm" not in web_hardware:
        raise fail(f"several --threads counts ({','.join(map(str, threads))}) need wasm in the web hardware "
                   "(webgpu/webnn run the first)")  # fmt: skip
    return values


def resumed(db: Path, command: str, arguments: dict, plans: list, left: Callable[[], str] | None = None) -> str | None:
    """--resume: the unfinished run to continue (its results are skipped), or None with a note. left() says
    what remains (by default: the plans' results still to run)."""
    try:
        run_id = resume_point(db, command, arguments, plans)
    except StoreError as exc:
        raise fail(str(exc)) from None
    if run_id is None:
        console.print(f"--resume: no unfinished '{command}' run with these options in {db}; starting a new run")
    else:
        remaining = left() if left else f"{sum(p.total_results for p in plans)} results still to run"
        console.print(f"--resume: continuing run {run_id}; {remaining}")
    return run_id
