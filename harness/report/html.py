"""A self-contained HTML report: inline CSS, plots inlined as SVG, no scripts, fonts or network requests.

One page covers one run or, for `--run all`, every run in the store (a section per run), followed by
the compatibility matrix of the runs it covers. Every number comes from the store.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from harness.analysis.browser_cost import browser_cost_table
from harness.analysis.machines import across, group_name, machine_name
from harness.analysis.runtimes import runtime_table
from harness.analysis.tables import Table, cell
from harness.core.labels import MARK_STYLES, case_label, details_of, marks, mode_of, target_label, threads_text
from harness.core.records import STATUSES
from harness.report.data import RunReport
from harness.report.generation import generation_html
from harness.report.operators import CSS as OPERATOR_CSS
from harness.report.operators import breakdown_html, ratio_html
from harness.report.roofline import roofline_html

CSS = """
:root { --ok:#1b7f3b; --bad:#b00020; --warn:#9a5b00; --muted:#666; --line:#d9dde3; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color:#1d2329;
       margin: 0; background: #f5f6f8; }
main { max-width: 1280px; margin: 0 auto; padding: 20px 28px 60px; background: #fff; }
h1 { font-size: 26px; margin: 4px 0 4px; } h2 { font-size: 21px; margin: 34px 0 10px; border-bottom: 2px solid #222;
  padding-bottom: 4px; } h3 { font-size: 17px; margin: 26px 0 8px; } h4 { font-size: 15px; margin: 0 0 6px; }
.sub { color: var(--muted); margin: 0 0 12px; } nav a { margin-right: 14px; }
table { border-collapse: collapse; margin: 6px 0 14px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f5; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.gen-text { overflow-wrap: anywhere; min-width: 12em; max-width: 28em; }
tr.failed td { background: #fff6f6; } tr.flagged td { background: #fffbea; }
.facts { display: grid; grid-template-columns: repeat(auto-fit, minmax(360px, 1fr)); gap: 6px 28px; }
.facts table { width: 100%; } .facts th { width: 34%; position: static; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 10px; font-size: 12px; font-weight: 600;
  color: #fff; white-space: nowrap; margin: 1px 2px 1px 0; }
.status-ok { background: var(--ok); } .status-mismatch, .status-error { background: var(--bad); }
.status-oom { background: #6a1b9a; } .status-timeout { background: #c05600; }
.status-unsupported { background: #757575; }
.mark { display: inline-block; padding: 0 6px; border-radius: 4px; font-size: 12px; margin: 1px 3px 1px 0;
  border: 1px solid; }
.mark-mismatch { color: var(--bad); border-color: var(--bad); background: #fde8ec; font-weight: 600; }
.mark-fallback_adapter, .mark-cpu_fallback, .mark-threads_dropped { color: #7a3e00; border-color: #d08a2e;
  background: #fff1dc; font-weight: 600; }
.mark-precision { color: #0d47a1; border-color: #5c8fd6; background: #e6f0ff; font-weight: 600; }
.mark-noisy, .mark-budget_stopped { color: #555; border-color: #aaa; background: #f3f3f3; }
.table-scroll { overflow-x: auto; max-width: 100%; margin: 6px 0 14px; }
.table-scroll > table { margin: 0; }
table.results { width: 100%; } table.results td { overflow-wrap: break-word; }
table.results td.flags { min-width: 170px; overflow-wrap: normal; } table.results td.name { white-space: nowrap; }
table.ratios { display: block; overflow-x: auto; max-width: 100%; }
tr.error-row td { color: var(--bad); font-size: 12px; padding-left: 24px; border-top: none; overflow-wrap: anywhere; }
figure.plot { margin: 18px 0 26px; padding: 12px 14px; border: 1px solid var(--line); border-radius: 6px; }
figure.plot svg { width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 6px; }
.omitted { color: var(--muted); font-style: italic; border-left: 3px solid #ccc; padding: 2px 10px; }
td.cls { font-weight: 600; min-width: 130px; } td.cls small { font-weight: 400; display: block; }
.cls-compatible { background: #dcf3e3; } .cls-ep_fallback { background: #fff1dc; }
.cls-unsupported { background: #eeeeee; color: #555; } .cls-mismatch, .cls-error { background: #fde8ec; }
.cls-oom { background: #f1e4f7; } .cls-timeout { background: #ffe9d6; } .cls-unsupported_op { background: #f9d4d4; }
.legend li { margin: 2px 0; }
"""


def scrolling(table: str) -> str:
    """A table that scrolls inside its own box when it is wider than the page, rather than overflowing it
    (or, at the page's edge, cutting its last column off)."""
    return f'<div class="table-scroll">{table}</div>'


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _sci(value: float | None) -> str:
    return "—" if value is None else f"{value:.2g}"


def _badge(status: str) -> str:
    return f'<span class="badge status-{escape(status)}">{escape(status)}</span>'


def mark_badges(row: dict[str, Any]) -> str:
    return "".join(
        f'<span class="mark mark-{kind}">{escape(MARK_STYLES[kind].code)} · {escape(text)}</span>'
        for kind, text in marks(row)
    )


def inline_svg(svg: str, prefix: str) -> str:
    """matplotlib's SVG without the XML prologue, its ids made unique within the page."""
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg[svg.index("<svg") :], flags=re.DOTALL)
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', svg)
    svg = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', svg)
    return re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", svg)


def _facts(report: RunReport) -> str:
    run, host = report.run, report.host
    load = ", ".join(f"{x:.2f}" for x in host.get("load_avg_at_start", [])) or "—"
    counts = Counter(r["status"] for r in report.results)
    flagged = Counter(kind for r in report.results for kind, _ in marks(r))
    system = [
        ("Machine", f"{machine_name(run)} · {run.get('hardware_class') or 'unknown hardware class'}"),
        ("Host", run.get("hostname")),
        ("Platform", run["platform"]),
        ("Processor", f"{run['cpu_model']} ({run['cpu_cores']} logical cores)"),
        ("Memory", f"{run['memory_gb']} GB"),
        ("Python", run["python_version"]),
        ("accelharness", f"{run['harness_version']} (git {run['git_sha'] or 'unknown'})"),
        ("Load average at start", load),
    ]
    outcome = [
        ("Command", run.get("command")),
        ("Status", run["status"]),
        ("Started / finished", f"{run['started_at']} / {run['finished_at'] or '—'}"),
        ("Results", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"),
        ("Marked", ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(flagged.items())) or "none"),
    ]
    hardware = "".join(
        f"<tr><td>{escape(h['platform'])}</td><td>{'yes' if h['available'] else 'no'}</td>"
        f"<td>{escape(h['device_name'] or '')}</td><td>{escape(h['reason'] or '')}</td></tr>"
        for h in report.hardware
    )

    def facts_table(items: list[tuple[str, Any]]) -> str:
        return "<table>" + "".join(f"<tr><th>{k}</th><td>{escape(str(v))}</td></tr>" for k, v in items) + "</table>"

    return (
        f'<div class="facts">{facts_table(system)}{facts_table(outcome)}</div>'
        "<h3>Hardware</h3><table><tr><th>platform</th><th>available</th><th>device</th><th>reason</th></tr>"
        f"{hardware or '<tr><td colspan=4>none recorded</td></tr>'}</table>"
    )


def _results(report: RunReport) -> str:
    header = "".join(
        f"<th>{h}</th>"
        for h in (
            "model", "target", "case", "precision", "status", "p50 ms", "p90 ms", "p99 ms", "items/s",
            "peak MB", "max |diff|", "flags",
        )
    )  # fmt: skip
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in report.results:
        families[row["family"]].append(row)
    parts = []
    for family, rows in sorted(families.items()):
        body = []
        for r in rows:
            kind = "failed" if r["status"] != "ok" else "flagged" if marks(r) else ""
            error = (r["error"] or "").strip()
            body.append(
                f'<tr class="{kind}"><td class="name">{escape(r["model"])}</td>'
                f"<td>{escape(target_label(r))}{_threads(r)}</td>"
                f'<td class="name">{escape(case_label(r))}</td><td class="name">{escape(r["precision"])}</td>'
                f"<td>{_badge(r['status'])}</td>"
                f'<td class="num">{_fmt(r["latency_p50_ms"])}</td><td class="num">{_fmt(r["latency_p90_ms"])}</td>'
                f'<td class="num">{_fmt(r["latency_p99_ms"])}</td><td class="num">{_fmt(r["throughput_per_s"], 1)}</td>'
                f'<td class="num">{_fmt(r["memory_peak_mb"], 1)}</td><td class="num">{_sci(r["max_abs_diff"])}</td>'
                f'<td class="flags">{mark_badges(r)}</td></tr>'
            )
            if error:
                short = escape(error[:400]) + "…" * (len(error) > 400)
                body.append(f'<tr class="{kind} error-row"><td colspan="12" title="{escape(error)}">{short}</td></tr>')
        title = escape(family.replace("_", " ").title())
        table = f'<table class="results"><tr>{header}</tr>{"".join(body)}</table>'
        parts.append(f"<h4>{title}</h4>{scrolling(table)}")
    return "".join(parts) or '<p class="omitted">The run has no results.</p>'


def _threads(row: dict[str, Any]) -> str:
    """A native row's threads under its target (the browser's are in its label)."""
    text = threads_text(row)
    return f"<br><small>{escape(text)}</small>" if text else ""


def _devices(report: RunReport) -> str:
    """The devices served by `web --serve`: what each one is (as its page reported it) and its own results."""
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in report.results:
        if row.get("device"):
            by_device[row["device"]].append(row)
    parts = []
    for device, rows in sorted(by_device.items()):
        facts = details_of(rows[0])
        items = [(label, _fact(value)) for label, value in _device_facts(facts) if value not in (None, "")]
        table = "".join(f"<tr><th>{k}</th><td>{escape(v)}</td></tr>" for k, v in items)
        parts.append(
            f'<h4>{escape(facts.get("device_name") or device)} <small class="sub">{escape(device)}</small></h4>'
            f'<div class="facts"><table>{table}</table></div>{_results(replace(report, results=rows))}'
        )
    return f"<h3>Devices</h3>{''.join(parts)}" if parts else ""


def _fact(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _device_facts(facts: dict[str, Any]) -> list[tuple[str, Any]]:
    adapter = facts.get("webgpu_adapter_report") or {}
    info = adapter.get("info") or {}
    gpu = " ".join(str(info[k]) for k in ("vendor", "architecture", "description") if info.get(k))
    gpu = (gpu or "an adapter") + (" (software fallback)" if info.get("isFallbackAdapter") else "")
    webnn = facts.get("webnn_contexts") or {}
    contexts = ", ".join(f"{kind}: {'made' if v.get('available') else 'failed'}" for kind, v in webnn.items())
    secure = facts.get("secure_context")
    return [
        ("User agent", facts.get("user_agent")),
        ("Platform", facts.get("platform")),
        ("Model", (facts.get("user_agent_data") or {}).get("model")),
        ("Logical cores", facts.get("hardware_concurrency")),
        ("Device memory (GB, as the browser rounds it)", facts.get("device_memory_gb")),
        ("WebGPU adapter", gpu if adapter.get("available") else adapter.get("error")),
        ("WebNN contexts", contexts),
        ("Cross-origin isolated", facts.get("cross_origin_isolated")),
        ("Secure context", f"no: {facts.get('secure_context_note')}" if secure is False else secure),
        ("Timer step (ms)", facts.get("timer_resolution_ms")),
        ("Loaded from", facts.get("page_origin")),
        ("Client address", facts.get("client_address")),
    ]


def _plots(report: RunReport, anchor: str) -> str:
    from harness.report.plots import render_plots

    parts = []
    if any(mode_of(r) not in ("inference", "generate") for r in report.results):
        parts.append('<p class="sub">The plots show inference and generation results; training rows are in the '
                     "tables above.</p>")  # fmt: skip
    for plot in render_plots(report):
        if plot.figure is None:
            parts.append(f'<p class="omitted">{escape(plot.title)}: not drawn — {escape(plot.note or "")}.</p>')
            continue
        parts.append(
            f'<figure class="plot" id="{anchor}-{plot.key}"><h4>{escape(plot.title)}</h4>'
            f"{inline_svg(plot.svg(), f'{anchor}-{plot.key}')}<figcaption>{escape(plot.caption)}</figcaption></figure>"
        )
    return "".join(parts)


def _time_breakdown(report: RunReport) -> str:
    """Where the time goes (--profile runs): per profiled result, and per op type between targets."""
    breakdown = breakdown_html(report.results, report.operators)
    if not breakdown:
        return ""
    ratios = ratio_html(report.results, report.operators)
    ratios = f"<h4>The same ONNX file on two targets</h4>{ratios}" if ratios else ""
    return f"<h3>Where the time goes</h3>{breakdown}{ratios}"


def _legend() -> str:
    items = "".join(
        f'<li><span class="mark mark-{kind}">{escape(style.code)}</span> {escape(style.legend.split(": ", 1)[1])}</li>'
        for kind, style in MARK_STYLES.items()
    )
    return (
        '<ul class="legend">'
        f"{items}<li>In plots the same letters sit on the bar, point or box; marked bars are hatched, noisy ones "
        "faded, mismatches outlined in red. Failed results are named where their bar would be.</li></ul>"
    )


def matrix_html(matrix: dict[str, Any]) -> str:
    from harness.analysis.matrix import CLASSES, RATING_THRESHOLDS

    targets = matrix["targets"]
    if not targets:
        return '<p class="omitted">No results to build the compatibility matrix from.</p>'

    def cell(entry: dict[str, Any] | None) -> str:
        if entry is None:
            return "<td>—</td>"
        status, cases = entry["status"], entry["cases"]
        share = f" ({entry['counts'][status]}/{cases})" if cases > 1 and entry["counts"][status] < cases else ""
        rating = entry["rating"] or "no rating"
        rating += f" · {entry['speedup']:.2f}×" if entry["speedup"] is not None else ""
        evidence = "\n".join(
            f"{e['model']} {e['case']} {e['provider']}: {e['class']}, p50 {_fmt(e['median_latency_ms'])} ms, "
            f"result {e['result_id'][:12]} ({e['date']})"
            + (f" — {e['error']}" if e["error"] else "")
            + (f", {e['limit_fraction']:.1%} of its ceiling" if e.get("limit_fraction") is not None else "")
            for e in entry["evidence"]
        )
        return (
            f'<td class="cls cls-{status}" title="{escape(evidence)}">{escape(status)}{share}'
            f"<small>{escape(rating)}</small></td>"
        )

    def table(first: str, rows: dict[str, dict[str, Any]]) -> str:
        head = f"<tr><th>{first}</th>" + "".join(f"<th>{escape(t)}</th>" for t in targets) + "</tr>"
        body = "".join(
            f"<tr><th>{escape(name)}" + (f" <small>({escape(e['family'])})</small>" if "family" in e else "") + "</th>"
            + "".join(cell(e["cells"].get(t)) for t in targets) + "</tr>"
            for name, e in rows.items()
        )  # fmt: skip
        return scrolling(f"<table>{head}{body}</table>")

    thresholds = ", ".join(f"{name} ≥ {value:g}×" for name, value in RATING_THRESHOLDS.items())
    classes = "".join(f'<li><span class="mark cls-{c}">{c}</span> {escape(t)}</li>' for c, t in CLASSES.items())
    return (
        f'<p class="sub">{matrix["results"]} results (the latest per model, target and case) from '
        f"{len(matrix['runs'])} run(s). Rating: speedup vs {matrix['baseline']} p50 on the same inputs "
        f"({thresholds}, low below). Hover a cell for its evidence.</p>"
        f"<h3>By model family</h3>{table('family', matrix['families'])}"
        f"<h3>By model</h3>{table('model', matrix['models'])}<ul class='legend'>{classes}</ul>"
    )


def _across_machines(reports: list[RunReport]) -> str:
    """Runs from several machines: each case's latency per machine (and per hardware class, when
    machines share one), side by side above the runs."""
    runs = [(report.run, report.results) for report in reports]
    machines = {machine_name(run) for run, _ in runs}
    if len(machines) < 2:
        return ""
    tables = [across(runs, "machine")]
    if len({group_name(run, "hardware-class") for run, _ in runs}) < len(machines):
        tables.append(across(runs, "hardware-class"))
    return '<section id="machines">' + "".join(_table_html(table) for table in tables) + "</section>"


def _table_html(table: Table) -> str:
    head = "".join(f"<th>{escape(column)}</th>" for column in table.columns)
    body = "".join(
        "<tr>" + "".join(_across_cell(row.get(column)) for column in table.columns) + "</tr>" for row in table.rows
    )
    notes = "".join(f'<p class="sub">{escape(note)}</p>' for note in table.notes)
    rows = f'<table class="results"><tr>{head}</tr>{body}</table>'
    return f"<h2>{escape(table.title)}</h2>{notes}{scrolling(rows)}"


def _runtimes(report: RunReport) -> str:
    """Which runtime? Generation ranked across native engines and page runtimes (harness.analysis.runtimes)."""
    table = runtime_table(report.results)
    return "" if table is None else f'<section class="runtimes">{_table_html(table)}</section>'


def _browser_cost(report: RunReport) -> str:
    """Page ÷ native for the cases the run measured on the same kernels both ways (harness.analysis.browser_cost)."""
    table = browser_cost_table(report.results)
    return "" if table is None else f'<section class="browser-cost">{_table_html(table)}</section>'


def _across_cell(value: Any) -> str:
    if isinstance(value, float):
        return f'<td class="num">{value:.3f}</td>'
    return f"<td>{_badge(value) if value in STATUSES else escape(cell(value))}</td>"


def render_page(reports: list[RunReport], matrix: dict[str, Any], title: str) -> str:
    sections, nav = [], []
    for report in reports:
        run_id = report.run["run_id"]
        anchor = "run-" + re.sub(r"[^A-Za-z0-9_-]", "-", run_id)
        nav.append(f'<a href="#{anchor}">{escape(run_id)}</a>')
        sections.append(
            f'<section class="run" id="{anchor}"><h2>Run {escape(run_id)}</h2>'
            f"<h3>System</h3>{_facts(report)}{_devices(report)}<h3>Results</h3>{_results(report)}"
            f"{generation_html(report)}{_runtimes(report)}{_browser_cost(report)}{roofline_html(report, inline_svg)}"
            f"<h3>Plots</h3>{_plots(report, anchor)}{_time_breakdown(report)}</section>"
        )
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}{OPERATOR_CSS}</style></head><body><main>"
        f'<h1>{escape(title)}</h1><p class="sub">Generated {generated} from the DuckDB store; every number '
        "is measured.</p>"
        f'<nav>{"".join(nav)}<a href="#matrix">compatibility matrix</a></nav>'
        f"<h3>Marks</h3>{_legend()}{_across_machines(reports)}{''.join(sections)}"
        f'<section id="matrix"><h2>Compatibility Matrix</h2>{matrix_html(matrix)}</section>'
        "</main></body></html>\n"
    )


def write_html_page(reports: list[RunReport], path: Path) -> None:
    from harness.analysis.matrix import build_matrix

    matrix = build_matrix([row for report in reports for row in report.results])
    if len(reports) == 1:
        title = f"Hardware Benchmark Report - {reports[0].run['run_id']}"
    else:
        title = f"Hardware Benchmark Report - {len(reports)} runs"
    path.write_text(render_page(reports, matrix, title))


def write_html(report: RunReport, path: Path) -> None:
    write_html_page([report], path)
