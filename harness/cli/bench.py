"""The commands that benchmark: native, web and run (both halves as one run). They parse, validate and
call the API; no benchmarking logic lives here."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import (
    BatchOption,
    DbOption,
    FamiliesOption,
    IterationsOption,
    MaxIterationsOption,
    MinDurationOption,
    ModelOption,
    ModelPathOption,
    OutputDirOption,
    ResumeOption,
    SeqOption,
    SmallOption,
    TimeoutOption,
    WarmupOption,
    console,
    fail,
    given,
    int_list,
    split_list,
)
from harness.cli.progress import run_with_progress
from harness.run.native import run_native
from harness.run.plan import BenchmarkRequest, RequestError, validate
from harness.run.recording import resume_point
from harness.store import DEFAULT_DB, StoreError
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
WebPrecisionOption = Annotated[
    str,
    typer.Option(
        "--precision",
        help="Comma-separated: fp32, fp16 (webgpu needs the adapter's shader-f16), int8; the converted ONNX "
        "files native ONNX Runtime runs. Each row records the precision that ran.",
    ),
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
    engines: Annotated[str | None, typer.Option(help="torch,onnxruntime,openvino,jax (default: all but jax)")] = None,
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
    new_tokens: Annotated[
        int, typer.Option(help="--mode generate only: tokens per sequence (min = max).")
    ] = BenchmarkRequest.new_tokens,
    warmup: WarmupOption = 5,
    iterations: IterationsOption = 20,
    min_duration: MinDurationOption = 0.5,
    max_iterations: MaxIterationsOption = 10_000,
    timeout: TimeoutOption = 300.0,
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    resume: ResumeOption = False,
) -> None:
    """Benchmark models on native backends (torch, ONNX Runtime, OpenVINO)."""
    modes = split_list(mode) or ["inference"]
    if "generate" not in modes and given(ctx, "new_tokens"):
        raise fail(f"--new-tokens applies to --mode generate only (got --mode {mode}); add generate or drop it")
    request = BenchmarkRequest(
        models=split_list(model),
        model_families=split_list(model_families),
        small_models=small_models,
        model_path=model_path,
        hardware=split_list(hardware),
        engines=split_list(engines),
        batch_sizes=int_list("--batch-sizes", batch_sizes),
        sequence_lengths=int_list("--sequence-lengths", sequence_lengths),
        precision=precision,
        modes=modes,
        new_tokens=new_tokens,
        warmup=warmup,
        iterations=iterations,
        min_duration_s=min_duration,
        max_iterations=max_iterations,
        timeout_s=timeout,
        db_path=db,
        output_dir=output_dir,
    )
    try:
        plan = validate(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(db, "native", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_native(request, on_result, plan, run_id))


def web(
    ctx: typer.Context,
    browser: Annotated[str, typer.Option(help="chrome, chromium or edge (chrome/edge fall back to Chromium).")] = (
        "chromium"
    ),
    browser_path: Annotated[Path | None, typer.Option(help="The browser executable to use instead.")] = None,
    hardware: Annotated[str, typer.Option(help=f"Comma-separated: {WEB_EPS}.")] = WEB_EPS,
    model: ModelOption = None,
    model_families: FamiliesOption = None,
    small_models: SmallOption = False,
    model_path: ModelPathOption = None,
    batch_sizes: BatchOption = "1",
    sequence_lengths: SeqOption = "32",
    threads: Annotated[
        str, typer.Option(help="Comma-separated wasm thread counts (webgpu/webnn use the first).")
    ] = "1",
    webnn_device: Annotated[str, typer.Option(help=f"WebNN deviceType: {', '.join(WEBNN_DEVICES)}.")] = "gpu",
    precision: WebPrecisionOption = "fp32",
    gpu: GpuOption = "auto",
    headed: HeadedOption = False,
    browser_arg: BrowserArgOption = None,
    require_hardware_gpu: RequireGpuOption = False,
    browser_endpoint: EndpointOption = None,
    warmup: WarmupOption = 5,
    iterations: IterationsOption = 20,
    min_duration: MinDurationOption = 0.5,
    max_iterations: MaxIterationsOption = 10_000,
    timeout: TimeoutOption = 300.0,
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    resume: ResumeOption = False,
) -> None:
    """Benchmark the same ONNX files and inputs in Chromium via onnxruntime-web (wasm, webgpu, webnn): launched
    here (headless, or --headed; --gpu profile) or remote (--browser-endpoint)."""
    from harness.run.web import WebRequest, run_web, validate_web

    if "webnn" not in (split_list(hardware) or []) and given(ctx, "webnn_device"):
        raise fail(f"--webnn-device applies to webnn only (got --hardware {hardware}); add webnn or drop it")
    request = WebRequest(
        models=split_list(model),
        model_families=split_list(model_families),
        small_models=small_models,
        model_path=model_path,
        hardware=split_list(hardware) or [],
        browser=browser,
        browser_path=browser_path,
        threads=thread_counts(threads, hardware),
        webnn_device=webnn_device,
        precision=precision,
        gpu=gpu,
        headed=headed,
        browser_args=browser_arg or [],
        require_hardware_gpu=require_hardware_gpu,
        browser_endpoint=browser_endpoint,
        batch_sizes=int_list("--batch-sizes", batch_sizes),
        sequence_lengths=int_list("--sequence-lengths", sequence_lengths),
        warmup=warmup,
        iterations=iterations,
        min_duration_s=min_duration,
        max_iterations=max_iterations,
        timeout_s=timeout,
        db_path=db,
        output_dir=output_dir,
    )
    try:
        plan = validate_web(request)
    except RequestError as exc:
        raise fail(str(exc)) from None
    run_id = resumed(db, "web", asdict(request), [plan]) if resume else None
    run_with_progress(plan.total_results, lambda on_result: run_web(request, on_result, plan, resume_run_id=run_id))


def run(
    model: ModelOption = None,
    model_families: FamiliesOption = None,
    small_models: SmallOption = False,
    hardware: Annotated[str | None, typer.Option(help="Native hardware (default: every available).")] = None,
    web_hardware: Annotated[str, typer.Option(help=f"Browser EPs: {WEB_EPS}.")] = WEB_EPS,
    browser: Annotated[str, typer.Option(help="chrome, chromium or edge.")] = "chromium",
    threads: Annotated[str, typer.Option(help="wasm thread counts.")] = "1",
    precision: Annotated[
        str, typer.Option(help="Comma-separated: fp32, fp16, bf16, int8, auto (native and browser halves).")
    ] = "fp32",
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
    timeout: TimeoutOption = 300.0,
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    resume: ResumeOption = False,
) -> None:
    """Native backends and the browser as one run: one report with both side by side."""
    from harness.run.both import both_arguments, run_both
    from harness.run.web import WebRequest, validate_web

    common = {
        "models": split_list(model),
        "model_families": split_list(model_families),
        "small_models": small_models,
        "batch_sizes": int_list("--batch-sizes", batch_sizes),
        "sequence_lengths": int_list("--sequence-lengths", sequence_lengths),
        "warmup": warmup,
        "iterations": iterations,
        "min_duration_s": min_duration,
        "timeout_s": timeout,
        "db_path": db,
        "output_dir": output_dir,
        "precision": precision,
    }
    native_request = BenchmarkRequest(hardware=split_list(hardware), **common)
    web_request = WebRequest(
        hardware=split_list(web_hardware) or [],
        browser=browser,
        threads=thread_counts(threads, web_hardware),
        gpu=gpu,
        headed=headed,
        browser_args=browser_arg or [],
        require_hardware_gpu=require_hardware_gpu,
        browser_endpoint=browser_endpoint,
        **common,
    )
    try:
        plans = (validate(native_request), validate_web(web_request))
    except RequestError as exc:
        raise fail(str(exc)) from None
    arguments = both_arguments(native_request, web_request)
    run_id = resumed(db, "run", arguments, list(plans)) if resume else None
    total = sum(p.total_results for p in plans)
    run_with_progress(total, lambda on_result: run_both(native_request, web_request, on_result, plans, run_id))


def thread_counts(threads: str, web_hardware: str) -> list[int]:
    """--threads: each count is a wasm setting; webgpu and webnn run the first one only (their wasm fallback)."""
    counts = int_list("--threads", threads)
    if len(set(counts)) > 1 and "wasm" not in (split_list(web_hardware) or []):
        raise fail(f"several --threads counts ({threads}) need wasm in the web hardware (webgpu/webnn run the first)")
    return counts


def resumed(db: Path, command: str, arguments: dict, plans: list) -> str | None:
    """--resume: the unfinished run to continue (its results are skipped), or None with a note."""
    try:
        run_id = resume_point(db, command, arguments, plans)
    except StoreError as exc:
        raise fail(str(exc)) from None
    if run_id is None:
        console.print(f"--resume: no unfinished '{command}' run with these options in {db}; starting a new run")
    else:
        console.print(f"--resume: continuing run {run_id}; {sum(p.total_results for p in plans)} results still to run")
    return run_id
