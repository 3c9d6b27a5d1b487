"""`accelharness`: parse, validate, call the API. No benchmarking logic lives here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from harness.api import BenchmarkRequest, RequestError, run_native, validate
from harness.cli_common import (
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
    app,
    console,
    db_app,
    errors,
    fail,
    given,
    int_list,
    split_list,
)
from harness.recording import RunSummary, resume_point
from harness.result import Result
from harness.store import DEFAULT_DB, StoreError, init_store
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


@app.command()
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


@app.command()
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
    from harness.web_api import WebRequest, run_web, validate_web

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


@app.command()
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
    from harness.web_api import WebRequest, both_arguments, run_both, validate_web

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


def run_with_progress(total: int, start: Callable[[Callable[[Result, str], None]], RunSummary]) -> RunSummary:
    """Run with a progress bar (ETA) fed by each committed result, then print the summary."""
    rows: list[Result] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("benchmarking", total=total)

        def on_result(result: Result, _result_id: str) -> None:
            rows.append(result)
            progress.update(task, advance=1, description=f"{result.model} {result.target.label}")
            if not console.is_terminal:  # logs and CI: a line per stored result instead of a live bar
                console.print(
                    f"[{len(rows)}/{total}] stored {result.model} {result.target.label} {result.case.key}: "
                    f"{result.status}",
                    highlight=False,
                )

        try:
            summary = start(on_result)
        except StoreError as exc:
            raise fail(str(exc)) from None
    console.print(summary_table(rows))
    console.print(f"run [bold]{summary.run_id}[/bold] → {summary.db_path}: {summary.counts}")
    for path in summary.reports:
        console.print(f"  report: {path}")
    if summary.report_error:
        errors.print(f"[red]error:[/red] {summary.report_error}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    return summary


def summary_table(rows: list[Result]) -> Table:
    from harness.report.data import flags
    from harness.stats import summarize

    table = Table(title="Results")
    for name in ("model", "target", "case", "status", "p50 ms", "items/s", "max |diff|", "note"):
        table.add_column(name, overflow="fold")
    for r in rows:
        s = summarize(r.samples_ms, r.case.batch_size)
        marked = {"status": r.status, "precision": r.precision, "requested_precision": r.case.precision}
        marked |= {"noisy": bool(s and s.noisy), "latency_cv": s.cv if s else None, "details": r.details}
        notes = flags(marked)  # the same warnings the reports put next to the number
        notes += [r.error.splitlines()[0][:100]] if r.error else []
        table.add_row(
            r.model,
            r.target.label,
            r.case.key,
            r.status,
            f"{s.median_ms:.3f}" if s else "—",
            f"{s.throughput_per_s:.1f}" if s and s.throughput_per_s is not None else "—",
            f"{r.max_abs_diff:.2g}" if r.max_abs_diff is not None else "—",
            "; ".join(notes),
        )
    return table


@app.command("hardware")
def hardware_command() -> None:
    """List every platform with available yes/no and the reason, plus CPU, memory and GPUs."""
    from harness.hardware import detect_platforms, hardware_rows
    from harness.provenance import host_facts

    host = host_facts()
    console.print(
        f"CPU: {host['cpu_model']} — {host['cpu_physical_cores']} cores / {host['cpu_cores']} threads; "
        f"memory {host['memory_gb']} GB"
    )
    gpus = {r["device_name"] for r in hardware_rows() if r["platform"] in ("cuda", "rocm") and r["device_name"]}
    console.print(f"GPUs: {', '.join(sorted(gpus)) or 'none detected'}")
    table = Table()
    for name in ("platform", "available", "reason"):
        table.add_column(name, overflow="fold")
    for status in detect_platforms():
        table.add_row(status.platform, "yes" if status.available else "no", status.reason)
    console.print(table)


ENGINE_STATUS_SQL = """
WITH latest AS (
    SELECT model, engine, results.status,
           dense_rank() OVER (PARTITION BY model, engine ORDER BY started_at DESC, run_id DESC) AS k
    FROM results JOIN runs USING (run_id))
SELECT model, engine, status, count(*) AS n FROM latest WHERE k = 1 GROUP BY ALL ORDER BY model, engine, status
"""


def engine_statuses(db: Path) -> dict[str, str]:
    """model → "engine: status×count …" from each engine's latest run of it; empty without a DB."""
    from harness.store import open_store

    if not db.exists():
        return {}
    with open_store(db, read_only=True) as store:
        rows = store.query(ENGINE_STATUS_SQL)
    cells: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        cells.setdefault(r["model"], {}).setdefault(r["engine"], []).append(f"{r['status']}×{r['n']}")
    return {m: "; ".join(f"{e}: {' '.join(s)}" for e, s in by_engine.items()) for m, by_engine in cells.items()}


@app.command()
def models(db: DbOption = DEFAULT_DB) -> None:
    """List the model specs: family, variant, architecture, inputs, parameters (counted on the meta
    device, nothing allocated) and, from --db if it exists, each engine's statuses in its latest run."""
    from harness.specs import load_specs
    from harness.workload import count_parameters

    try:
        statuses = engine_statuses(db)
    except StoreError as exc:
        raise fail(str(exc)) from None
    table = Table()
    for name in ("model", "family", "variant", "architecture", "inputs", "parameters"):
        table.add_column(name, no_wrap=True)
    table.add_column(f"engines ({db.name})", overflow="fold")
    for spec in sorted(load_specs().values(), key=lambda s: (s.family, s.name)):
        try:
            parameters = f"{count_parameters(spec):,}"
        except Exception as exc:  # a spec transformers cannot build: say so, list the rest
            parameters = f"cannot build: {exc}"[:80]
        row = (spec.name, spec.family, spec.variant, spec.architecture, spec.inputs.kind, parameters)
        table.add_row(*row, statuses.get(spec.name, "—"))
    console.print(table)


@db_app.command("init")
def db_init(
    db: DbOption = DEFAULT_DB,
    overwrite: Annotated[bool, typer.Option(help="Delete the existing file first.")] = False,
) -> None:
    """Create the schema (idempotent)."""
    try:
        init_store(db, overwrite)
    except StoreError as exc:
        raise fail(str(exc)) from None
    console.print(f"schema ready in {db}")


# The analysis and suite commands register themselves on the same app.
from harness import cli_analysis, cli_suite  # noqa: E402, F401

if __name__ == "__main__":
    app()
