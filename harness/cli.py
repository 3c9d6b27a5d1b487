"""`accelharness`: parse, validate, call the API. No benchmarking logic lives here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
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
from harness.result import Result
from harness.store import DEFAULT_DB, StoreError, init_store

app = typer.Typer(
    help="Measured ML inference benchmarks: native backends and the browser, one DuckDB store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Manage the DuckDB store.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()
if not console.is_terminal:  # logs and CI: rich would fold every table to 80 columns
    console.width = 160
errors = Console(stderr=True)

DbOption = Annotated[Path, typer.Option("--db", help="DuckDB file.")]


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit for bad input (code 2)."""
    errors.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def split_list(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def int_list(option: str, value: str) -> list[int]:
    try:
        return [int(v) for v in split_list(value) or []]
    except ValueError:
        raise fail(f"{option} takes comma-separated integers >= 1, e.g. 1,4 (got '{value}')") from None


@app.command()
def native(
    model: Annotated[str | None, typer.Option(help="Comma-separated model names (see `accelharness models`).")] = None,
    model_families: Annotated[
        str | None, typer.Option(help="embedding,text_generation,vision,audio,multimodal")
    ] = None,
    small_models: Annotated[bool, typer.Option(help="Use the tiny variant of each selected family.")] = False,
    model_path: Annotated[Path | None, typer.Option(help="A local HF model directory or an .onnx file.")] = None,
    hardware: Annotated[
        str | None, typer.Option(help="cpu,cuda,rocm,mps,openvino,qnn,directml (default: available)")
    ] = None,
    engines: Annotated[str | None, typer.Option(help="torch,onnxruntime,openvino (default: all)")] = None,
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1",
    sequence_lengths: Annotated[str, typer.Option(help="Comma-separated sequence lengths (text inputs).")] = "32",
    precision: Annotated[
        str, typer.Option(help="fp32 (forced everywhere) or auto (engine default, recorded).")
    ] = "fp32",
    warmup: Annotated[int, typer.Option(help="Untimed runs after the first run.")] = 5,
    iterations: Annotated[int, typer.Option(help="Minimum timed iterations.")] = 20,
    min_duration: Annotated[float, typer.Option(help="Minimum seconds of timed iterations.")] = 0.5,
    max_iterations: Annotated[int, typer.Option(help="Cap on timed iterations.")] = 10_000,
    timeout: Annotated[float, typer.Option(help="Seconds a worker may go without finishing a case.")] = 300.0,
    db: DbOption = DEFAULT_DB,
    output_dir: Annotated[Path, typer.Option(help="Where JSON/Markdown/CSV reports go.")] = Path(
        "accelharness-results"
    ),
) -> None:
    """Benchmark models on native backends (torch, ONNX Runtime, OpenVINO)."""
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
    rows: list[Result] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("benchmarking", total=plan.total_results)

        def on_result(result: Result, _result_id: str) -> None:
            rows.append(result)
            progress.update(task, advance=1, description=f"{result.model} {result.target.label}")

        try:
            summary = run_native(request, on_result=on_result, plan=plan)
        except StoreError as exc:
            raise fail(str(exc)) from None
    console.print(summary_table(rows))
    console.print(f"run [bold]{summary.run_id}[/bold] → {summary.db_path}: {summary.counts}")
    for path in summary.reports:
        console.print(f"  report: {path}")


@app.command()
def web(
    browser: Annotated[str, typer.Option(help="chrome, chromium or edge (chrome/edge fall back to Chromium).")] = (
        "chromium"
    ),
    browser_path: Annotated[Path | None, typer.Option(help="The browser executable to use instead.")] = None,
    hardware: Annotated[str, typer.Option(help="Comma-separated: wasm,webgpu,webnn.")] = "wasm,webgpu,webnn",
    model: Annotated[str | None, typer.Option(help="Comma-separated model names (see `accelharness models`).")] = None,
    model_families: Annotated[
        str | None, typer.Option(help="embedding,text_generation,vision,audio,multimodal")
    ] = None,
    small_models: Annotated[bool, typer.Option(help="Use the tiny variant of each selected family.")] = False,
    model_path: Annotated[Path | None, typer.Option(help="A local HF model directory or an .onnx file.")] = None,
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1",
    sequence_lengths: Annotated[str, typer.Option(help="Comma-separated sequence lengths (text inputs).")] = "32",
    threads: Annotated[
        str, typer.Option(help="Comma-separated wasm thread counts (webgpu/webnn use the first).")
    ] = "1",
    webnn_device: Annotated[str, typer.Option(help="WebNN deviceType: cpu, gpu or npu.")] = "gpu",
    warmup: Annotated[int, typer.Option(help="Untimed runs after the first run.")] = 5,
    iterations: Annotated[int, typer.Option(help="Minimum timed iterations.")] = 20,
    min_duration: Annotated[float, typer.Option(help="Minimum seconds of timed iterations.")] = 0.5,
    max_iterations: Annotated[int, typer.Option(help="Cap on timed iterations.")] = 10_000,
    timeout: Annotated[float, typer.Option(help="Seconds a page may go without finishing a case.")] = 300.0,
    db: DbOption = DEFAULT_DB,
    output_dir: Annotated[Path, typer.Option(help="Where JSON/Markdown/CSV reports go.")] = Path(
        "accelharness-results"
    ),
) -> None:
    """Benchmark the same ONNX files and inputs in headless Chromium via onnxruntime-web (wasm, webgpu, webnn)."""
    from harness.web_api import WebRequest, run_web, validate_web

    request = WebRequest(
        models=split_list(model),
        model_families=split_list(model_families),
        small_models=small_models,
        model_path=model_path,
        hardware=split_list(hardware) or [],
        browser=browser,
        browser_path=browser_path,
        threads=int_list("--threads", threads),
        webnn_device=webnn_device,
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
    rows: list[Result] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, TextColumn("eta"), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("benchmarking in the browser", total=plan.total_results)

        def on_result(result: Result, _result_id: str) -> None:
            rows.append(result)
            progress.update(task, advance=1, description=f"{result.model} {result.target.label}")

        try:
            summary = run_web(request, on_result=on_result, plan=plan)
        except StoreError as exc:
            raise fail(str(exc)) from None
    console.print(summary_table(rows))
    console.print(f"run [bold]{summary.run_id}[/bold] → {summary.db_path}: {summary.counts}")
    for path in summary.reports:
        console.print(f"  report: {path}")


def summary_table(rows: list[Result]) -> Table:
    from harness.stats import summarize

    table = Table(title="Results")
    for name in ("model", "target", "case", "status", "p50 ms", "items/s", "max |diff|", "note"):
        table.add_column(name, overflow="fold")
    for r in rows:
        s = summarize(r.samples_ms, r.case.batch_size)
        notes = [f"ran {r.precision}"] if r.precision != r.case.precision else []
        notes += ["noisy"] if s and s.noisy else []
        notes += [r.error.splitlines()[0][:100]] if r.error else []
        table.add_row(
            r.model,
            r.target.label,
            r.case.key,
            r.status,
            f"{s.median_ms:.3f}" if s else "—",
            f"{s.throughput_per_s:.1f}" if s else "—",
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


@app.command()
def report(
    run: Annotated[str, typer.Option(help="RUN_ID or 'latest'.")] = "latest",
    db: DbOption = DEFAULT_DB,
    output_dir: Annotated[Path, typer.Option(help="Where the reports go.")] = Path("accelharness-results"),
    fmt: Annotated[str | None, typer.Option("--format", help="Comma-separated: json,md,csv (default all).")] = None,
) -> None:
    """Regenerate a run's reports from the DuckDB store."""
    from harness.report import FORMATS, write_reports

    formats = split_list(fmt)
    unknown = [f for f in formats or [] if f not in FORMATS]
    if unknown:
        raise fail(f"unknown report format '{unknown[0]}'; valid: {', '.join(FORMATS)}")
    try:
        paths = write_reports(db, run, output_dir, formats)
    except StoreError as exc:
        raise fail(str(exc)) from None
    for path in paths:
        console.print(f"report: {path}")
    markdown = next((p for p in paths if p.suffix == ".md"), None)
    if markdown is not None:
        from rich.markdown import Markdown

        console.print(Markdown(markdown.read_text()))


@app.command()
def models() -> None:
    """List the model specs: name, family, variant, architecture."""
    from harness.specs import load_specs

    table = Table()
    for name in ("model", "family", "variant", "architecture", "inputs"):
        table.add_column(name)
    for spec in sorted(load_specs().values(), key=lambda s: (s.family, s.name)):
        table.add_row(spec.name, spec.family, spec.variant, spec.architecture, spec.inputs.kind)
    console.print(table)


@app.command()
def predict(
    model: Annotated[str, typer.Option(help="Model name (measured in the store, or any spec).")],
    hardware: Annotated[str | None, typer.Option(help="Only these hardware platforms.")] = None,
    engines: Annotated[str | None, typer.Option(help="Only these engines.")] = None,
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1",
    sequence_lengths: Annotated[str, typer.Option(help="Comma-separated sequence lengths.")] = "32",
    db: DbOption = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Predict latency, throughput and memory for untested combinations, with the held-out MAPE."""
    from harness.analysis.predict import InsufficientData, Query, model_facts, predict, training_rows
    from harness.analysis.predict import as_json as to_json

    try:
        family, parameters = model_facts(db, model)
        targets = sorted({(r["hardware"], r["engine"], r["provider"]) for r in training_rows(db)})
    except (StoreError, KeyError) as exc:
        raise fail(f"{exc}; see `accelharness models`" if isinstance(exc, KeyError) else str(exc)) from None
    wanted_hw, wanted_engines = split_list(hardware), split_list(engines)
    targets = [
        t for t in targets if (not wanted_hw or t[0] in wanted_hw) and (not wanted_engines or t[1] in wanted_engines)
    ]
    queries = [
        Query(model, family, parameters, *t, batch_size=b, seq_len=s)
        for t in targets
        for b in int_list("--batch-sizes", batch_sizes)
        for s in int_list("--sequence-lengths", sequence_lengths)
    ]
    try:
        result = predict(db, queries)
    except InsufficientData as exc:
        raise fail(str(exc)) from None
    if as_json:
        console.print_json(to_json(result))
        return
    table = Table(title=f"Predicted for {model} ({parameters:,} parameters) — predictions, not measurements")
    for name in ("target", "batch", "seq", "p50 ms", "items/s", "memory MB", "measured p50 ms"):
        table.add_column(name)
    for row in result.rows:
        measured = row.get("measured_latency_p50_ms")
        table.add_row(
            f"{row['hardware']}/{row['engine']}:{row['provider']}",
            str(row["batch_size"]),
            str(row["seq_len"]),
            f"{row['predicted_latency_p50_ms']:.3f}",
            f"{row['predicted_throughput_per_s']:.1f}",
            f"{row['predicted_memory_peak_mb']:.0f}",
            f"{measured:.3f}" if measured else "—",
        )
    console.print(table)
    mape = ", ".join(f"{k} {v:.1%}" for k, v in result.mape.items())
    console.print(
        f"held-out error (leave-one-model-out MAPE over {result.training_rows} rows, "
        f"{result.training_models} models): {mape}"
    )
    for note in result.notes:
        console.print(f"note: {note}")


@app.command()
def recommend(
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
    model_family: Annotated[str | None, typer.Option(help="Model family (uses its measured models).")] = None,
    task: Annotated[str | None, typer.Option(help="HF task, e.g. text-generation (maps to a family).")] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size to recommend for.")] = 1,
    mode: Annotated[str, typer.Option(help="inference or training.")] = "inference",
    hardware: Annotated[str | None, typer.Option(help="The hardware you have (comma-separated).")] = None,
    weights: Annotated[str, typer.Option(help="latency,throughput,memory,compatibility weights.")] = "0.4,0.3,0.1,0.2",
    create_map: Annotated[Path | None, typer.Option(help="Write the selection map JSON here.")] = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Recommend hardware for a model, family or task from measured rows (or marked predictions)."""
    from harness.analysis.predict import InsufficientData
    from harness.analysis.recommend import ScoreWeights, selection_map
    from harness.analysis.recommend import recommend as rank

    try:
        values = [float(v) for v in weights.split(",")]
        score_weights = ScoreWeights(*values)
    except (ValueError, TypeError):
        raise fail(f"--weights takes four numbers latency,throughput,memory,compatibility (got '{weights}')") from None
    if mode not in ("inference", "training") or batch_size < 1:
        raise fail("--mode is inference or training and --batch-size >= 1")
    try:
        if create_map is not None:
            create_map.write_text(json.dumps(selection_map(db, score_weights), indent=2))
            console.print(f"selection map: {create_map}")
            return
        result = rank(db, model, model_family, task, batch_size, None, mode, split_list(hardware), score_weights)
    except (StoreError, InsufficientData, ValueError, KeyError) as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"Recommendation for {result.subject}, batch {batch_size}, {mode}")
    for name in ("rank", "target", "score", "p50 ms", "items/s", "memory MB", "compat", "backed by"):
        table.add_column(name, overflow="fold")
    for rank_number, c in enumerate(([result.primary] if result.primary else []) + result.fallbacks, start=1):
        evidence = c.evidence[0] if c.source == "predicted" else f"measured: {', '.join(e[:8] for e in c.evidence)}"
        table.add_row(
            str(rank_number),
            c.target,
            f"{c.score:.3f}",
            f"{c.latency_ms:.3f}",
            f"{c.throughput_per_s:.1f}",
            f"{c.memory_mb:.0f}",
            f"{c.compatibility:.0%}",
            evidence,
        )
    console.print(table)
    console.print(f"primary: {result.primary.target if result.primary else 'none — no candidate ran ok'}")
    for line in result.excluded:
        console.print(f"excluded: {line}")


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


if __name__ == "__main__":
    app()
