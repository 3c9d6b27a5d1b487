"""The commands that benchmark: native, web and run (both halves as one run). They parse, validate and
call the API; no benchmarking logic lives here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from harness.browser.run import WebRequest
from harness.browser.serve import DEFAULT_MAX_DEVICES
from harness.cli.common import (
    ResumeOption,
    console,
    errors,
    fail,
    given,
    int_list,
    request_values,
    split_list,
    with_options,
)
from harness.cli.progress import print_summary, run_with_progress
from harness.cli.stops import interrupted, stopped
from harness.core.bounds import MAX_DEVICES
from harness.core.options import declared
from harness.run.native import run_native
from harness.run.plan import BenchmarkRequest, RequestError, RunOptions, validate
from harness.run.recording import resume_point
from harness.store import StoreError, StoreWriteError
from harness.web.eps import WEB_HARDWARE, WEBNN_DEVICES

WEB_EPS = ",".join(WEB_HARDWARE)
# The run options every benchmark command takes: each field of harness.run.plan.RunOptions (flag, help, bound
# and choices written there once), in field order. A field added there is an option of native, web and run.
SHARED = tuple(declared(RunOptions))
NATIVE = ("hardware", "engines", "native_threads")  # BenchmarkRequest's own
BROWSER = ("threads", "gpu")  # WebRequest's own, on `web` and `run`
# How the browser is launched (or reached): the same options on `web` and `run`.
HeadedOption = Annotated[
    bool,
    typer.Option("--headed", help="A headful browser (on Xvfb without a DISPLAY): where headless forces software."),
]
BrowserArgOption = Annotated[
    list[str] | None,
    typer.Option("--browser-arg", help="A raw browser flag appended to the launch (repeatable); recorded per row."),
]
RequireGpuOption = Annotated[
    bool,
    typer.Option(
        "--require-hardware-gpu",
        help="webgpu cases on a software adapter (SwiftShader, llvmpipe, WARP) are `unsupported`, not run.",
    ),
]
EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--browser-endpoint",
        help="A remote browser: ws://… (Playwright browser server) or http://HOST:PORT (Chromium with "
        "--remote-debugging-port). Everything reaches it through Playwright; no local port is opened.",
    ),
]
BrowserOption = Annotated[
    str, typer.Option("--browser", help="chrome, chromium or edge (chrome/edge fall back to Chromium).")
]
BrowserPathOption = Annotated[
    Path | None, typer.Option("--browser-path", help="The browser executable to use instead.")
]


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
def native(ctx: typer.Context, resume: ResumeOption = False, **options: Any) -> None:
    """Benchmark models on native backends (torch, ONNX Runtime, OpenVINO)."""
    request = BenchmarkRequest(**request_values(BenchmarkRequest, pick(options, NATIVE)), **shared_values(ctx, options))
    try:
        plan = validate(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(request.db_path, "native", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_native(request, on_result, plan, run_id))


@with_options(WebRequest, ("hardware", *SHARED, *BROWSER))
def web(
    ctx: typer.Context,
    browser: BrowserOption = "chromium",
    browser_path: BrowserPathOption = None,
    webnn_device: Annotated[str, typer.Option(help=f"WebNN deviceType: {', '.join(WEBNN_DEVICES)}.")] = "gpu",
    headed: HeadedOption = False,
    browser_arg: BrowserArgOption = None,
    require_hardware_gpu: RequireGpuOption = False,
    browser_endpoint: EndpointOption = None,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Serve the jobs to any browser that opens the printed URL (a phone, a laptop, another browser): "
            "each device becomes a target of the run. See the manual's \"Your users' devices\" (docs/devices.md).",
        ),
    ] = False,
    host: Annotated[
        str, typer.Option(help="--serve: the address to listen on; 0.0.0.0 or a LAN address reaches other devices.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="--serve: the port (0: a free one).")] = 0,
    devices: Annotated[
        int | None, typer.Option(help="--serve: stop once this many devices finished every job (default: Ctrl-C).")
    ] = None,
    max_devices: Annotated[
        int,
        typer.Option(
            help=f"--serve: the most devices this run takes (1 to {MAX_DEVICES}); one beyond them is refused."
        ),
    ] = DEFAULT_MAX_DEVICES,
    serve_timeout: Annotated[float | None, typer.Option(help="--serve: stop serving after this many seconds.")] = None,
    certfile: Annotated[
        Path | None, typer.Option(help="--serve: HTTPS certificate (PEM; self-signed works), with --keyfile.")
    ] = None,
    keyfile: Annotated[Path | None, typer.Option(help="--serve: the certificate's private key (PEM).")] = None,
    resume: ResumeOption = False,
    **options: Any,
) -> None:
    """Benchmark the same ONNX files and inputs in Chromium via onnxruntime-web (wasm, webgpu, webnn): launched
    here (headless, or --headed; --gpu profile), remote (--browser-endpoint), or in any browser that opens the
    URL --serve prints."""
    from harness.browser.run import run_web, validate_web

    hardware = split_list(options["hardware"]) or []
    if "webnn" not in hardware and given(ctx, "webnn_device"):
        raise fail(f"--webnn-device applies to webnn only (got --hardware {options['hardware']}); add webnn or drop it")
    shared = shared_values(ctx, options)
    serving = given(ctx, "host", "port", "devices", "max_devices", "serve_timeout", "certfile", "keyfile")
    if not serve and serving:
        raise fail(f"{', '.join(serving)}: options of --serve; add --serve or drop them")
    if serve:
        launch = given(ctx, *LAUNCH_OPTIONS)
        if launch:
            raise fail(
                f"{', '.join(launch)}: these say how the harness launches or reaches a browser; with --serve each "
                "device brings its own (wasm runs at 1 thread and at the device's core count, WebNN at every "
                "device type)"
            )
        from harness.browser.serve import ServeRequest

        served = ServeRequest(hardware=hardware, host=host, port=port, devices=devices, max_devices=max_devices,
                              serve_timeout_s=serve_timeout, certfile=certfile, keyfile=keyfile,
                              **shared)  # fmt: skip
        serve_devices(served, resume)
        return
    request = WebRequest(
        hardware=hardware,
        webnn_device=webnn_device,
        **browser_options(options, hardware, browser, browser_path, headed, browser_arg, require_hardware_gpu,
                          browser_endpoint),
        **shared,
    )  # fmt: skip
    try:
        plan = validate_web(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(request.db_path, "web", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_web(request, on_result, plan, resume_run_id=run_id))


# web's options that launch or reach a browser: with --serve, the devices bring their own
LAUNCH_OPTIONS = ("browser", "browser_path", "threads", "webnn_device", "gpu", "headed", "browser_arg",
                  "require_hardware_gpu", "browser_endpoint")  # fmt: skip


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
@with_options(BenchmarkRequest, NATIVE + SHARED)
def run(
    ctx: typer.Context,
    web_hardware: Annotated[str, typer.Option(help=f"Browser EPs: {WEB_EPS}.")] = WEB_EPS,
    browser: BrowserOption = "chromium",
    browser_path: BrowserPathOption = None,
    headed: HeadedOption = False,
    browser_arg: BrowserArgOption = None,
    require_hardware_gpu: RequireGpuOption = False,
    browser_endpoint: EndpointOption = None,
    resume: ResumeOption = False,
    **options: Any,
) -> None:
    """Native backends and the browser as one run: one report with both side by side."""
    from harness.browser.both import both_arguments, run_both
    from harness.browser.run import validate_web

    shared = shared_values(ctx, options)
    native_request = BenchmarkRequest(**request_values(BenchmarkRequest, pick(options, NATIVE)), **shared)
    hardware = split_list(web_hardware) or []
    web_request = WebRequest(
        hardware=hardware,
        **browser_options(options, hardware, browser, browser_path, headed, browser_arg, require_hardware_gpu,
                          browser_endpoint),
        **shared,
    )  # fmt: skip
    try:
        plans = (validate(native_request), validate_web(web_request))
    except RequestError as exc:
        raise fail(str(exc)) from None
    arguments = both_arguments(native_request, web_request)
    run_id = resumed(native_request.db_path, "run", arguments, list(plans)) if resume else None
    total = sum(p.total_results for p in plans)
    run_with_progress(total, lambda on_result: run_both(native_request, web_request, on_result, plans, run_id))


def browser_options(
    options: dict[str, Any],
    web_hardware: list[str],
    browser: str,
    browser_path: Path | None,
    headed: bool,
    browser_arg: list[str] | None,
    require_hardware_gpu: bool,
    browser_endpoint: str | None,
) -> dict[str, Any]:
    """How `web` and `run` launch (or reach) the browser, parsed."""
    return {
        "browser": browser,
        "browser_path": browser_path,
        "threads": thread_counts(options["threads"], web_hardware),
        "gpu": options["gpu"],
        "headed": headed,
        "browser_args": browser_arg or [],
        "require_hardware_gpu": require_hardware_gpu,
        "browser_endpoint": browser_endpoint,
    }


def thread_counts(threads: str, web_hardware: list[str]) -> list[int]:
    """--threads: each count is a wasm setting; webgpu and webnn run the first one only (their wasm fallback)."""
    counts = int_list("--threads", threads)
    if len(set(counts)) > 1 and "wasm" not in web_hardware:
        raise fail(f"several --threads counts ({threads}) need wasm in the web hardware (webgpu/webnn run the first)")
    return counts


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
