"""Stored text written into a file a person opens: Markdown and CSV. The text may come from a device
or a bundle made elsewhere, so it carries no markup, no formula and no control character (the HTML report
escapes its own). One definition each; the store keeps the text as it came.

A CSV cell is made safe by csv_cell alone, wherever CSV is written: the report's (harness.report.formats), an
analysis's `--format csv` (harness.analysis.tables) and `export --format csv`, which calls it from SQL
(harness.analysis.query registers it as a DuckDB function)."""

from __future__ import annotations

import html
import re
from typing import Any

from harness.core.terminal import terminal_text

# A spreadsheet evaluates a cell that starts with one of these as a formula (=HYPERLINK(…), @SUM(…),
# +cmd|…, -2+3); OWASP's advice for CSV injection: prefix a single quote, so the cell is text.
CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A cell's own tabs and line breaks are text (CSV quotes a cell holding one); every other control character goes.
_CSV_KEPT = re.compile(r"([\t\n\r])")
_PLAIN = re.compile(r"[\t\n\r\x20-\x7e]*")  # nothing to strip: most cells, passed through at C speed


def markdown_text(value: Any) -> str:
    """`value` as Markdown text, also inside a table cell: on one line, no control characters, HTML
    escaped (<script>, <img onerror> are shown, never run) and `|` escaped (a cell stays one cell)."""
    text = html.escape(terminal_text(str(value)), quote=False)
    return text.replace("|", r"\|")


def csv_text(text: str) -> str:
    """`text` without terminal escapes and control characters (ESC, BEL, C1, bidi overrides: what
    terminal_text strips, a `cat` of the file would otherwise run them), its tabs and line breaks kept."""
    if _PLAIN.fullmatch(text):
        return text
    return "".join(part if _CSV_KEPT.fullmatch(part) else terminal_text(part) for part in _CSV_KEPT.split(text))


def csv_cell(value: Any) -> Any:
    """A CSV cell: text without control characters (csv_text), and text that a spreadsheet would take for a
    formula then quoted as text; numbers (a negative one included) and everything else as they are."""
    if not isinstance(value, str):
        return value
    text = csv_text(value)
    return "'" + text if text.startswith(CSV_FORMULA_STARTS) else text
