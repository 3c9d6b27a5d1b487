"""The tables every analysis renders (compare, history, query): one shape, four formats (md, csv,
json, html), and the error an analysis raises on bad input."""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from harness.core.escaping import csv_cell, markdown_text
from harness.core.terminal import terminal_text

FORMATS = ("md", "csv", "json", "html")


class AnalysisError(ValueError):
    """Bad input to an analysis (unknown selector, refused SQL, no data); the CLI prints it and exits 2."""


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


# --- rendering -----------------------------------------------------------------------------------
def cell(value: Any) -> str:
    """A value as a person reads it: 4 significant digits, no 'None', on one line without control
    characters (terminal_text: a stored text may come from a device or a bundle made elsewhere)."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return terminal_text(str(value))


def _markdown(table: Table) -> str:
    """Title, notes, columns (a machine's label) and cells may hold stored text: each through markdown_text."""
    lines = [f"## {markdown_text(table.title)}", ""] + [f"{markdown_text(note)}  " for note in table.notes]
    lines += [""] if table.notes else []
    if not table.rows:
        return "\n".join([*lines, "(no rows)", ""])
    lines += ["| " + " | ".join(map(markdown_text, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(markdown_text(cell(row.get(c))) for c in table.columns) + " |" for row in table.rows]
    return "\n".join([*lines, ""])


def _html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(terminal_text(c))}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(row.get(c)))}</td>" for c in table.columns) + "</tr>\n"
        for row in table.rows
    )
    notes = "".join(f"<p>{html.escape(terminal_text(note))}</p>\n" for note in table.notes)
    title = html.escape(terminal_text(table.title))
    style = "table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #ccc;padding:2px 6px}"
    return (
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{style}</style></head>\n<body><h2>{title}</h2>\n{notes}"
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table></body></html>\n"
    )


def _csv(table: Table) -> str:
    """Raw values (a number stays a number); text a spreadsheet would run as a formula neutralized
    (csv_cell), control characters stripped (the CSV is printed as often as it is written)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([csv_cell(terminal_text(c)) for c in table.columns])
    for row in table.rows:
        values = (row.get(c) for c in table.columns)
        writer.writerow([csv_cell(terminal_text(v)) if isinstance(v, str) else v for v in values])
    return buffer.getvalue()


def render_table(table: Table, fmt: str) -> str:
    """The table as md, csv, json (a list of row objects, raw values) or a standalone html page."""
    if fmt == "md":
        return _markdown(table)
    if fmt == "csv":
        return _csv(table)
    if fmt == "json":
        return json.dumps([{c: row.get(c) for c in table.columns} for row in table.rows], indent=2, default=str)
    if fmt == "html":
        return _html(table)
    raise AnalysisError(f"unknown format '{fmt}'; valid: {', '.join(FORMATS)}")
