"""A speech row's word error rate as the store keeps it (details.wer, measured by harness.prepare.wer), read for
the commands that show or filter by it (compare, recommend --max-wer): a number, or None and why there is none."""

from __future__ import annotations

import json
import math
from typing import Any


def details_of(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row's details as a dict (the store returns JSON text; a value from elsewhere that is not: {})."""
    details = row.get("details")
    if isinstance(details, str):
        try:
            details = json.loads(details)
        except (ValueError, RecursionError):
            return {}
    return details if isinstance(details, dict) else {}


def row_wer(row: dict[str, Any]) -> tuple[float | None, str]:
    """A generate row's stored word error rate (details.wer, harness.prepare.wer), or None and why there is none."""
    if row.get("source") == "predicted":
        return None, "a prediction has no measured WER"
    details = details_of(row)
    wer = details.get("wer")
    if isinstance(wer, int | float) and not isinstance(wer, bool) and math.isfinite(wer) and wer >= 0:
        return float(wer), ""
    if "wer_not_measured" not in details:
        return None, "no WER: not a speech row"
    return None, f"its WER was not measured ({str(details['wer_not_measured'])[:200]})"
