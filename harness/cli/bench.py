"""The commands that benchmark: native, web and run (both halves as one run). They parse, validate and
call the API; no benchmarking logic lives here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from harness.cli.common import (
    BatchOption,
    DbOption,
    FamiliesOption,
    IterationsOption,
    MachineLabelOption,
    MaxIterationsOption,
    MaxTimeOption,
    MinDurationOption,
    MinIterationsOption,
    ModelOption,
    ModelPathOption,
    OutputDirOption,
    ProfileOption,
    ResumeOption,
    SeqOption,
    SmallOption,
    TimeoutOption,
    WarmupOption,
    console,
    errors,
    fail,
    given,
    int_list,
    split_list,
)
from harness.cli.progress import print_summary, run_with_progress
from harness.cli.stops import interrupted, stopped
from harness.core.bounds import MAX_DEVICES
from harness.native import DEFAULT_ENGINES, ENGINES
from harness.run.native import run_native
from harness.run.plan import DEFAULT_MAX_TIME_S, BenchmarkRequest, RequestError, validate
from harness.run.recording import resume_point
from harness.run.serve import DEFAULT_MAX_DEVICES
from harness.store import DEFAULT_DB, StoreError, StoreWriteError
from harness.web.eps import WEB_HARDWARE, WEBNN_DEVICES

WEB_EPS = ",".join(WEB_HARDWARE)
# How the browser is launched (or reached): the same options on `web` and `run`.
GpuOption = Annotated[
    str,
    typer.Option(
        "--gpu",
        help="Browser GPU profile: on (real WebGPU: Vulkan/ANGLE on Linux, D3D12/Metal elsewhere, no "
        "--disable-gpu), off (software rendering), auto (on where the host shows a GPU). Recorded per row.",
    ),
]
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
ThreadsOption = Annotated[
    str, typer.Option("--threads", help="Comma-separated wasm thread counts (webgpu/webnn use the first).")
]
WebPrecisionOption = Annotated[
    str,
    typer.Option(
        "--precision",
        help="Comma-separated: fp32, fp16 (webgpu needs the adapter's shader-f16), int8; the converted ONNX "
        "files native ONNX Runtime runs. Each row records the precision that ran.",
    ),
]

WebModeOption = Annotated[
    str,
    typer.Option(
        "--mode",
        help="Comma-separated: inference, generate (greedy decoding on the export with past key/values: "
        "GPT-2, LLaMA, Qwen2, an .onnx with past inputs; TTFT, pp and tg tokens/s, token parity with native ORT).",
    ),
]
NewTokensOption = Annotated[
    int, typer.Option("--new-tokens", help="--mode generate only: tokens per sequence (exactly; EOS ignored).")
]


def native(
    ctx: typer.Context,
    model: ModelOption = None,
    model_families: FamiliesOption = None,
    small_models: SmallOption = False,
    model_path: ModelPathOption = None,
    hardware: Annotated[
        str | None, typer.Option(help="cpu,cuda,rocm,mps,openvino,qnn,directml (default: available)")
    ] = None,
    engines: Annotated[
        str | None, typer.Option(help=f"{','.join(ENGINES)} (default: {','.join(DEFAULT_ENGINES)})")
    ] = None,
    batch_sizes: BatchOption = "1",
    sequence_lengths: SeqOption = "32",
    precision: Annotated[
        str,
        typer.Option(
            help="Comma-separated: fp32 (forced everywhere), fp16, bf16, int8 (dynamic quantization), "
            "auto (engine default). Each row records the precision that ran."
        ),
    ] = "fp32",
    mode: Annotated[
        str, typer.Option(help="inference, generate (TTFT/TPOT; torch, ORT for GPT-2/LLaMA/Qwen2), training (torch).")
    ] = "inference",
    new_tokens: NewTokensOption = BenchmarkRequest.new_tokens,
    warmup: WarmupOption = 5,
    iterations: IterationsOption = 20,
    min_duration: MinDurationOption = 0.5,
    max_iterations: MaxIterationsOption = 10_000,
    max_time: MaxTimeOption = DEFAULT_MAX_TIME_S,
    min_iterations: MinIterationsOption = 3,
    timeout: TimeoutOption = 300.0,
    profile: ProfileOption = False,
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    resume: ResumeOption = False,
    machine_label: MachineLabelOption = None,
) -> None:
    """Benchmark models on native backends (torch, ONNX Runtime, OpenVINO)."""
    shared = run_options(model, model_families, small_models, model_path, batch_sizes, sequence_lengths,
                         warmup, iterations, min_duration, max_iterations, max_time, min_iterations, timeout, db,
                         output_dir, profile, machine_label) | mode_options(ctx, mode, new_tokens)  # fmt: skip
    request = BenchmarkRequest(hardware=split_list(hardware), engines=split_list(engines), precision=precision,
                               **shared)  # fmt: skip
    try:
        plan = validate(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(db, "native", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_native(request, on_result, plan, run_id))


def web(
    ctx: typer.Context,
    browser: BrowserOption = "chromium",
    browser_path: BrowserPathOption = None,
    hardware: Annotated[str, typer.Option(help=f"Comma-separated: {WEB_EPS}.")] = WEB_EPS,
    model: ModelOption = None,
    model_families: FamiliesOption = None,
    small_models: SmallOption = False,
    model_path: ModelPathOption = None,
    batch_sizes: BatchOption = "1",
    sequence_lengths: SeqOption = "32",
    threads: ThreadsOption = "1",
    webnn_device: Annotated[str, typer.Option(help=f"WebNN deviceType: {', '.join(WEBNN_DEVICES)}.")] = "gpu",
    precision: WebPrecisionOption = "fp32",
    mode: WebModeOption = "inference",
    new_tokens: NewTokensOption = BenchmarkRequest.new_tokens,
    gpu: GpuOption = "auto",
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
    warmup: WarmupOption = 5,
    iterations: IterationsOption = 20,
    min_duration: MinDurationOption = 0.5,
    max_iterations: MaxIterationsOption = 10_000,
    max_time: MaxTimeOption = DEFAULT_MAX_TIME_S,
    min_iterations: MinIterationsOption = 3,
    timeout: TimeoutOption = 300.0,
    profile: ProfileOption = False,
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    resume: ResumeOption = False,
    machine_label: MachineLabelOption = None,
) -> None:
    """Benchmark the same ONNX files and inputs in Chromium via onnxruntime-web (wasm, webgpu, webnn): launched
    here (headless, or --headed; --gpu profile), remote (--browser-endpoint), or in any browser that opens the
    URL --serve prints."""
    from harness.run.web import WebRequest, run_web, validate_web

    if "webnn" not in (split_list(hardware) or []) and given(ctx, "webnn_device"):
        raise fail(f"--webnn-device applies to webnn only (got --hardware {hardware}); add webnn or drop it")
    shared = run_options(model, model_families, small_models, model_path, batch_sizes, sequence_lengths,
                         warmup, iterations, min_duration, max_iterations, max_time, min_iterations, timeout, db,
                         output_dir, profile, machine_label) | mode_options(ctx, mode, new_tokens)  # fmt: skip
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
        from harness.run.serve import ServeRequest

        served = ServeRequest(hardware=split_list(hardware) or [], precision=precision, host=host, port=port,
                              devices=devices, max_devices=max_devices, serve_timeout_s=serve_timeout,
                              certfile=certfile, keyfile=keyfile,
                              **shared)  # fmt: skip
        serve_devices(served, resume)
        return
    request = WebRequest(
        hardware=split_list(hardware) or [],
        webnn_device=webnn_device,
        precision=precision,
        **browser_options(
            browser, browser_path, threads, hardware, gpu, headed, browser_arg, require_hardware_gpu, browser_endpoint
        ),
        **shared,
    )
    try:
        plan = validate_web(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(db, "web", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_web(request, on_result, plan, resume_run_id=run_id))


# web's options that launch or reach a browser: with --serve, the devices bring their own
LAUNCH_OPTIONS = ("browser", "browser_path", "threads", "webnn_device", "gpu", "headed", "browser_arg",
                  "require_hardware_gpu", "browser_endpoint")  # fmt: skip


def serve_devices(request: Any, resume: bool) -> None:
    """web --serve: validate, print the URL, serve until the run ends, then the summary."""
    from harness.cli.serve import ServeDisplay
    from harness.run.serve import COMMAND, ServeIncomplete, run_serve, validate_serve

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


def run(
    ctx: typer.Context,
    model: ModelOption = None,
    model_families: FamiliesOption = None,
    small_models: SmallOption = False,
    model_path: ModelPathOption = None,
    hardware: Annotated[str | None, typer.Option(help="Native hardware (default: every available).")] = None,
    web_hardware: Annotated[str, typer.Option(help=f"Browser EPs: {WEB_EPS}.")] = WEB_EPS,
    browser: BrowserOption = "chromium",
    browser_path: BrowserPathOption = None,
    threads: ThreadsOption = "1",
    precision: Annotated[
        str, typer.Option(help="Comma-separated: fp32, fp16, bf16, int8, auto (native and browser halves).")
    ] = "fp32",
    mode: WebModeOption = "inference",
    new_tokens: NewTokensOption = BenchmarkRequest.new_tokens,
    gpu: GpuOption = "auto",
    headed: HeadedOption = False,
    browser_arg: BrowserArgOption = None,
    require_hardware_gpu: RequireGpuOption = False,
    browser_endpoint: EndpointOption = None,
    batch_sizes: BatchOption = "1",
    sequence_lengths: SeqOption = "32",
    warmup: WarmupOption = 5,
    iterations: IterationsOption = 20,
    min_duration: MinDurationOption = 0.5,
    max_iterations: MaxIterationsOption = 10_000,
    max_time: MaxTimeOption = DEFAULT_MAX_TIME_S,
    min_iterations: MinIterationsOption = 3,
    timeout: TimeoutOption = 300.0,
    profile: ProfileOption = False,
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    resume: ResumeOption = False,
    machine_label: MachineLabelOption = None,
) -> None:
    """Native backends and the browser as one run: one report with both side by side."""
    from harness.run.both import both_arguments, run_both
    from harness.run.web import WebRequest, validate_web

    shared = run_options(model, model_families, small_models, model_path, batch_sizes, sequence_lengths,
                         warmup, iterations, min_duration, max_iterations, max_time, min_iterations, timeout, db,
                         output_dir, profile, machine_label) | mode_options(ctx, mode, new_tokens)  # fmt: skip
    native_request = BenchmarkRequest(hardware=split_list(hardware), precision=precision, **shared)
    web_request = WebRequest(
        hardware=split_list(web_hardware) or [],
        precision=precision,
        **browser_options(
            browser,
            browser_path,
            threads,
            web_hardware,
            gpu,
            headed,
            browser_arg,
            require_hardware_gpu,
            browser_endpoint,
        ),
        **shared,
    )
    try:
        plans = (validate(native_request), validate_web(web_request))
    except RequestError as exc:
        raise fail(str(exc)) from None
    arguments = both_arguments(native_request, web_request)
    run_id = resumed(db, "run", arguments, list(plans)) if resume else None
    total = sum(p.total_results for p in plans)
    run_with_progress(total, lambda on_result: run_both(native_request, web_request, on_result, plans, run_id))


def mode_options(ctx: typer.Context, mode: str, new_tokens: int) -> dict[str, Any]:
    """--mode and --new-tokens, parsed (--new-tokens without generate is refused: it would do nothing)."""
    modes = split_list(mode) or ["inference"]
    if "generate" not in modes and given(ctx, "new_tokens"):
        raise fail(f"--new-tokens applies to --mode generate only (got --mode {mode}); add generate or drop it")
    return {"modes": modes, "new_tokens": new_tokens}


def run_options(
    model: str | None,
    model_families: str | None,
    small_models: bool,
    model_path: Path | None,
    batch_sizes: str,
    sequence_lengths: str,
    warmup: int,
    iterations: int,
    min_duration: float,
    max_iterations: int,
    max_time: float,
    min_iterations: int,
    timeout: float,
    db: Path,
    output_dir: Path,
    profile: bool,
    machine_label: str | None = None,
) -> dict[str, Any]:
    """The RunOptions every benchmark command takes (the model selection, cases, stop rule, store), parsed."""
    return {
        "models": split_list(model),
        "model_families": split_list(model_families),
        "small_models": small_models,
        "model_path": model_path,
        "batch_sizes": int_list("--batch-sizes", batch_sizes),
        "sequence_lengths": int_list("--sequence-lengths", sequence_lengths),
        "warmup": warmup,
        "iterations": iterations,
        "min_duration_s": min_duration,
        "max_iterations": max_iterations,
        "max_time_s": max_time or None,  # 0: no budget
        "min_iterations": min_iterations,
        "timeout_s": timeout,
        "db_path": db,
        "output_dir": output_dir,
        "profile": profile,
        "machine_label": machine_label,
    }


def browser_options(
    browser: str,
    browser_path: Path | None,
    threads: str,
    web_hardware: str,
    gpu: str,
    headed: bool,
    browser_arg: list[str] | None,
    require_hardware_gpu: bool,
    browser_endpoint: str | None,
) -> dict[str, Any]:
    """How `web` and `run` launch (or reach) the browser, parsed."""
    return {
        "browser": browser,
        "browser_path": browser_path,
        "threads": thread_counts(threads, web_hardware),
        "gpu": gpu,
        "headed": headed,
        "browser_args": browser_arg or [],
        "require_hardware_gpu": require_hardware_gpu,
        "browser_endpoint": browser_endpoint,
    }


def thread_counts(threads: str, web_hardware: str) -> list[int]:
    """--threads: each count is a wasm setting; webgpu and webnn run the first one only (their wasm fallback)."""
    counts = int_list("--threads", threads)
    if len(set(counts)) > 1 and "wasm" not in (split_list(web_hardware) or []):
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
