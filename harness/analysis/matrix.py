"""The compatibility matrix: which model runs on which hardware target, read from measured results only.

Rows are model families and models; columns are targets (hardware/engine, e.g. cpu/onnxruntime,
wasm/onnxruntime-web; an engine that is its own platform, OpenVINO, adds the device:
openvino/openvino:CPU). Training and generation results get columns of their own, e.g. `cpu/torch
(training)`: whether a target can take an optimizer step says nothing about its inference, and the
other way round. The latest result per (model, target, case) counts, where a case is the batch
size, sequence length, requested precision and provider. A cell's class is the most serious class
among its cases (SEVERITY), and its rating comes from the geometric mean, over the cell's ok cases, of
cpu/torch p50 ÷ target p50 for the same model and inputs (RATING_THRESHOLDS). Every cell lists its
evidence: result ids, runs, dates, models, cases and median latencies.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import geometric_mean
from typing import Any

from harness.analysis.browser_cost import BrowserCost, Unpaired, browser_costs, cost_table
from harness.analysis.machines import machine_name
from harness.analysis.tables import render_table
from harness.core import labels
from harness.core.escaping import markdown_text as md
from harness.core.labels import BASELINE_LABEL, baselines, case_key, case_label, details_of, flags, mode_of, speedup
from harness.core.records import MODES
from harness.core.roofline import limit_fraction
from harness.core.threads import threads_part
from harness.store import ALL_RUNS, MACHINE_COLUMNS, open_store

MATRIX_JSON, MATRIX_MD = "compatibility_matrix.json", "compatibility_matrix.md"

# Performance rating from the measured speedup vs cpu/torch (same model, same inputs):
# high: >= 2x, medium: >= 1x (at least as fast as torch eager on the CPU), low: below 1x.
# The cpu/torch column itself is rated "baseline"; a cell without a measured pair has no rating.
RATING_THRESHOLDS: dict[str, float] = {"high": 2.0, "medium": 1.0}
LOW, BASELINE_RATING = "low", "baseline"

CLASSES: dict[str, str] = {
    "compatible": "ran and matched the reference (status ok)",
    "ep_fallback": "ran and matched, but nodes fell back to the CPU (details.cpu_fallback) "
    "or WebGPU ran on a software adapter (details.fallback_adapter)",
    "unsupported": "cannot run here: the platform, device or provider is absent, or the case does not apply",
    "mismatch": "ran, but the outputs differ from the reference beyond the tolerance",
    "timeout": "the worker made no progress within --timeout",
    "oom": "out of memory",
    "error": "failed with an error (message in the evidence)",
    "unsupported_op": "an operator or kernel the target does not implement",
}
# A cell with several cases shows the most serious one (later = more serious).
SEVERITY = ("compatible", "ep_fallback", "unsupported", "mismatch", "timeout", "oom", "error", "unsupported_op")
SYMBOLS = {
    "compatible": "✅",
    "ep_fallback": "⚠️",
    "unsupported": "➖",
    "mismatch": "✗",
    "timeout": "⏱",
    "oom": "💥",
    "error": "❌",
    "unsupported_op": "🚫",
}
# Messages of `unsupported`/`error` results that name a missing operator or kernel.
UNSUPPORTED_OP_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"NOT_IMPLEMENTED",  # ONNX Runtime status code
        r"Could not find an implementation for",  # ONNX Runtime: no kernel for the node
        r"does not support the following ONNX operations",  # OpenVINO frontend
        r"\bunsupported (?:onnx )?(?:op|ops|operator|operators|operation|operations|kernel|layer)\b",
        r"\b(?:op|ops|operator|operation|kernel|layer)\b[^\n]{0,160}?\bnot (?:supported|implemented)\b",
        r"\bno (?:kernel|implementation) (?:is )?(?:registered|found)\b",
    )
]


def matrix_target(row: dict[str, Any]) -> str:
    """The row's column: the target, and the mode when it is not inference."""
    label = f"{row['hardware']}/{row['engine']}"
    label = f"{label}:{row['provider']}" if row["hardware"] == row["engine"] and row.get("provider") else label
    if row.get("native_threads") is not None:  # --native-threads: each count a column, to pair with wasm's
        label += threads_part(row.get("provider") or "")
    label = labels.on_device(label, row)  # each served device is a column of its own
    mode = mode_of(row)
    return label if mode == "inference" else f"{label} ({mode})"


def _column_order(row: dict[str, Any]) -> tuple[int, bool, str]:
    """Inference columns first, then each mode's; within a mode, cpu/torch first."""
    return (MODES.index(mode_of(row)), not labels.is_baseline(row), matrix_target(row))


def classify(row: dict[str, Any]) -> str:
    """The matrix class of one result (see CLASSES)."""
    status = row["status"]
    if status == "ok":
        details = details_of(row)
        return "ep_fallback" if details.get("cpu_fallback") or details.get("fallback_adapter") else "compatible"
    if status in ("unsupported", "error"):
        if any(p.search(row.get("error") or "") for p in UNSUPPORTED_OP_PATTERNS):
            return "unsupported_op"
        return status
    return status  # mismatch, timeout, oom


def rate(value: float | None) -> str | None:
    if value is None:
        return None
    for rating, threshold in sorted(RATING_THRESHOLDS.items(), key=lambda item: -item[1]):
        if value >= threshold:
            return rating
    return LOW


@dataclass
class Cell:
    status: str  # the class (see CLASSES)
    rating: str | None
    speedup: float | None  # geometric mean over the ok cases with a cpu/torch pair
    cases: int
    counts: dict[str, int]  # class -> number of cases
    evidence: list[dict[str, Any]] = field(default_factory=list)
    # the closest its cases came to the target's measured ceiling (decode: bandwidth; inference: compute)
    limit: float | None = None

    @property
    def text(self) -> str:
        text = f"{SYMBOLS[self.status]} {self.status}"
        if self.cases > 1 and self.counts.get(self.status, 0) < self.cases:
            text += f" ({self.counts[self.status]}/{self.cases} cases)"
        if self.rating == BASELINE_RATING:
            return text + " · baseline"
        return text + (f" · {self.rating} ({self.speedup:.2f}×)" if self.rating else "")


def _evidence(row: dict[str, Any], status: str, ratio: float | None) -> dict[str, Any]:
    error = (row.get("error") or "").strip().splitlines()
    return {
        "result_id": row["result_id"],
        "run_id": row["run_id"],
        "machine": machine_name(row),
        "date": str(row["created_at"])[:19],
        "model": row["model"],
        "provider": row["provider"],
        "device": row.get("device"),
        "case": f"{case_label(row)} {row['requested_precision']}",
        "status": row["status"],
        "class": status,
        "median_latency_ms": row["latency_p50_ms"],
        "speedup": ratio,
        "limit_fraction": limit_fraction(row),
        "flags": flags(row),
        "error": error[0][:300] if error else None,
        # a generation's speed and, at a precision other than fp32, its quality beside the fp32 model
        "decode_tokens_per_s": row.get("decode_tokens_per_s"),
        "agreement_top1": row.get("agreement_top1"),
        "kl_mean": row.get("kl_mean"),
    }


def _generation_text(item: dict[str, Any]) -> str:
    """', tg N tokens/s, top-1 agreement A, KL K' for a generate row (what was measured of it), else ''."""
    parts = [f"{name} {item[key]:{spec}}" for name, key, spec in (
        ("tg tokens/s", "decode_tokens_per_s", ".1f"), ("top-1 agreement vs fp32", "agreement_top1", ".3f"),
        ("KL vs fp32", "kl_mean", ".4f")) if item.get(key) is not None]  # fmt: skip
    return "".join(f", {part}" for part in parts)


def _cell(rows: list[dict[str, Any]], base: dict, is_baseline: bool) -> Cell:
    classes = [classify(r) for r in rows]
    ratios = [speedup(r, base) for r in rows]
    measured = [s for s in ratios if s is not None]
    value = None if is_baseline or not measured else geometric_mean(measured)
    rating = BASELINE_RATING if is_baseline and "compatible" in classes else rate(value)
    evidence = [_evidence(r, c, None if is_baseline else s) for r, c, s in zip(rows, classes, ratios, strict=True)]
    limits = [f for r in rows if (f := limit_fraction(r)) is not None]
    return Cell(max(classes, key=SEVERITY.index), rating, value, len(rows), dict(Counter(classes)), evidence,
                max(limits, default=None))  # fmt: skip


def latest_results(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The most recent result per (model, target, case); a case includes the provider, precision and mode."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: str(r["created_at"])):
        latest[(*case_key(row), matrix_target(row), row["provider"], row["requested_precision"])] = row
    return list(latest.values())


def build_matrix(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The matrix (plain data, as written to compatibility_matrix.json) from result rows of the store."""
    rows = latest_results(rows)
    base = baselines(rows)
    targets = [column for *_, column in sorted({_column_order(r) for r in rows})]
    baseline_columns = {matrix_target(r) for r in rows if labels.is_baseline(r)}
    by_model: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    by_family: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in sorted(rows, key=lambda r: (r["batch_size"], r["seq_len"] or 0, str(r["provider"]))):
        by_model[(row["family"], row["model"])][matrix_target(row)].append(row)
        by_family[row["family"]][matrix_target(row)].append(row)

    def cells(groups: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        return {t: asdict(_cell(groups[t], base, t in baseline_columns)) for t in targets if t in groups}

    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": sorted({r["run_id"] for r in rows}),
        "results": len(rows),
        "baseline": BASELINE_LABEL,
        "rating_thresholds": RATING_THRESHOLDS,
        "classes": CLASSES,
        "targets": targets,
        "families": {family: {"cells": cells(groups)} for family, groups in sorted(by_family.items())},
        "models": {
            model: {"family": family, "cells": cells(groups)} for (family, model), groups in sorted(by_model.items())
        },
        "browser_cost": browser_cost(rows),  # page ÷ native on the same kernels, one machine's latest rows
    }


def browser_cost(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    paired, unpaired = browser_costs(rows)
    return {"pairs": [asdict(c) for c in paired], "unpaired": [asdict(u) for u in unpaired]}


def cell_text(cell: dict[str, Any]) -> str:
    return Cell(**cell).text


def load_rows(db_path: Path, run: str = ALL_RUNS) -> list[dict[str, Any]]:
    with open_store(db_path, read_only=True) as store:
        if run == ALL_RUNS:
            return store.query(f"SELECT results.*, {MACHINE_COLUMNS} FROM results JOIN runs USING (run_id)")
        return [row for run_id in store.resolve_runs(run) for row in store.results(run_id)]


def matrix_markdown(matrix: dict[str, Any]) -> str:
    """The matrix for people. Models, targets, cases, errors and ids are stored text, possibly from a
    device or a bundle made elsewhere: each goes through markdown_text (md)."""
    targets = matrix["targets"]

    def table(title: str, rows: dict[str, dict[str, Any]], first: str) -> list[str]:
        header = f"| {first} | " + " | ".join(map(md, targets)) + " |"
        lines = [f"## {title}", "", header, "|---" * (len(targets) + 1) + "|"]
        for name, entry in rows.items():
            texts = [md(cell_text(entry["cells"][t])) if t in entry["cells"] else "—" for t in targets]
            label = f"{name} ({entry['family']})" if "family" in entry else name
            lines.append(f"| {md(label)} | " + " | ".join(texts) + " |")
        return [*lines, ""]

    thresholds = ", ".join(f"{name} ≥ {value:g}×" for name, value in RATING_THRESHOLDS.items())
    lines = [
        "# Compatibility Matrix",
        "",
        f"From {matrix['results']} measured results (the latest per model, target and case) of "
        f"{len(matrix['runs'])} run(s); generated {matrix['generated_at']}. Training and generation "
        "results have their own columns, `target (mode)`.",
        f"Rating: speedup vs {matrix['baseline']} p50 on the same model and inputs ({thresholds}, low below).",
        "",
    ]
    if not targets:
        return "\n".join([*lines, "No results in the store yet.", ""])
    lines += table("By Model Family", matrix["families"], "family")
    lines += table("By Model", matrix["models"], "model")
    found = matrix.get("browser_cost") or {}
    cost = cost_table([BrowserCost(**c) for c in found.get("pairs", [])],
                      [Unpaired(**u) for u in found.get("unpaired", [])])  # fmt: skip
    lines += [render_table(cost, "md")] if cost is not None else []
    lines += ["## Classes", "", *(f"- {SYMBOLS[c]} **{c}**: {text}" for c, text in CLASSES.items()), ""]
    lines += ["## Evidence", ""]
    for model, entry in matrix["models"].items():
        for target, cell in entry["cells"].items():
            for item in cell["evidence"]:
                latency = f"{item['median_latency_ms']:.3f} ms" if item["median_latency_ms"] is not None else "—"
                note = md("; ".join([*item["flags"], *([item["error"]] if item["error"] else [])]))
                lines.append(
                    f"- {md(model)} · {md(target)} · {md(item['case'])}: **{item['class']}**, median {latency}"
                    f"{_generation_text(item)}, "
                    f"result {md(item['result_id'])} (run {md(item['run_id'])}, {item['date']})"
                    + (f" — {note}" if note else "")
                )
    return "\n".join([*lines, ""])


def write_matrix(matrix: dict[str, Any], output_dir: Path) -> list[Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = output_dir / MATRIX_JSON, output_dir / MATRIX_MD
    json_path.write_text(json.dumps(matrix, indent=2, default=str))
    md_path.write_text(matrix_markdown(matrix))
    return [json_path, md_path]


def update_matrix(db_path: Path, output_dir: Path, run: str = ALL_RUNS) -> list[Path]:
    """Rebuild compatibility_matrix.json and .md in output_dir from the store (nothing is run)."""
    return write_matrix(build_matrix(load_rows(Path(db_path), run)), Path(output_dir))
