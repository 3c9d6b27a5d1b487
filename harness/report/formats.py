"""Serialisations of a RunReport: JSON (everything), CSV (results), Markdown (for people)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from statistics import geometric_mean
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.report.plots import Plot

from harness.analysis.browser_cost import browser_cost_table, browser_costs
from harness.analysis.runtimes import runtime_table
from harness.analysis.tables import render_table
from harness.core.escaping import csv_cell, markdown_text
from harness.core.generation import DECODE_RATE, PREFILL_RATE
from harness.core.labels import BASELINE_LABEL, case_label, flags, target_label, threads_text
from harness.core.paths import inside, safe_name
from harness.core.records import MEASURED
from harness.report.data import RunReport
from harness.report.generation import TEXT_COLUMNS, WER_HEADER, quality_cells, wer_text


def write_json(report: RunReport, path: Path) -> None:
    results = [dict(r, details=json.loads(r["details"]) if r["details"] else {}) for r in report.results]
    paired, unpaired = browser_costs(report.results)
    cost = {"pairs": [asdict(c) for c in paired], "unpaired": [asdict(u) for u in unpaired]}
    document = {"run": dict(report.run, host=report.host), "hardware": report.hardware, "results": results,
                "browser_cost": cost, "ceilings": report.ceilings}  # fmt: skip
    path.write_text(json.dumps(document, indent=2, default=str))


def write_csv(report: RunReport, path: Path) -> None:
    with path.open("w", newline="") as handle:
        if not report.results:
            return
        writer = csv.DictWriter(handle, fieldnames=list(report.results[0]))
        writer.writeheader()  # the column names are the store's own
        writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in report.results)


def _fmt(value: float | str | None, digits: int | None = 2) -> str:
    """A number to `digits` places; a text (digits None) as it is; NULL as a dash."""
    return "—" if value is None else str(value) if digits is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; every header and cell escaped (markdown_text): they hold stored text."""
    lines = ["| " + " | ".join(map(markdown_text, header)) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(markdown_text, row)) + " |" for row in rows]


def _cell(row: dict[str, Any] | None, column: str, digits: int = 2) -> str:
    if row is None:
        return "—"
    if row["status"] not in MEASURED:
        return row["status"]
    text = _fmt(row[column], digits)
    if row["status"] == "mismatch":
        return text + " ✗"
    return text + (" ⚠" if flags(row) else "")


def _family_section(family: str, rows: list[dict[str, Any]]) -> list[str]:
    targets = sorted({target_label(r) for r in rows})
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        by_key[(r["model"], case_label(r))][target_label(r)] = r
    lines = [f"### {markdown_text(family.replace('_', ' ').title())} Models", ""]
    for title, column, digits in (
        ("Latency Comparison (p50 ms)", "latency_p50_ms", 3),
        ("Throughput Comparison (items/sec)", "throughput_per_s", 1),
    ):
        body = [
            [model, case, *(_cell(cells.get(t), column, digits) for t in targets)]
            for (model, case), cells in sorted(by_key.items())
        ]
        lines += [f"#### {title}", "", *_table(["Model", "Case", *targets], body), ""]
    speedups = _speedups(by_key, targets)
    if speedups:
        lines += ["#### Relative Performance (vs cpu/torch, geometric mean of p50 ratios)", ""]
        lines += _table(
            ["Target", "Speedup Factor", "Cases"], [[t, f"{s:.2f}x", str(n)] for t, (s, n) in speedups.items()]
        )
        lines.append("")
    return lines


def _speedups(by_key: dict, targets: list[str]) -> dict[str, tuple[float, int]]:
    ratios: dict[str, list[float]] = defaultdict(list)
    for cells in by_key.values():
        base = cells.get(BASELINE_LABEL)
        if base is None or base["status"] != "ok" or not base["latency_p50_ms"]:
            continue
        for target in targets:
            row = cells.get(target)
            if target != BASELINE_LABEL and row and row["status"] == "ok" and row["latency_p50_ms"]:
                ratios[target].append(base["latency_p50_ms"] / row["latency_p50_ms"])
    return {t: (geometric_mean(v), len(v)) for t, v in sorted(ratios.items())}


def _problems(report: RunReport) -> list[str]:
    lines = []
    for r in report.results:
        where = markdown_text(f"{r['model']} on {target_label(r)} ({case_label(r)})")
        if r["status"] != "ok":
            lines.append(f"- **{markdown_text(r['status'])}** {where}: {markdown_text(r['error'])}")
        elif marks := flags(r):
            lines.append(f"- ⚠ {where}: {markdown_text('; '.join(marks))}")
    return lines


# mode → (section title, [(column header, row field, digits)]): generation and training rows, kept
# apart from inference: one generate() call or one optimizer step is not comparable with one forward pass.
MODE_SECTIONS = {
    "generate": (
        "Generation (time to first token, then prefill (pp) and decode (tg) rates, never mixed)",
        [
            ("TTFT p50 ms", "ttft_ms", 3),
            (PREFILL_RATE, "prefill_tokens_per_s", 1),
            (DECODE_RATE, "decode_tokens_per_s", 1),
            ("TPOT p50 ms", "tpot_ms", 3),
            ("TPOT p90 ms", "tpot_p90_ms", 3),
            ("e2e p50 ms", "latency_p50_ms", 3),
            ("tokens = native ORT", "tokens_matched", 0),
            ("top-1 agreement vs fp32", "agreement_top1", 3),
            ("KL vs fp32", "kl_mean", 4),
            ("first divergence vs fp32", "first_divergence", None),  # where its tokens leave fp32's ("none": never)
            ("PPL (passage)", "perplexity", 2),  # on the harness's passage (harness.prepare.perplexity)
            ("PPL ÷ fp32", "perplexity_ratio", 4),
            ("KL passage", "kl_passage", 5),
            ("tokens checked on", "token_reference", None),
            ("tg GB/s", "achieved_gbps", 3),  # bytes per decode token x tg tokens/s (docs/measurement.md)
            ("of bandwidth ceiling", "bandwidth_fraction", 3),
            ("encoder p50 ms", "encoder_ms", 3),
        ],
    ),
    "training": (
        "Training (forward + backward + optimizer step)",
        [
            ("step p50 ms", "latency_p50_ms", 3),
            ("samples/s", "throughput_per_s", 1),
            ("peak RSS MB", "memory_peak_mb", 0),
        ],
    ),
}


# columns only some models measure (an encoder–decoder's encoder): shown where a row of the table has one
WHERE_MEASURED = ("encoder_ms",)


def _target(row: dict[str, Any]) -> str:
    """The target, with a native row's threads (the browser's are in its label)."""
    threads = threads_text(row)
    return f"{target_label(row)} ({threads})" if threads else target_label(row)


def _mode_sections(results: list[dict[str, Any]]) -> list[str]:
    """One table per non-inference mode present in the results (MODE_SECTIONS)."""
    lines: list[str] = []
    for mode, (title, columns) in MODE_SECTIONS.items():
        rows = [r | quality_cells(r) for r in results if r.get("mode") == mode]  # details' figures as cells
        if not rows:
            continue
        columns = [c for c in columns if c[1] not in WHERE_MEASURED or any(r.get(c[1]) is not None for r in rows)]
        texts = TEXT_COLUMNS if mode == "generate" else ()  # the EOS policy, prompt and output text
        header = ["Model", "Target", "Case", *(name for name, _, _ in columns), "status", *(n for n, _ in texts)]
        cells = [
            [r["model"], _target(r), case_label(r), *(_fmt(r.get(f), d) for _, f, d in columns), r["status"],
             *(shown(r) for _, shown in texts)]
            for r in rows
        ]  # fmt: skip
        lines += [f"### {title}", "", *_table(header, cells), ""]
    return lines + _speech_section(results)


SPEECH_COLUMNS = [("audio s", None, 1), ("encoder p50 ms", "encoder_ms", 3), ("TTFT p50 ms", "ttft_ms", 3),
                  (DECODE_RATE, "decode_tokens_per_s", 1), ("e2e p50 ms", "latency_p50_ms", 3),
                  ("real-time factor", "real_time_factor", 1)]  # fmt: skip


def _speech_section(results: list[dict[str, Any]]) -> list[str]:
    """Speech-to-text per target: the real-time factor (audio seconds over processing seconds, above 1 faster
    than real time) beside the phases it comes from."""
    rows = [r for r in results if r.get("real_time_factor") is not None]
    if not rows:
        return []
    header = ["Model", "Target", "Case", *(name for name, _, _ in SPEECH_COLUMNS), WER_HEADER, "status"]
    cells = [[r["model"], target_label(r), case_label(r), _fmt(_details(r).get("audio_seconds"), 1),
              *(_fmt(r.get(f), d) for _, f, d in SPEECH_COLUMNS[1:]), wer_text(r, results), r["status"]]
             for r in rows]  # fmt: skip
    title = "### Speech (audio seconds ÷ processing seconds: the real-time factor; above 1 is faster than real time)"
    sources = sorted({f"{d['wer_reference']}; {d['wer_normalizer']}" for r in rows
                      if "wer_reference" in (d := _details(r))})  # fmt: skip
    note = [f"WER: word error rate of the output text against {markdown_text(s)}" for s in sources]
    return [title, "", *_table(header, cells), "", *(f"{line}." for line in note), *([""] if note else [])]


def _details(row: dict[str, Any]) -> dict[str, Any]:
    details = row.get("details")
    if isinstance(details, str):
        try:
            details = json.loads(details)
        except ValueError:
            return {}
    return details if isinstance(details, dict) else {}


def write_markdown(report: RunReport, path: Path) -> None:
    """The run for people; every stored text in it escaped (markdown_text): it may come from elsewhere."""
    run, host = {k: markdown_text(v) if isinstance(v, str) else v for k, v in report.run.items()}, report.host
    lines = [
        f"# Hardware Benchmark Report - {run['run_id']}",
        "",
        "## System Information",
        f"- **Platform**: {run['platform']}",
        f"- **Processor**: {run['cpu_model']} ({run['cpu_cores']} logical cores)",
        f"- **Memory**: {run['memory_gb']} GB",
        f"- **Python Version**: {run['python_version']}",
        f"- **accelharness**: {run['harness_version']} (git {run['git_sha'] or 'unknown'})",
        f"- **Load average at start**: {', '.join(f'{x:.2f}' for x in host.get('load_avg_at_start', []))}",
        f"- **Run**: {run['status']}, started {run['started_at']}, finished {run['finished_at']}",
        "",
        "## Available Hardware",
    ]
    for hw in report.hardware:
        mark = "✅ Available" if hw["available"] else "❌ Not available"
        lines.append(f"- **{markdown_text(hw['platform'])}**: {mark} — {markdown_text(hw['reason'])}")
    lines += ["", "## Benchmark Results", ""]
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in report.results:
        if (r.get("mode") or "inference") == "inference":
            families[r["family"]].append(r)
    for family, rows in sorted(families.items()):
        lines += _family_section(family, rows)
    lines += _mode_sections(report.results)
    if (ranking := runtime_table(report.results)) is not None:  # which runtime: every engine's generation ranked
        lines += [render_table(ranking, "md")]
    if (cost := browser_cost_table(report.results)) is not None:  # page ÷ native on the same kernels
        lines += [render_table(cost, "md")]
    weights = sorted({f"{r['model']}: {r['weights']}" for r in report.results})
    lines += ["## Weights", "", *(f"- {markdown_text(w)}" for w in weights), ""]
    problems = _problems(report)
    lines += [
        "## Failures and Flags",
        "",
        "✗ output mismatch, ⚠ flagged (listed below).",
        "",
        *(problems or ["- none"]),
        "",
    ]
    lines += markdown_plot_links(report, path)
    path.write_text("\n".join(lines))


def write_pngs(report: RunReport, directory: Path) -> list[tuple[Plot, Path | None]]:
    """Write each drawn plot as directory/<key>.png; returns (plot, path) pairs, notes included as path None."""
    from harness.report.plots import render_plots  # matplotlib only when Markdown is written

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in render_plots(report):
        path = directory / f"{plot.key}.png" if plot.figure is not None else None
        if path is not None:
            path.write_bytes(plot.png())
        written.append((plot, path))
    return written


def markdown_plot_links(report: RunReport, markdown_path: Path) -> list[str]:
    """A '## Plots' section linking the PNGs, written to <run_id>-plots/ (the id's safe_name) next to the
    Markdown file."""
    directory = inside(markdown_path.parent, f"{safe_name(report.run['run_id'])}-plots")
    lines = ["## Plots", ""]
    for plot, path in write_pngs(report, directory):
        if path is None:
            lines += [f"- {plot.title}: not drawn — {plot.note}.", ""]
        else:
            lines += [f"### {plot.title}", "", f"![{plot.title}]({directory.name}/{path.name})", "", plot.caption, ""]
    return lines
