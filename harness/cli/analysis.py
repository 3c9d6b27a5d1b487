"""Commands that read the store: report, matrix, compare, history, query, export, recommend
(predict has its own module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from harness.cli.common import (
    RUN_SELECTOR,
    DbOption,
    MachineOption,
    OutputDirOption,
    RunOption,
    RunsOption,
    ThresholdOption,
    console,
    errors,
    fail,
    given,
    say,
    shown,
    split_list,
)
from harness.core.bounds import MAX_BATCH, out_of_range
from harness.store import DEFAULT_DB, StoreError

AnalysisFormat = Annotated[str, typer.Option("--format", help="md, json or html.")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")]


def report(
    run: RunsOption = "latest",
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    fmt: Annotated[
        str | None, typer.Option("--format", help="Comma-separated: html,md,json,csv (default all).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="The output file, when one --format is given.")] = None,
) -> None:
    """Regenerate a run's reports from the DuckDB store (HTML with inline SVG plots; Markdown links PNGs)."""
    from harness.report import FORMATS, write_reports

    formats = split_list(fmt)
    unknown = [f for f in formats or [] if f not in FORMATS]
    if unknown:
        raise fail(f"unknown report format '{unknown[0]}'; valid: {', '.join(FORMATS)}")
    if out is not None and len(formats or FORMATS) != 1:
        raise fail("--out is a file path and needs exactly one --format (use --output-dir for several)")
    from harness.core.paths import UnsafePathError

    try:
        paths = write_reports(db, run, output_dir, formats, out=out)
    except (StoreError, UnsafePathError) as exc:
        raise fail(str(exc)) from None
    for path in paths:
        console.print(f"report: {shown(path)}")
    markdown = next((p for p in paths if p.suffix == ".md"), None)
    if markdown is not None and run != "all":
        from rich.markdown import Markdown

        console.print(Markdown(markdown.read_text()))


def matrix(
    db: DbOption = DEFAULT_DB,
    output_dir: OutputDirOption = Path("accelharness-results"),
    run: RunsOption = "all",
    update_matrix_only: Annotated[
        bool, typer.Option(help="Only rebuild the files from the DB (no table printed); nothing is run.")
    ] = False,
) -> None:
    """Write compatibility_matrix.json/.md from measured results: model (family) x hardware target."""
    from harness.analysis.matrix import build_matrix, cell_text, load_rows, write_matrix

    try:
        built = build_matrix(load_rows(db, run))
    except StoreError as exc:
        raise fail(str(exc)) from None
    for path in write_matrix(built, output_dir):
        console.print(f"matrix: {shown(path)}")
    if update_matrix_only:
        return
    table = Table(title=f"Compatibility matrix ({built['results']} results, {len(built['runs'])} runs)")
    for name in ("family", "target", "class · rating (speedup vs cpu/torch)"):
        table.add_column(name, overflow="fold")
    for family, entry in built["families"].items():
        for target, cell in entry["cells"].items():
            table.add_row(shown(family), shown(target), shown(cell_text(cell)))
    console.print(table)


def _generation(model: str, batch_size: int, min_agreement: float | None, machine: str | None, db: Path) -> None:
    """recommend --mode generate: the model's generate targets by decode tokens/s above the agreement floor."""
    from harness.analysis.machines import one_machine
    from harness.analysis.recommend import fastest_generation

    try:
        with one_machine(db, machine) as scoped:
            choice = fastest_generation(scoped, model, batch_size, min_agreement)
    except (StoreError, ValueError) as exc:
        raise fail(str(exc)) from None
    floor = "" if min_agreement is None else f", top-1 agreement with fp32 >= {min_agreement:g}"
    table = Table(title=f"Fastest generation for {shown(model)}, batch {batch_size}{floor}")
    for name in ("rank", "target", "precision", "tg tokens/s", "TTFT ms", "agreement", "KL vs fp32"):
        table.add_column(name, overflow="fold")
    for number, row in enumerate(choice.ranked, start=1):
        share, kl = row["agreement"], row["kl_mean"]
        table.add_row(str(number), shown(row["target"]), shown(row["precision"]), f"{row['decode_tokens_per_s']:.1f}",
                      "—" if row["ttft_ms"] is None else f"{row['ttft_ms']:.3f}",
                      "—" if share is None else f"{share:.3f}", "—" if kl is None else f"{kl:.4f}")  # fmt: skip
    console.print(table if choice.ranked else f"no ok generate row of {shown(model)} at batch {batch_size}{floor}")
    for line in choice.excluded:
        console.print(f"excluded: {shown(line)}")


def recommend(
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
    model_family: Annotated[str | None, typer.Option(help="Model family (uses its measured models).")] = None,
    task: Annotated[str | None, typer.Option(help="HF task, e.g. text-generation (maps to a family).")] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size to recommend for.")] = 1,
    mode: Annotated[str, typer.Option(help="inference, training or generate (by decode tokens/s).")] = "inference",
    min_agreement: Annotated[
        float | None,
        typer.Option(help="generate: only targets whose top-1 agreement with the fp32 model is at least this (0-1)."),
    ] = None,
    hardware: Annotated[str | None, typer.Option(help="The hardware you have (comma-separated).")] = None,
    weights: Annotated[str, typer.Option(help="latency,throughput,memory,compatibility weights.")] = "0.4,0.3,0.1,0.2",
    create_map: Annotated[Path | None, typer.Option(help="Write the selection map JSON here.")] = None,
    one_line: Annotated[
        bool,
        typer.Option("--one-line", help="One sentence: the model's fastest target here and the browser's fastest."),
    ] = False,
    machine: MachineOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Recommend hardware for a model, family or task from measured rows (or marked predictions)."""
    from harness.analysis.machines import one_machine
    from harness.analysis.predict import InsufficientData
    from harness.analysis.recommend import ScoreWeights, selection_map
    from harness.analysis.recommend import recommend as rank

    try:
        values = [float(v) for v in weights.split(",")]
        score_weights = ScoreWeights(*values)
    except (ValueError, TypeError):
        raise fail(f"--weights takes four numbers latency,throughput,memory,compatibility (got '{weights}')") from None
    if mode not in ("inference", "training", "generate"):
        raise fail(f"unknown --mode '{mode}'; valid: inference, training, generate")
    if problem := out_of_range("--batch-size", batch_size, 1, MAX_BATCH):
        raise fail(problem)
    if min_agreement is not None and mode != "generate":
        raise fail("--min-agreement ranks generate targets: give it with --mode generate")
    if mode == "generate":
        if not model or model_family or task or hardware or create_map or one_line:
            raise fail("--mode generate takes --model, --batch-size, --min-agreement, --machine and --db")
        return _generation(model, batch_size, min_agreement, machine, db)
    if one_line:
        if model_family or task or hardware or create_map:
            raise fail("--one-line takes --model, --batch-size, --mode and --db; the ranking's options do nothing")
        return _one_line(model, batch_size, mode, db)
    try:
        with one_machine(db, machine) as scoped:
            if create_map is not None:
                create_map.write_text(json.dumps(selection_map(scoped, score_weights), indent=2))
                console.print(f"selection map: {shown(create_map)}")
                return
            hardware_list = split_list(hardware)
            result = rank(scoped, model, model_family, task, batch_size, None, mode, hardware_list, score_weights)
    except (StoreError, InsufficientData, ValueError, KeyError) as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"Recommendation for {result.subject}, batch {batch_size}, {mode}")
    for name in ("rank", "target", "score", "p50 ms", "items/s", "memory MB", "compat", "backed by"):
        table.add_column(name, overflow="fold")
    for rank_number, c in enumerate(([result.primary] if result.primary else []) + result.fallbacks, start=1):
        evidence = c.evidence[0] if c.source == "predicted" else f"measured: {', '.join(e[:8] for e in c.evidence)}"
        table.add_row(
            str(rank_number),
            shown(c.target),
            f"{c.score:.3f}",
            f"{c.latency_ms:.3f}",
            f"{c.throughput_per_s:.1f}",
            f"{c.memory_mb:.0f}" if c.memory_mb is not None else "—",  # not measured
            f"{c.compatibility:.0%}",
            shown(evidence),
        )
    console.print(table)
    console.print(f"primary: {shown(result.primary.target) if result.primary else 'none — no candidate ran ok'}")
    for line in result.excluded:
        console.print(f"excluded: {shown(line)}")


def _one_line(model: str | None, batch_size: int, mode: str, db: Path) -> None:
    from harness.analysis.recommend import one_line

    if model is None:
        raise fail("--one-line speaks of one model: give --model")
    try:
        say(one_line(db, model, batch_size, mode))
    except StoreError as exc:
        raise fail(str(exc)) from None


def emit(text: str, out: Path | None) -> None:
    """Print plain text (pipeable, no rich markup) or write it to --out."""
    if out is None:
        say(text.rstrip("\n"))
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise fail(f"--out {out} could not be written: {exc}") from None
    console.print(f"wrote {shown(out)}")


def compare_command(
    runs: Annotated[list[str] | None, typer.Argument(help=f"A B, each {RUN_SELECTOR}.")] = None,
    baseline: Annotated[str | None, typer.Option(help="A, e.g. latest-on-main; then pass only B.")] = None,
    threshold: ThresholdOption = "5%",
    quantile: Annotated[float, typer.Option(help="Statistic: 0.5 = median; 0.25 resists load spikes.")] = 0.5,
    fail_on_regression: Annotated[bool, typer.Option(help="Exit 1 if any case regressed or broke.")] = False,
    fmt: AnalysisFormat = "md",
    out: OutOption = None,
    plot_comparison: Annotated[Path | None, typer.Option(help="Write a before/after plot (.png or .svg).")] = None,
    across_machines: Annotated[
        bool, typer.Option(help="Compare runs of two hardware classes (refused otherwise); the table says so.")
    ] = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Compare run B with run A (default: previous vs latest): ratio, bootstrap CI, Mann-Whitney p, verdict.
    One `ab` run alone: its paired analysis (B against A, round by round)."""
    from harness.analysis import compare
    from harness.analysis.paired import compare_pair, is_ab_run
    from harness.analysis.tables import AnalysisError

    runs = runs or []
    if len(runs) > (1 if baseline else 2):
        raise fail("compare takes two runs A B, or --baseline A and one run B")
    a, b = (baseline, runs[0] if runs else "latest") if baseline else [*runs, *("previous", "latest")[len(runs) :]]
    if fmt not in compare.FORMATS:
        raise fail(f"unknown format '{fmt}'; valid: {', '.join(compare.FORMATS)}")
    try:
        if plot_comparison is not None:
            compare.check_plot_path(plot_comparison)
        limit = compare.parse_threshold(threshold)
        if not baseline and len(runs) == 1 and is_ab_run(db, runs[0], Path.cwd()):
            result = compare_pair(db, runs[0], limit, cwd=Path.cwd())
        else:
            result = compare.compare_runs(db, a, b, limit, quantile, cwd=Path.cwd(), across_machines=across_machines)
    except (AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    emit(compare.render(result, fmt), out)
    if plot_comparison is not None:
        console.print(f"plot: {shown(compare.plot_comparison(result, plot_comparison))}")
    if fail_on_regression and result.regressed:
        errors.print(f"{len(result.regressed)} case(s) regressed or broke; exit 1", highlight=False)
        raise typer.Exit(1)


def history_command(
    model: Annotated[str, typer.Option(help="Model name as stored (an .onnx file's stem).")],
    metric: Annotated[str, typer.Option(help="A numeric results column, or latency_pNN_ms from the samples.")] = (
        "latency_p50_ms"
    ),
    hardware: Annotated[str | None, typer.Option(help="Only this hardware platform.")] = None,
    engine: Annotated[str | None, typer.Option(help="Only this engine.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Only this batch size.")] = None,
    threshold: Annotated[str, typer.Option(help="Smallest step that counts: 10% or 0.1.")] = "10%",
    window: Annotated[int, typer.Option(help="Previous points whose median is the baseline.")] = 5,
    fmt: Annotated[str, typer.Option("--format", help="md or json.")] = "md",
    out: OutOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """A metric over runs (ordered by start time) per case, with step changes flagged."""
    from harness.analysis import history
    from harness.analysis.compare import parse_threshold
    from harness.analysis.tables import AnalysisError

    filters = {"hardware": hardware, "engine": engine, "batch_size": batch_size}
    try:
        if fmt not in history.FORMATS:
            raise AnalysisError(f"unknown format '{fmt}'; valid: {', '.join(history.FORMATS)}")
        result = history.history(db, model, metric, filters, parse_threshold(threshold), window)
    except (AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    emit(history.render(result, fmt), out)


def query_command(
    report: Annotated[
        str | None, typer.Option(help="latest, best-hardware, compatibility, regressions or ops (--profile runs).")
    ] = None,
    sql: Annotated[
        str | None, typer.Option(help="One read-only SELECT over runs/hardware/results/samples/operators.")
    ] = None,
    run: RunOption = "latest",
    threshold: Annotated[str, typer.Option(help="Threshold for the regressions report: 5% or 0.05.")] = "5%",
    fmt: Annotated[str, typer.Option("--format", help="md, csv, json or html.")] = "md",
    out: OutOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Canned reports, or read-only ad-hoc SQL, over the store."""
    from harness.analysis import query, tables
    from harness.analysis.compare import parse_threshold

    if (report is None) == (sql is None):
        raise fail("query takes either --report NAME or --sql 'SELECT …'")
    try:
        if fmt not in tables.FORMATS:
            raise tables.AnalysisError(f"unknown format '{fmt}'; valid: {', '.join(tables.FORMATS)}")
        if sql is not None:
            table = query.run_sql(db, sql)
        else:
            table = query.run_report(db, report or "", run, parse_threshold(threshold))
    except (tables.AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    emit(tables.render_table(table, fmt), out)


def export_command(
    ctx: typer.Context,
    out: Annotated[Path | None, typer.Option("--out", help="Directory for <table>.parquet / <table>.csv.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="parquet or csv.")] = "parquet",
    table: Annotated[str, typer.Option(help="results, samples, runs, hardware, operators or all.")] = "all",
    bundle: Annotated[
        Path | None,
        typer.Option(help="One file another store can `import`: the runs' rows as Parquet and a manifest."),
    ] = None,
    run: Annotated[
        str | None, typer.Option("--run", help=f"--bundle: the runs ({RUN_SELECTOR}, RUN,RUN,…, or all; default all).")
    ] = None,
    since: Annotated[str | None, typer.Option(help="--bundle: the runs started at or after this date (UTC).")] = None,
    redact: Annotated[
        str | None, typer.Option(help="--bundle: public drops hostnames, user names, paths, addresses, user agents.")
    ] = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Export store tables to Parquet or CSV, or runs as a bundle (--bundle) for `import` (read-only)."""
    from harness.analysis.query import export_tables
    from harness.analysis.tables import AnalysisError
    from harness.cli.bundle import export_bundle_command

    if bundle is not None:
        if tables_only := given(ctx, "out", "fmt", "table"):
            raise fail(f"{', '.join(tables_only)}: options of a table export; a --bundle holds every table")
        export_bundle_command(db, bundle, run, since, redact)
        return
    if bundle_only := given(ctx, "run", "since", "redact"):
        raise fail(f"{', '.join(bundle_only)}: options of --bundle; add --bundle FILE or drop them")
    if out is None:
        raise fail("export needs --out DIR (one file per table) or --bundle FILE (one file for `import`)")
    try:
        paths = export_tables(db, out, fmt, table)
    except (AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    for path in paths:
        console.print(f"export: {shown(path)}")
