"""Commands that move results between stores: export --bundle (through analysis.export_command),
import and merge."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.analysis.options import Import, Merge
from harness.cli.common import console, fail, shown, with_options
from harness.store import StoreError

if TYPE_CHECKING:
    from harness.bundle.importer import ImportCount


def parse_since(value: str) -> datetime:
    """--since: a date or a date and time (ISO 8601, UTC: the store's times are UTC)."""
    try:
        return datetime.fromisoformat(value).replace(tzinfo=None)
    except ValueError:
        raise fail(
            f"--since takes a date or date and time, e.g. 2026-11-01 or 2026-11-01T09:00 (got '{value}')"
        ) from None


def export_bundle_command(db: Path, bundle: Path, run: str | None, since: str | None, redact: str | None) -> None:
    from harness.bundle.export import export_bundle

    if run is not None and since is not None:
        raise fail("--run and --since both choose the runs of a bundle; give one")
    try:
        summary = export_bundle(db, bundle, run or "all", parse_since(since) if since else None, redact)
    except StoreError as exc:
        raise fail(str(exc)) from None
    rows = ", ".join(f"{n} {table}" for table, n in summary.rows.items() if n)
    redacted = f", redacted: {summary.redacted}" if summary.redacted else ""
    console.print(
        f"bundle: {shown(summary.path)} ({len(summary.runs)} runs; {rows}; {summary.bytes:,} bytes{redacted})"
    )


@with_options(Import)
def import_command(
    bundles: Annotated[list[Path], typer.Argument(help="Bundle files from `export --bundle`.")], *, db_path: Path
) -> None:
    """Add bundles' runs to the store, all or nothing: rows already here are skipped, a key with other
    content is refused."""
    from harness.bundle.importer import import_bundles

    try:
        counts = import_bundles(db_path, bundles)
    except StoreError as exc:
        raise fail(str(exc)) from None
    _print_counts(counts, db_path)


@with_options(Merge)
def merge_command(
    stores: Annotated[list[Path], typer.Argument(help="Store files to merge (read only).")], *, db_path: Path
) -> None:
    """Merge stores into --db through the same path as import: no duplicates, conflicts refused."""
    from harness.bundle.importer import merge_stores

    if len(stores) < 2:
        raise fail("merge takes two or more stores: accelharness merge A.duckdb B.duckdb --db OUT.duckdb")
    try:
        counts = merge_stores(stores, db_path)
    except StoreError as exc:
        raise fail(str(exc)) from None
    _print_counts(counts, db_path)


def _print_counts(counts: list[ImportCount], db: Path) -> None:
    for c in counts:
        what = (
            f"{c.runs_added} runs, {c.results_added} results ({c.samples_added} samples) added, "
            f"{c.results_skipped} results already here"
        )
        console.print(f"{shown(c.bundle)}: {what}" + ("" if c.added_anything else " — nothing new"), highlight=False)
    console.print(f"store: {shown(db)}")
