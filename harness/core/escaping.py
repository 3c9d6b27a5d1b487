"""Stored text written into a file a person opens: Markdown and CSV. The text may come from a device
or a bundle made elsewhere, so it carries no markup and no formula (the HTML report escapes its own).
One definition each; the store keeps the text as it came."""

from __future__ import annotations

import html
from typing import Any

from harness.core.terminal import terminal_text

# A spreadsheet evaluates a cell that starts with one of these as a formula (=HYPERLINK(…), @SUM(…),
# +cmd|…, -2+3); OWASP's advice for CSV injection: prefix a single quote, so the cell is text.
CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def markdown_text(value: Any) -> str:
    """`value` as Markdown text, also inside a table cell: on one line, no control characters, HTML
    escaped (<script>, <img onerror> are shown, never run) and `|` escaped (a cell stays one cell)."""
    text = html.escape(terminal_text(str(value)), quote=False)
    return text.replace("|", r"\|")


def csv_cell(value: Any) -> Any:
    """A CSV cell: text that a spreadsheet would take for a formula, quoted as text; numbers (a negative
    one included) and everything else as they are."""
    if isinstance(value, str) and value.startswith(CSV_FORMULA_STARTS):
        return "'" + value
    return value
