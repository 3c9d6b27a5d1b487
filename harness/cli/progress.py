"""A run's progress bar, fed by each committed result, and the summary table printed after it."""

from __future__ import annotations

from collections.abc import Callable

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
from rich.text import Text

from harness.cli.common import console, errors, fail, shown
from harness.cli.stops import interrupted, stopped
from harness.core.records import Result
from harness.core.terminal import terminal_text
from harness.prepare.prepared import Phase
from harness.run.recording import RunSummary
from harness.run.worker import phases_shown
from harness.store import StoreError, StoreWriteError


def run_with_progress(
    total: int, start: Callable[[Callable[[Result, str], None]], RunSummary], resumable: bool = True
) -> RunSummary:
    """Run with a progress bar (ETA) fed by each committed result, then print the summary. Ctrl-C or
    SIGTERM: the run is kept `interrupted`, and the way to continue it (--resume, when `resumable`) printed."""
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
                    f"[{len(rows)}/{total}] stored {shown(result.model)} {shown(result.target.label)} "
                    f"{result.case.key}: {result.status}",
                    highlight=False,
                )

        def on_phase(phase: Phase) -> None:  # a model's preparation, before its jobs: a cold export takes minutes
            progress.update(task, description=f"{phase.model}: {phase.step}")
            if not console.is_terminal:
                console.print(f"preparing {shown(phase.model)}: {phase.step}", highlight=False)

        try:
            with phases_shown(on_phase):
                summary = start(on_result)
        except StoreWriteError as exc:  # not bad input: the run stopped, what it finished is kept
            raise stopped(exc, resumable) from None
        except StoreError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise interrupted(resumable) from None
    return print_summary(summary, rows)


def print_summary(summary: RunSummary, rows: list[Result]) -> RunSummary:
    """The results table (a run of --ceilings-only: its ceilings), where the run is stored and its reports (exit 1
    if they could not be written)."""
    ceilings = ceilings_table(summary) if not rows else None
    console.print(ceilings or summary_table(rows))
    console.print(f"run [bold]{summary.run_id}[/bold] → {summary.db_path}: {summary.counts}")
    for path in summary.reports:
        console.print(f"  report: {path}")
    if summary.report_error:
        errors.print(f"[red]error:[/red] {shown(summary.report_error)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    return summary


def generation_note(row: Result) -> list[str]:
    """A generate row's figures by phase (p50 and items/s there are whole generations)."""
    from harness.core.generation import summarize_generation

    figures = summarize_generation(row)
    if not figures:
        return []
    pp, tg = figures["prefill_tokens_per_s"], figures["decode_tokens_per_s"]
    text = f"TTFT {figures['ttft_ms']:.3g} ms, pp {pp:.0f}" if pp else f"TTFT {figures['ttft_ms']:.3g} ms"
    text += f", tg {tg:.1f} tokens/s" if tg else ""
    if figures.get("encoder_ms") is not None:  # an encoder–decoder: its encoder's share of TTFT
        text += f", encoder {figures['encoder_ms']:.3g} ms"
    if figures.get("real_time_factor") is not None:
        text += f", RTF {figures['real_time_factor']:.3g}x"
    matched = row.details.get("tokens_matched")
    return [text + (f", {matched}/{row.case.new_tokens} tokens = native ORT" if matched is not None else "")]


def summary_table(rows: list[Result]) -> Table:
    from harness.core.labels import flags
    from harness.core.stats import summarize

    table = Table(title="Results")
    for name in ("model", "target", "case", "status", "p50 ms", "items/s", "max |diff|", "note"):
        table.add_column(name, overflow="fold")
    for r in rows:
        s = summarize(r.samples_ms, r.case.batch_size)
        marked = {"status": r.status, "precision": r.precision, "requested_precision": r.case.precision}
        marked |= {"noisy": bool(s and s.noisy), "latency_cv": s.cv if s else None, "details": r.details}
        notes = generation_note(r) + flags(marked)  # the same warnings the reports put next to the number
        notes += [terminal_text(r.error.splitlines()[0][:100])] if r.error else []  # a served device's words
        table.add_row(
            r.model,
            r.target.label,
            r.case.key,
            r.status,
            f"{s.median_ms:.3f}" if s else "—",
            f"{s.throughput_per_s:.1f}" if s and s.throughput_per_s is not None else "—",
            f"{r.max_abs_diff:.2g}" if r.max_abs_diff is not None else "—",
            Text("; ".join(notes)),  # text, not markup: "[/x]" in an error would stop the table
        )
    return table


def ceilings_table(summary: RunSummary) -> Table | None:
    """The run's ceilings as stored (harness.run.ceilings: its size, value, spread; reused or why none), or None
    where it stored none."""
    from harness.core.labels import target_label
    from harness.core.roofline import UNITS
    from harness.run.ceiling_check import CHECKED
    from harness.store import open_store

    with open_store(summary.db_path, read_only=True) as store:
        ceilings = store.ceilings(summary.run_id)
    if not ceilings:
        return None
    table = Table(title="Ceilings")
    for name in ("target", "ceiling", "class", "size", "value", "spread", "runs", "note"):
        table.add_column(name, overflow="fold")
    for c in ceilings:
        value = f"{c['value']:.3g} {UNITS.get(c['kind'], '')}" if c["value"] is not None else "—"
        spread = f"{c['spread']:.1%}" if c["spread"] is not None else "—"
        reused = f"reused from run {c['reused_from']} (measured {c['measured_at']:%Y-%m-%d %H:%M} UTC)"
        note = c["error"] or (reused if c["reused_from"] else f"sized to a run of {c['budget_ms']:g} ms")
        if str(c["sizing"] or "").startswith(CHECKED):  # a prior checked before reuse: the check's words
            note = f"{note}; {str(c['sizing']).split('; ', 1)[0]}"
        cells = [target_label(c), c["kind"], c["precision"], c["workload"], value, spread, c["iterations"], note]
        table.add_row(*(Text(terminal_text(str(cell))[:200]) for cell in cells))  # text from the store, not markup
    return table
