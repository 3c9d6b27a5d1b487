"""The roofline of each target a run measured ceilings on: every row's achieved GFLOP/s against its arithmetic
intensity (FLOPs per byte its graph reads), under the roof the target's own measured ceilings draw
(min(compute ceiling, bandwidth ceiling x intensity)), and a table of how close each row comes. Where the target
measured bandwidth_large (its graph's tensors past any last-level cache) its roof is drawn beside, dashed: the limit of
a model whose bytes do not fit in a cache; the rows' fractions stay the in-cache ceiling's (harness.store).

Generate rows are drawn at their decode step (bytes and FLOPs per decode token, x tg tokens/s): the phase a
memory-bound roof limits. Inference rows at their item's (per item, x items/s). Nothing is drawn without a
measured ceiling and a counted row; the figures are the store's (harness.store.roofline_sql)."""

from __future__ import annotations

import io
from collections import defaultdict
from html import escape
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure

from harness.core.labels import case_label, short_target, target_key
from harness.core.roofline import BANDWIDTH_CLASS, BANDWIDTH_KINDS, UNITS, working_set_bytes
from harness.report.data import RunReport

Row = dict[str, Any]


def _point(row: Row) -> tuple[float, float] | None:
    """(FLOPs per byte, achieved GFLOP/s) of a row's decode step (generate) or item (inference)."""
    if row.get("mode") == "generate":
        flops, moved, rate = row.get("flops_per_token"), row.get("bytes_per_token"), row.get("decode_tokens_per_s")
    else:
        flops, moved, rate = row.get("flops_per_item"), row.get("bytes_per_item"), row.get("throughput_per_s")
    if not (flops and moved and rate):
        return None
    return flops / moved, flops * rate / 1e9


def _measured(ceilings: list[Row]) -> dict[tuple[Any, ...], dict[tuple[str, str], Row]]:
    """Per target, the latest measured ceiling of each (kind, precision class)."""
    found: dict[tuple[Any, ...], dict[tuple[str, str], Row]] = defaultdict(dict)
    for ceiling in ceilings:  # in the order they were taken: a later one replaces an earlier
        if ceiling.get("value"):
            found[target_key(ceiling)][(ceiling["kind"], ceiling["precision"])] = ceiling
    return found


def _figure(label: str, roofs: dict[tuple[str, str], Row], rows: list[Row]) -> Figure | None:
    bandwidth = roofs.get(("bandwidth", BANDWIDTH_CLASS))
    points = [(row, p) for row in rows if (p := _point(row)) is not None]
    if bandwidth is None or not points:
        return None
    figure = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = figure.add_subplot()
    xs = [p[0] for _, p in points]
    low, high = min([*xs, 0.01]) / 4, max([*xs, 100.0]) * 4
    grid = [low * (high / low) ** (i / 200) for i in range(201)]
    computes = {k[1]: c for k, c in roofs.items() if k[0] == "compute"} or {"": None}
    for name, compute in computes.items():
        peak = compute["value"] if compute else float("inf")
        roof = [min(peak, bandwidth["value"] * x) for x in grid]
        ax.plot(
            grid,
            roof,
            label=f"roof: {bandwidth['value']:.3g} GB/s" + (f", {name} {peak:.3g} GFLOP/s" if compute else ""),
        )
    _large_roof(ax, grid, roofs)
    for row, (x, y) in points:
        ax.scatter([x], [y], s=18, zorder=3)
        ax.annotate(case_label(row), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte read)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(label + (" (software adapter)" if bandwidth.get("software_adapter") else ""))
    ax.legend(fontsize=6)
    return figure


def _large_roof(ax: Any, grid: list[float], roofs: dict[tuple[str, str], Row]) -> None:
    """bandwidth_large's roof, dashed, under the highest compute ceiling: where a model past the cache is held."""
    large = roofs.get(("bandwidth_large", BANDWIDTH_CLASS))
    if large is None:
        return
    peak = max((c["value"] for k, c in roofs.items() if k[0] == "compute"), default=float("inf"))
    ax.plot(grid, [min(peak, large["value"] * x) for x in grid], linestyle="--",
            label=f"past the cache: {large['value']:.3g} GB/s ({_working_set(large)})")  # fmt: skip


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def _fraction(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def _working_set(ceiling: Row) -> str:
    return f"{working_set_bytes(ceiling['amount']) / 2**20:,.0f} MiB live"


def _note(ceiling: Row) -> str:
    """Why a ceiling has no value, else its graph (a bandwidth graph's live bytes), whether it was reused, and a
    software adapter's mark."""
    if ceiling["error"]:
        return str(ceiling["error"])
    live = [_working_set(ceiling)] if ceiling["kind"] in BANDWIDTH_KINDS else []
    notes = [str(ceiling["workload"]), *live]
    if ceiling.get("reused_from"):
        notes.append(f"reused from run {ceiling['reused_from']} (measured {ceiling['measured_at']})")
    return "; ".join(notes + (["software adapter"] if ceiling["software_adapter"] else []))


def _ceiling_rows(ceilings: list[Row]) -> str:
    body = "".join(
        f"<tr><td>{escape(short_target(c))}</td><td>{escape(c['kind'])}</td><td>{escape(c['precision'])}</td>"
        f"<td class='num'>{_number(c['value'])} {UNITS.get(c['kind'], '')}</td>"
        f"<td class='num'>±{_fraction(c['spread'])}</td><td class='num'>{c['iterations']}</td>"
        f"<td>{escape(_note(c))}</td></tr>"
        for c in ceilings
    )  # fmt: skip
    # scrolls inside its own box when wider than the page (harness.report.html's .table-scroll)
    return ("<div class='table-scroll'><table class='results'><tr><th>target</th><th>ceiling</th><th>class</th>"
            f"<th>measured</th><th>spread</th><th>runs</th><th>note</th></tr>{body}</table></div>")  # fmt: skip


def _result_rows(rows: list[Row]) -> str:
    body = "".join(
        f"<tr><td>{escape(r['model'])}</td><td>{escape(short_target(r))}</td><td>{escape(case_label(r))}</td>"
        f"<td>{escape(r['precision'])}</td><td class='num'>{_number(r.get('achieved_gbps'))}</td>"
        f"<td class='num'>{_fraction(r.get('bandwidth_fraction'))}</td>"
        f"<td class='num'>{_number(r.get('achieved_gflops'))}</td>"
        f"<td class='num'>{_fraction(r.get('compute_fraction'))}</td></tr>"
        for r in rows
        if r.get("achieved_gbps") is not None or r.get("achieved_gflops") is not None
    )  # fmt: skip
    if not body:
        return ""
    return ("<div class='table-scroll'><table class='results'><tr><th>model</th><th>target</th><th>case</th>"
            "<th>precision</th><th>achieved GB/s</th><th>of bandwidth</th><th>achieved GFLOP/s</th><th>of compute</th>"
            f"</tr>{body}</table></div>")  # fmt: skip


def roofline_html(report: RunReport, inline: Any) -> str:
    """The run's ceilings, how close each row comes, and a roofline per target; `inline(svg, prefix)` makes an
    SVG's ids unique within the page. Empty for a run without ceilings."""
    if not report.ceilings:
        return ""
    roofs = _measured(report.ceilings)
    by_target: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for row in report.results:
        by_target[target_key(row)].append(row)
    plots = []
    for index, (key, measured) in enumerate(roofs.items()):
        rows = by_target.get(key, [])
        figure = _figure(short_target(dict(zip(("hardware", "engine", "provider", "device"), key, strict=True))),
                         measured, rows)  # fmt: skip
        if figure is not None:
            prefix = "roofline-" + str(report.run["run_id"]) + f"-{index}"
            plots.append(f"<figure>{inline(_svg(figure), prefix)}</figure>")
    return (
        "<h3>Against the limit</h3><p class='sub'>Each target's ceilings, measured through its own engine on a "
        "graph sized to the target (in this run, or reused from an earlier one: the note says which; "
        "docs/measurement.md; bandwidth_large: the bandwidth graph with its tensors past any cache, what a model's "
        "bytes see once they do not fit in one); a row's achieved GB/s (decode: bytes per token × tg tokens/s) and "
        "GFLOP/s "
        "(prefill: FLOPs per prompt token × pp tokens/s; inference: per item × items/s), and their fractions of "
        f"them.</p>{_ceiling_rows(report.ceilings)}{_result_rows(report.results)}{''.join(plots)}"
    )
