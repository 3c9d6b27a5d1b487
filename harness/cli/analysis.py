"""Commands that read the store: report, matrix, compare, history, query, export, recommend
(predict has its own module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from harness.analysis import options as declared
from harness.analysis.options import REPORT_FORMATS
from harness.cli.common import (
    console,
    errors,
    fail,
    given,
    refuse_bad,
    say,
    shown,
    split_list,
    with_options,
)
from harness.core.options import RUN_SELECTOR
from harness.store import StoreError

# Every option of these commands is a field of its dataclass in harness.analysis.options (flag, help, default,
# bound and choices written there once); with_options() makes them the parameters below, which name them only.


@with_options(declared.Report)
def report(*, run: str, db_path: Path, output_dir: Path, fmt: str | None, out: Path | None) -> None:
    """Regenerate a run's reports from the DuckDB store (HTML with inline SVG plots; Markdown links PNGs)."""
    refuse_bad(declared.Report, fmt=fmt)
    formats = split_list(fmt, "--format")
    if out is not None and len(formats or REPORT_FORMATS) != 1:
        raise fail("--out is a file path and needs exactly one --format (use --output-dir for several)")
    from harness.core.paths import UnsafePathError
    from harness.report import write_reports

    try:
        paths = write_reports(db_path, run, output_dir, formats, out=out)
    except (StoreError, UnsafePathError) as exc:
        raise fail(str(exc)) from None
    for path in paths:
        console.print(f"report: {shown(path)}")
    markdown = next((p for p in paths if p.suffix == ".md"), None)
    if markdown is not None and run != "all":
        from rich.markdown import Markdown

        console.print(Markdown(markdown.read_text()))


@with_options(declared.Matrix)
def matrix(*, db_path: Path, output_dir: Path, run: str, update_matrix_only: bool) -> None:
    """Write compatibility_matrix.json/.md from measured results: model (family) x hardware target."""
    from harness.analysis.matrix import build_matrix, cell_text, load_rows, write_matrix

    try:
        built = build_matrix(load_rows(db_path, run))
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


def _generation(model: str, batch_size: int, min_agreement: float | None, machine: str | None, db: Path,
                browser: str | None = None, max_wer: float | None = None) -> None:  # fmt: skip
    """recommend --mode generate: the model's generate targets by decode tokens/s above the agreement floor (and,
    with --max-wer, at most that word error rate)."""
    from harness.analysis.machines import one_machine
    from harness.analysis.recommend import fastest_generation, with_predicted, within_wer
    from harness.cli.predict_generate import measured_of, recommend_predictions

    try:
        with one_machine(db, machine) as scoped:
            choice = fastest_generation(scoped, model, batch_size, min_agreement, browser)
            predicted, notes = recommend_predictions(model, batch_size, scoped, measured_of(scoped, model, choice))
    except (StoreError, ValueError) as exc:
        raise fail(str(exc)) from None
    with_predicted(choice, predicted, browser)
    if max_wer is not None:  # its value was checked before the store was read
        within_wer(choice, max_wer)
    floor = "" if min_agreement is None else f", top-1 agreement with fp32 >= {min_agreement:g}"
    floor += "" if max_wer is None else f", WER <= {max_wer:g}"
    table = Table(title=f"Fastest generation for {shown(model)}, batch {batch_size}{floor}")
    wer_column = ("WER",) if max_wer is not None else ()
    for name in ("rank", "target", "precision", "tg tokens/s", "TTFT ms", "agreement", "KL vs fp32", "backed by",
                 *wer_column):  # fmt: skip
        table.add_column(name, overflow="fold")
    for number, row in enumerate(choice.ranked, start=1):
        share, kl = row["agreement"], row["kl_mean"]
        table.add_row(str(number), shown(row["target"]), shown(row["precision"]), f"{row['decode_tokens_per_s']:.1f}",
                      "—" if row["ttft_ms"] is None else f"{row['ttft_ms']:.3f}",
                      "—" if share is None else f"{share:.3f}", "—" if kl is None else f"{kl:.4f}",
                      shown(row.get("backed_by", "measured")), *(f"{row['wer']:.3f}" for _ in wer_column))  # fmt: skip
    console.print(table if choice.ranked else f"no ok generate row of {shown(model)} at batch {batch_size}{floor}")
    for line in [*choice.excluded, *(f"not predicted: {note}" for note in notes)]:
        console.print(f"excluded: {shown(line)}")


@with_options(declared.Recommend)
def recommend(
    *,
    model: str | None,
    model_family: str | None,
    task: str | None,
    batch_size: int,
    mode: str,
    min_agreement: float | None,
    max_wer: float | None,
    hardware: str | None,
    browser: str | None,
    weights: str,
    create_map: Path | None,
    one_line: bool,
    machine: str | None,
    db_path: Path,
) -> None:
    """Recommend hardware for a model, family or task from measured rows (or marked predictions)."""
    from harness.analysis.machines import one_machine
    from harness.analysis.predict import InsufficientData
    from harness.analysis.recommend import ScoreWeights, check_max_wer, selection_map
    from harness.analysis.recommend import recommend as rank

    try:
        values = [float(v) for v in weights.split(",")]
        score_weights = ScoreWeights(*values)
    except (ValueError, TypeError):
        raise fail(f"--weights takes four numbers latency,throughput,memory,compatibility (got '{weights}')") from None
    refuse_bad(declared.Recommend, mode=mode, batch_size=batch_size, browser=browser)
    if min_agreement is not None and mode != "generate":
        raise fail("--min-agreement ranks generate targets: give it with --mode generate")
    if max_wer is not None and mode != "generate":
        raise fail("--max-wer ranks a speech model's generate targets: give it with --mode generate")
    if max_wer is not None:
        try:
            check_max_wer(max_wer)
        except ValueError as exc:
            raise fail(str(exc)) from None
    if mode == "generate":
        if not model or model_family or task or hardware or create_map or one_line:
            raise fail("--mode generate takes --model, --batch-size, --min-agreement, --max-wer, --browser, --machine "
                       "and --db")  # fmt: skip
        return _generation(model, batch_size, min_agreement, machine, db_path, browser, max_wer)
    if one_line:
        if model_family or task or hardware or create_map:
            raise fail("--one-line takes --model, --batch-size, --mode and --db; the ranking's options do nothing")
        return _one_line(model, batch_size, mode, db_path)
    try:
        with one_machine(db_path, machine) as scoped:
            if create_map is not None:
                create_map.write_text(json.dumps(selection_map(scoped, score_weights), indent=2))
                console.print(f"selection map: {shown(create_map)}")
                return
            hardware_list = split_list(hardware, "--hardware")
            result = rank(scoped, model, model_family, task, batch_size, None, mode, hardware_list, score_weights,
                          browser)  # fmt: skip
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


@with_options(declared.Compare)
def compare_command(
    runs: Annotated[list[str] | None, typer.Argument(help=f"A B, each {RUN_SELECTOR}.")] = None,
    *,
    baseline: str | None,
    threshold: str,
    quantile: float,
    fail_on_regression: bool,
    fmt: str,
    out: Path | None,
    plot_comparison: Path | None,
    across_machines: bool,
    db_path: Path,
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
    refuse_bad(declared.Compare, fmt=fmt)
    try:
        if plot_comparison is not None:
            compare.check_plot_path(plot_comparison)
        limit = compare.parse_threshold(threshold)
        if not baseline and len(runs) == 1 and is_ab_run(db_path, runs[0], Path.cwd()):
            result = compare_pair(db_path, runs[0], limit, cwd=Path.cwd())
        else:
            result = compare.compare_runs(
                db_path, a, b, limit, quantile, cwd=Path.cwd(), across_machines=across_machines
            )
    except (AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    emit(compare.render(result, fmt), out)
    if plot_comparison is not None:
        console.print(f"plot: {shown(compare.plot_comparison(result, plot_comparison))}")
    if fail_on_regression and result.regressed:
        errors.print(f"{len(result.regressed)} case(s) regressed or broke; exit 1", highlight=False)
        raise typer.Exit(1)


@with_options(declared.History)
def history_command(
    *,
    model: str,
    metric: str,
    hardware: str | None,
    engine: str | None,
    batch_size: int | None,
    threshold: str,
    window: int,
    fmt: str,
    out: Path | None,
    db_path: Path,
) -> None:
    """A metric over runs (ordered by start time) per case, with step changes flagged."""
    from harness.analysis import history
    from harness.analysis.compare import parse_threshold
    from harness.analysis.tables import AnalysisError

    filters = {"hardware": hardware, "engine": engine, "batch_size": batch_size}
    refuse_bad(declared.History, fmt=fmt)
    try:
        result = history.history(db_path, model, metric, filters, parse_threshold(threshold), window)
    except (AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    emit(history.render(result, fmt), out)


@with_options(declared.Query)
def query_command(
    *, report: str | None, sql: str | None, run: str, threshold: str, fmt: str, out: Path | None, db_path: Path
) -> None:
    """Canned reports, or read-only ad-hoc SQL, over the store."""
    from harness.analysis import query, tables
    from harness.analysis.compare import parse_threshold

    if (report is None) == (sql is None):
        raise fail("query takes either --report NAME or --sql 'SELECT …'")
    refuse_bad(declared.Query, fmt=fmt)
    try:
        if sql is not None:
            table = query.run_sql(db_path, sql)
        else:
            table = query.run_report(db_path, report or "", run, parse_threshold(threshold))
    except (tables.AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    emit(tables.render_table(table, fmt), out)


@with_options(declared.Export)
def export_command(
    ctx: typer.Context,
    *,
    out: Path | None,
    fmt: str,
    table: str,
    bundle: Path | None,
    run: str | None,
    since: str | None,
    redact: str | None,
    db_path: Path,
) -> None:
    """Export store tables to Parquet or CSV, or runs as a bundle (--bundle) for `import` (read-only)."""
    from harness.analysis.query import export_tables
    from harness.analysis.tables import AnalysisError
    from harness.cli.bundle import export_bundle_command

    if bundle is not None:
        if tables_only := given(ctx, "out", "fmt", "table"):
            raise fail(f"{', '.join(tables_only)}: options of a table export; a --bundle holds every table")
        export_bundle_command(db_path, bundle, run, since, redact)
        return
    if bundle_only := given(ctx, "run", "since", "redact"):
        raise fail(f"{', '.join(bundle_only)}: options of --bundle; add --bundle FILE or drop them")
    if out is None:
        raise fail("export needs --out DIR (one file per table) or --bundle FILE (one file for `import`)")
    try:
        paths = export_tables(db_path, out, fmt, table)
    except (AnalysisError, StoreError) as exc:
        raise fail(str(exc)) from None
    for path in paths:
        console.print(f"export: {shown(path)}")
