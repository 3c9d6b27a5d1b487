"""Where the time goes: the HTML for per-operator profiles, drawn from stored operator rows only.

Per profiled result, a stacked bar of its op types' shares of the operator time (the top ones, the
rest together), with the part of the iteration the operators cover; per model and case measured on
several ONNX Runtime targets (native CPU, wasm, WebGPU, ...), the time per op type on each and the
ratio of each target to the one before it, which answers "why is WebGPU slower than wasm here".
Op types with nodes that ran on a fallback provider are marked wherever they appear.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from html import escape
from itertools import pairwise
from typing import Any

from harness.core.labels import case_label, details_of, target_label

TOP_TYPES = 7  # op types drawn apart in a bar; the rest share one segment
RATIO_ROWS = 12
PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
    "#86bcb6", "#d37295", "#a0cbe8", "#8cd17d", "#b6992d", "#499894", "#fabfd2",
)  # fmt: skip
REST_COLOR = "#c9ccd1"
# ONNX Runtime's op types are the ONNX ones on every target it runs (natively and in the browser), so
# their times compare type by type; the order in which targets are set side by side:
ORT_ENGINES = ("onnxruntime", "onnxruntime-web")
CSS = """
.opbars { display: grid; grid-template-columns: minmax(220px, max-content) 1fr; gap: 4px 12px; align-items: center;
  margin: 6px 0 16px; }
.opbar { display: flex; height: 22px; border: 1px solid var(--line); border-radius: 3px; overflow: hidden; }
.opbar span { display: block; height: 100%; color: #fff; font-size: 11px; line-height: 22px; padding: 0 3px;
  white-space: nowrap; overflow: hidden; text-overflow: clip; }
.opbar span.fallback { background-image: repeating-linear-gradient(45deg, rgba(255,255,255,.45) 0 3px,
  transparent 3px 7px); }
.oplabel small, .opnote { color: var(--muted); font-size: 12px; }
table.ratios td.ratio-slower { color: var(--bad); font-weight: 600; } table.ratios td.ratio-faster { color: var(--ok); }
"""


@dataclass(frozen=True)
class TypeTime:
    op_type: str
    ms: float  # per iteration
    share: float
    nodes: int
    fallback_nodes: int


def op_type_times(operators: list[dict[str, Any]]) -> list[TypeTime]:
    """A result's operator rows summed per op type, largest first."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])
    for row in operators:
        entry = sums[row["op_type"]]
        entry[0] += row["total_ms"] / row["profile_iterations"]
        entry[1] += row["share"]
        entry[2] += 1
        entry[3] += bool(row["fallback"])
    times = [TypeTime(name, ms, share, int(n), int(f)) for name, (ms, share, n, f) in sums.items()]
    return sorted(times, key=lambda t: -t.ms)


def _colors(operators: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """One color per op type across the section, the palette given out by total share (largest first)."""
    weight: dict[str, float] = defaultdict(float)
    for rows in operators.values():
        for row in rows:
            weight[row["op_type"]] += row["share"]
    ranked = sorted(weight, key=lambda name: (-weight[name], name))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(ranked)}


def _segment(label: str, share: float, color: str, tip: str, fallback: bool) -> str:
    text = escape(label) if share >= 0.06 else ""
    kind = ' class="fallback"' if fallback else ""
    return f'<span{kind} style="width:{share * 100:.2f}%;background:{color}" title="{escape(tip)}">{text}</span>'


def _bar(types: list[TypeTime], colors: dict[str, str]) -> str:
    segments = []
    for t in types[:TOP_TYPES]:
        mark = f"; {t.fallback_nodes} of {t.nodes} nodes on a fallback provider" if t.fallback_nodes else ""
        tip = f"{t.op_type}: {t.share:.1%} of operator time, {t.ms:.3g} ms per iteration, {t.nodes} node(s){mark}"
        segments.append(
            _segment(t.op_type + (" ⚠" if t.fallback_nodes else ""), t.share, colors[t.op_type], tip, bool(mark))
        )
    rest = types[TOP_TYPES:]
    if rest:
        share = sum(t.share for t in rest)
        tip = f"{len(rest)} other op types: {share:.1%} ({', '.join(t.op_type for t in rest[:12])})"
        segments.append(_segment("other", share, REST_COLOR, tip, any(t.fallback_nodes for t in rest)))
    return f'<div class="opbar">{"".join(segments)}</div>'


def _coverage(details: dict[str, Any]) -> str:
    profile = details.get("profile") or {}
    if profile.get("coverage") is None:
        return ""
    return (
        f"operators {profile['operator_ms']:.3g} of {profile['iteration_ms']:.3g} ms per profiled iteration "
        f"({profile['coverage']:.0%}), {profile['iterations']} iterations"
    )


def breakdown_html(results: list[dict[str, Any]], operators: dict[str, list[dict[str, Any]]]) -> str:
    """Per profiled result, where the time goes; a result whose profile could not be taken says why."""
    by_model: dict[str, list[str]] = defaultdict(list)
    colors = _colors(operators)
    for row in results:
        details = details_of(row)
        profile = details.get("profile")
        label = f"{target_label(row)} · {case_label(row)} · {row['precision']}"
        if row["result_id"] in operators:
            types = op_type_times(operators[row["result_id"]])
            fallback = sum(t.fallback_nodes for t in types)
            note = _coverage(details) + (f"; {fallback} node(s) on a fallback provider (⚠)" if fallback else "")
            by_model[row["model"]].append(
                f'<div class="oplabel">{escape(label)}<br><small>{escape(note)}</small></div>{_bar(types, colors)}'
            )
        elif profile and profile.get("error"):
            reason = f"not profiled: {profile['error']}"
            by_model[row["model"]].append(
                f'<div class="oplabel">{escape(label)}</div><div class="opnote">{escape(reason)}</div>'
            )
    if not by_model:
        return ""
    parts = [
        f'<h4>{escape(model)}</h4><div class="opbars">{"".join(bars)}</div>' for model, bars in sorted(by_model.items())
    ]
    return (
        '<p class="sub">Shares of the operator time per op type, from a few profiled iterations run after the '
        "timed loop (never inside it). Hover a segment for its time; ⚠ and hatching mark op types with nodes "
        "that ran on a fallback provider.</p>" + "".join(parts)
    )


def _order(row: dict[str, Any]) -> tuple[int, str]:
    """Native CPU first, then wasm, then the rest: each target is set against the one before it (the rows
    are all ONNX Runtime's, native or in the page)."""
    if row["hardware"] == "cpu":
        return (0, "")
    return (1, "") if row["hardware"] == "wasm" else (2, target_label(row))


def ratio_html(results: list[dict[str, Any]], operators: dict[str, list[dict[str, Any]]]) -> str:
    """Per model and case profiled on several ONNX Runtime targets: each op type's time on each, and
    the ratio of a target to the one before it (wasm to native CPU, WebGPU to wasm)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in results:
        if row["result_id"] in operators and row["engine"] in ORT_ENGINES:
            groups[(row["model"], case_label(row), row["precision"])].append(row)
    parts = []
    for (model, case, precision), rows in sorted(groups.items()):
        rows = sorted(rows, key=_order)
        for reference, row in pairwise(rows):
            parts.append(_ratio_table(f"{model} · {case} · {precision}", reference, row, operators))
    if not parts:
        return ""
    return (
        '<p class="sub">The same ONNX file on two ONNX Runtime targets: milliseconds per iteration per op type '
        "and their ratio (above 1: slower on the second).</p>" + "".join(parts)
    )


def _ratio_table(title: str, reference: dict[str, Any], row: dict[str, Any], operators: dict[str, list]) -> str:
    before = {t.op_type: t for t in op_type_times(operators[reference["result_id"]])}
    after = {t.op_type: t for t in op_type_times(operators[row["result_id"]])}
    names = sorted(
        before.keys() | after.keys(),
        key=lambda n: -max(getattr(before.get(n), "ms", 0), getattr(after.get(n), "ms", 0)),
    )
    a, b = target_label(reference), target_label(row)
    body = []
    for name in names[:RATIO_ROWS]:
        x, y = before.get(name), after.get(name)
        ratio = y.ms / x.ms if x and y and x.ms > 0 else None
        kind = "" if ratio is None else "ratio-slower" if ratio > 1.1 else "ratio-faster" if ratio < 0.9 else ""
        marks = " ⚠" * bool((x and x.fallback_nodes) or (y and y.fallback_nodes))
        body.append(
            f"<tr><td>{escape(name)}{marks}</td><td class='num'>{_ms(x)}</td><td class='num'>{_ms(y)}</td>"
            f"<td class='num {kind}'>{'—' if ratio is None else f'{ratio:.2f}×'}</td></tr>"
        )
    total_a, total_b = sum(t.ms for t in before.values()), sum(t.ms for t in after.values())
    body.append(
        f"<tr><th>all operators</th><th class='num'>{total_a:.3g}</th><th class='num'>{total_b:.3g}</th>"
        f"<th class='num'>{total_b / total_a:.2f}×</th></tr>"
        if total_a > 0
        else ""
    )
    head = f"<tr><th>op type</th><th>{escape(a)} ms</th><th>{escape(b)} ms</th><th>ratio</th></tr>"
    return f'<h4>{escape(title)}: {escape(b)} vs {escape(a)}</h4><table class="ratios">{head}{"".join(body)}</table>'


def _ms(time: TypeTime | None) -> str:
    return "—" if time is None else f"{time.ms:.3g}"
