"""Which runtime? A model's generation ranked across every target that ran it (native engines, each page runtime on
each browser EP): by decode tokens/s, with TTFT, how its tokens were checked (equal to native ORT's on the same
graph, or its agreement with fp32 where it ran other weights), how close it came to its target's bandwidth ceiling,
and its decode rate over the best native row's of the same case on this machine. Reads stored rows only."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harness.analysis.tables import Table
from harness.core.labels import BROWSER_ENGINE, case_label, details_of, in_page, served, target_label

COLUMNS = ["Model", "Case", "Rank", "Target", "tg tokens/s", "TTFT ms", "tokens", "of bandwidth ceiling",
           "÷ best native tg", "÷ own page loop tg"]  # fmt: skip
NOTE = (
    "Each generate case with ok rows on more than one engine (a page runtime is an engine: onnxruntime-web, "
    "transformers.js, llama.cpp), fastest decode first. 'tokens' says how each row's tokens were checked: "
    "'= native ORT' (teacher-forced on the same graph, near ties allowed), or its top-1 agreement with the fp32 "
    "graph where it ran weights no graph holds (a GGUF's quantized blocks). '÷ best native tg': its decode "
    "tokens/s over the fastest native row's of the same case on this machine. '÷ own page loop tg': a page runtime's "
    "decode tokens/s over our own onnxruntime-web loop's on the same EP and threads (transformers.js on the same "
    "file: the cost of its generate loop)."
)


def _own_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """A page row's EP, threads and browser: where our own loop's rate is its runtime's yardstick."""
    return row["hardware"], row["provider"], row.get("device")


def _checked(row: dict[str, Any]) -> str:
    details = details_of(row)
    if row["status"] == "mismatch":
        return "MISMATCH"
    if details.get("agreement_top1") is not None and str(details.get("token_parity", "")).startswith("not checked"):
        return f"agreement {details['agreement_top1']:.2f} vs fp32"
    if details.get("tokens_matched") is not None:
        return f"= native ORT ({details['tokens_matched']}/{details.get('tokens_compared')} equal)"
    return "not checked"


def _over(row: dict[str, Any], own: float | None) -> float | None:
    return row["decode_tokens_per_s"] / own if own and in_page(row) and row["engine"] != BROWSER_ENGINE else None


def runtime_table(rows: list[dict[str, Any]]) -> Table | None:
    """The ranking over `rows` (a run's or the store's latest), or None where no case has two engines."""
    cases: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("mode") == "generate" and row["status"] in ("ok", "mismatch") and row.get("decode_tokens_per_s"):
            cases[(row["model"], f"{case_label(row)} {row['precision']}")].append(row)
    body = []
    for (model, case), found in sorted(cases.items()):
        if len({r["engine"] for r in found}) < 2:
            continue
        native = [r["decode_tokens_per_s"] for r in found if not in_page(r) and not served(r)]
        best = max(native, default=None)
        own = {_own_key(r): r["decode_tokens_per_s"] for r in found
               if in_page(r) and r["engine"] == BROWSER_ENGINE}  # fmt: skip
        ranked = sorted(found, key=lambda r: -r["decode_tokens_per_s"])
        for rank, row in enumerate(ranked, 1):
            body.append({"Model": model, "Case": case, "Rank": rank, "Target": target_label(row),
                         "tg tokens/s": row["decode_tokens_per_s"], "TTFT ms": row.get("ttft_ms"),
                         "tokens": _checked(row), "of bandwidth ceiling": row.get("bandwidth_fraction"),
                         "÷ best native tg": row["decode_tokens_per_s"] / best if best else None,
                         "÷ own page loop tg": _over(row, own.get(_own_key(row)))})  # fmt: skip
    return Table("Which runtime? (generation ranked by decode tokens/s)", COLUMNS, body, [NOTE]) if body else None
