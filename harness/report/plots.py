"""The run's plots, drawn with matplotlib (Agg) from stored numbers only: SVG for HTML, PNG for Markdown.

A plot (or a model's panel) with nothing measured to show is left out, and the reason is kept as a
note; nothing is drawn empty. Marked results (mismatch, fallback adapter, CPU fallback, precision
change, dropped threads, noise) carry a hatch and a code letter (see data.MARK_STYLES).
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")

from statistics import geometric_mean

from matplotlib import colormaps
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter
from matplotlib.transforms import blended_transform_factory

from harness.core.labels import (
    BASELINE_LABEL,
    MARK_STYLES,
    baselines,
    case_label,
    is_baseline,
    marks,
    mode_of,
    short_target,
    speedup,
)
from harness.core.records import MEASURED
from harness.report.data import RunReport

STATUS_ORDER = ("ok", "mismatch", "timeout", "oom", "error", "unsupported")
EDGE, MISMATCH_EDGE = "#333333", "#b00020"
matplotlib.rcParams.update({"font.size": 9, "axes.titlesize": 10, "svg.fonttype": "path", "hatch.linewidth": 0.6})
Row = dict[str, Any]


@dataclass
class Plot:
    key: str
    title: str
    caption: str
    figure: Figure | None = None
    note: str | None = None  # why the plot was left out (figure is then None)
    _rendered: dict[str, Any] = field(default_factory=dict, repr=False)

    def _render(self, fmt: str) -> Any:
        if fmt not in self._rendered:
            assert self.figure is not None, f"plot {self.key} was not drawn: {self.note}"
            buffer = io.StringIO() if fmt == "svg" else io.BytesIO()
            self.figure.savefig(buffer, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
            # laid out once; the next format reuses it. None, not "none": "none" leaves a placeholder engine, for
            # which savefig still draws the whole figure once (rendering disabled) before its real draw
            self.figure.set_layout_engine(None)
            self._rendered[fmt] = buffer.getvalue()
        return self._rendered[fmt]

    def svg(self) -> str:
        return self._render("svg")

    def png(self) -> bytes:
        return self._render("png")


def _model_groups(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(row["family"], row["model"])].append(row)
    return [(model, group) for (_, model), group in sorted(groups.items())]


def _case(row: Row) -> tuple[int, int, str]:
    return (row["batch_size"], row["seq_len"] or 0, row["requested_precision"])


def _case_text(case: tuple[int, int, str], show_precision: bool) -> str:
    text = f"b{case[0]}" + (f" s{case[1]}" if case[1] else "")
    return text + (f" {case[2]}" if show_precision else "")


def _grid(n: int, ncols: int = 3, width: float = 4.0, height: float = 3.0) -> tuple[Figure, list[Any]]:
    """n panels; the figure is always `ncols` panels wide, so text has the same size in every plot of the page."""
    total = width * ncols
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    figure = Figure(figsize=(total, height * nrows + 0.8), layout="constrained")
    axes = list(figure.subplots(nrows, ncols, squeeze=False).ravel())
    for extra in axes[n:]:
        extra.set_visible(False)
    return figure, axes[:n]


def _style(row: Row) -> tuple[str | None, str, float, str]:
    """(hatch, edge colour, alpha, code letters) for a result's marks."""
    kinds = [kind for kind, _ in marks(row)]
    hatch = "".join(MARK_STYLES[k].hatch for k in kinds) or None
    codes = "".join(MARK_STYLES[k].code for k in kinds)
    return hatch, MISMATCH_EDGE if "mismatch" in kinds else EDGE, 0.5 if "noisy" in kinds else 1.0, codes


def _legend(figure: Figure, colors: dict[str, str], targets: set[str], rows: list[Row], extra: list[Any] = ()) -> None:
    """Target colours, the hatches of the marks present in `rows`, then `extra` handles."""
    handles: list[Any] = [Patch(facecolor=colors[t], edgecolor=EDGE, label=t) for t in colors if t in targets]
    kinds = {kind for row in rows for kind, _ in marks(row)}
    for kind, style in MARK_STYLES.items():
        if kind in kinds:
            edge = MISMATCH_EDGE if kind == "mismatch" else EDGE
            handles.append(Patch(facecolor="white", edgecolor=edge, hatch=style.hatch or None, label=style.legend))
    handles += list(extra)
    figure.legend(handles=handles, loc="outside lower center", ncols=min(4, len(handles)), frameon=False, fontsize=8)


def _log_if_wide(ax: Any, values: list[float], axis: str = "y", ratio: float = 30.0) -> None:
    positive = [v for v in values if v and v > 0]
    if positive and max(positive) / min(positive) > ratio:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        (ax.yaxis if axis == "y" else ax.xaxis).set_minor_formatter(NullFormatter())


def _bars(
    report: RunReport,
    colors: dict[str, str],
    value: Callable[[Row], float | None],
    ylabel: str,
    include: Callable[[Row], bool] = lambda r: True,
    whisker: Callable[[Row], float | None] | None = None,
    bottom: float = 0.0,
) -> Figure | None:
    """One panel per model: cases on x, one bar per target; failed results are named where their bar would be."""
    panels = [(m, [r for r in rs if include(r)]) for m, rs in _model_groups(report.results)]
    panels = [(m, rs) for m, rs in panels if any(value(r) is not None for r in rs)]
    if not panels:
        return None
    figure, axes = _grid(len(panels))
    shown: set[str] = set()
    for ax, (model, rows) in zip(axes, panels, strict=True):
        cases = sorted({_case(r) for r in rows})
        targets = [t for t in colors if any(short_target(r) == t for r in rows)]
        cells = {(_case(r), short_target(r)): r for r in sorted(rows, key=lambda r: str(r["created_at"]))}
        width = 0.8 / len(targets)
        status_at = blended_transform_factory(ax.transData, ax.transAxes)
        values = []
        for i, case in enumerate(cases):
            for j, target in enumerate(targets):
                row = cells.get((case, target))
                if row is None:
                    continue
                x = i + (j - (len(targets) - 1) / 2) * width
                v = value(row)
                if v is None:
                    if row["status"] not in MEASURED:
                        ax.text(x, 0.03, row["status"], transform=status_at, rotation=90, ha="center", va="bottom",
                                fontsize=7, color=MISMATCH_EDGE)  # fmt: skip
                    continue
                shown.add(target)
                values.append(v)
                hatch, edge, alpha, codes = _style(row)
                ax.bar(x, v - bottom, width, bottom=bottom, color=colors[target], alpha=alpha, hatch=hatch,
                       edgecolor=edge, linewidth=1.2 if edge == MISMATCH_EDGE else 0.5)  # fmt: skip
                top = v
                if whisker and (w := whisker(row)) is not None and w > v:
                    ax.errorbar(x, v, yerr=[[0], [w - v]], fmt="none", ecolor=EDGE, capsize=2, linewidth=0.7)
                    top = w
                    values.append(w)  # the scale must show whiskers and bars alike
                if codes:
                    ax.annotate(codes, (x, max(top, bottom)), xytext=(0, 2), textcoords="offset points",
                                ha="center", va="bottom", fontsize=7, fontweight="bold", color=edge)  # fmt: skip
        show_precision = len({c[2] for c in cases}) > 1
        ax.set_xticks(range(len(cases)), [_case_text(c, show_precision) for c in cases])
        ax.set_title(model)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        _log_if_wide(ax, [*values, bottom] if bottom else values)
        if bottom:
            ax.axhline(bottom, color=EDGE, linewidth=0.8)
        ax.margins(y=0.12)
    _legend(figure, colors, shown, report.results)
    return figure


def _latency(report: RunReport, colors: dict[str, str]) -> Figure | None:
    return _bars(report, colors, lambda r: r["latency_p50_ms"] if r["status"] in MEASURED else None,
                 "p50 latency (ms)", whisker=lambda r: r["latency_p90_ms"])  # fmt: skip


def _throughput(report: RunReport, colors: dict[str, str]) -> Figure | None:
    return _bars(report, colors, lambda r: r["throughput_per_s"] if r["status"] in MEASURED else None, "items/s")


def _memory(report: RunReport, colors: dict[str, str]) -> Figure | None:
    return _bars(report, colors, lambda r: r["memory_peak_mb"] if r["status"] in MEASURED else None, "peak RSS (MB)")


def _speedup(report: RunReport, colors: dict[str, str]) -> Figure | None:
    base = baselines(report.results)
    return _bars(report, colors, lambda r: speedup(r, base), "speedup vs cpu/torch (×)",
                 include=lambda r: not is_baseline(r), bottom=1.0)  # fmt: skip


def _scaling(report: RunReport, colors: dict[str, str]) -> Figure | None:
    panels = []
    for model, rows in _model_groups(report.results):
        series: dict[tuple[str, int, str], list[Row]] = defaultdict(list)
        for row in rows:
            if row["status"] in MEASURED and row["latency_p50_ms"]:
                series[(short_target(row), row["seq_len"] or 0, row["requested_precision"])].append(row)
        series = {k: sorted(v, key=lambda r: r["batch_size"]) for k, v in series.items()}
        series = {k: v for k, v in series.items() if len({r["batch_size"] for r in v}) > 1}
        if series:
            panels.append((model, series))
    if not panels:
        return None
    figure, axes = _grid(len(panels))
    styles = ["-", "--", ":", "-."]
    shown: set[str] = set()
    for ax, (_model, series) in zip(axes, panels, strict=True):
        seqs = sorted({k[1] for k in series})
        for (target, seq, _), rows in sorted(series.items()):
            shown.add(target)
            xs, ys = [r["batch_size"] for r in rows], [r["latency_p50_ms"] for r in rows]
            ax.plot(xs, ys, styles[seqs.index(seq) % 4], marker="o", markersize=4, color=colors[target], linewidth=1.2)
            for row in rows:
                _, edge, _, codes = _style(row)
                codes = codes.replace(MARK_STYLES["noisy"].code, "")  # noisy points are drawn hollow instead
                if row.get("noisy"):
                    ax.plot(row["batch_size"], row["latency_p50_ms"], "o", markersize=5, markerfacecolor="white",
                            markeredgecolor=colors[target])  # fmt: skip
                if codes:
                    ax.plot(row["batch_size"], row["latency_p50_ms"], "D", markersize=7, markerfacecolor="none",
                            markeredgecolor=edge, markeredgewidth=1.2)  # fmt: skip
                    ax.annotate(codes, (row["batch_size"], row["latency_p50_ms"]), xytext=(4, 4),
                                textcoords="offset points", fontsize=7, fontweight="bold", color=edge)  # fmt: skip
        batches = sorted({r["batch_size"] for rows in series.values() for r in rows})
        if batches[-1] / batches[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        _log_if_wide(ax, [r["latency_p50_ms"] for rows in series.values() for r in rows])
        ax.set_title(_model + (f" (line style: seq {', '.join(map(str, seqs))})" if len(seqs) > 1 else ""))
        ax.set_xlabel("batch size")
        ax.set_ylabel("p50 latency (ms)")
        ax.grid(alpha=0.3)
    marked = Line2D([], [], marker="D", linestyle="none", markerfacecolor="none", markeredgecolor=EDGE,
                    label="marked result (letters as in the tables)")  # fmt: skip
    hollow = Line2D([], [], marker="o", linestyle="none", markerfacecolor="white", markeredgecolor=EDGE,
                    label="hollow: noisy (cv > 10%)")  # fmt: skip
    _legend(figure, colors, shown, [], [marked, hollow])
    return figure


def _distribution(report: RunReport, colors: dict[str, str]) -> Figure | None:
    panels = []
    for model, rows in _model_groups(report.results):
        boxes = [r for r in rows if r["status"] in MEASURED and report.samples.get(r["result_id"])]
        if boxes:
            panels.append((model, sorted(boxes, key=lambda r: (list(colors).index(short_target(r)), _case(r)))))
    if not panels:
        return None
    tallest = max(len(boxes) for _, boxes in panels)
    figure, axes = _grid(len(panels), ncols=2, width=5.6, height=0.32 * tallest + 1.2)
    shown: set[str] = set()
    for ax, (model, boxes) in zip(axes, panels, strict=True):
        data = [report.samples[r["result_id"]] for r in boxes]
        drawn = ax.boxplot(data, orientation="horizontal", patch_artist=True, widths=0.6,
                           flierprops={"markersize": 2, "alpha": 0.5}, medianprops={"color": "black"})  # fmt: skip
        for patch, row in zip(drawn["boxes"], boxes, strict=True):
            hatch, edge, alpha, _ = _style(row)
            patch.set(facecolor=colors[short_target(row)], alpha=alpha, hatch=hatch, edgecolor=edge)
            shown.add(short_target(row))
        labels = []
        for row in boxes:
            codes = _style(row)[3]
            labels.append(f"{short_target(row)} {case_label(row)}" + (f"  [{codes}]" if codes else ""))
        ax.set_yticks(range(1, len(boxes) + 1), labels, fontsize=7)
        for tick, row in zip(ax.get_yticklabels(), boxes, strict=True):
            tick.set_color(_style(row)[1])
        ax.invert_yaxis()
        _log_if_wide(ax, [v for d in data for v in d], axis="x")
        ax.set_title(model)
        ax.set_xlabel("latency per iteration (ms)")
        ax.grid(axis="x", alpha=0.3)
    _legend(figure, colors, shown, report.results)
    return figure


def _heatmap(report: RunReport, colors: dict[str, str]) -> Figure | None:
    base = baselines(report.results)
    families = sorted({r["family"] for r in report.results})
    targets = [t for t in colors if any(short_target(r) == t for r in report.results)]
    cells: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in report.results:
        cells[(row["family"], short_target(row))].append(row)
    grid = [[math.nan] * len(targets) for _ in families]
    texts = [[""] * len(targets) for _ in families]
    for (family, target), rows in cells.items():
        i, j = families.index(family), targets.index(target)
        ratios = [s for r in rows if (s := speedup(r, base)) is not None]
        codes = "".join(sorted({c for r in rows for c in _style(r)[3]}))
        if is_baseline(rows[0]):
            texts[i][j] = "baseline"
        elif ratios:
            grid[i][j] = math.log2(geometric_mean(ratios))
            texts[i][j] = f"{2 ** grid[i][j]:.2f}×\n{len(ratios)} case{'s' * (len(ratios) > 1)}"
        else:
            texts[i][j] = min((r["status"] for r in rows), key=STATUS_ORDER.index)
        texts[i][j] += f"\n[{codes}]" if codes else ""
    measured = [v for line in grid for v in line if not math.isnan(v)]
    if not measured:
        return None
    limit = max(1.0, *(abs(v) for v in measured))
    figure = Figure(figsize=(max(6.0, 1.5 * len(targets) + 2.5), 0.6 * len(families) + 1.8), layout="constrained")
    ax = figure.subplots()
    cmap = colormaps["RdYlGn"].with_extremes(bad="#eeeeee")
    image = ax.imshow(grid, cmap=cmap, norm=Normalize(-limit, limit), aspect="auto")
    for i in range(len(families)):
        for j in range(len(targets)):
            ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(targets)), targets, rotation=20, ha="right")
    ax.set_yticks(range(len(families)), [f.replace("_", " ") for f in families])
    bar = figure.colorbar(image, ax=ax, label="speedup vs cpu/torch")
    step = max(1, math.ceil(limit / 4))
    ticks = [t for t in range(-math.floor(limit), math.floor(limit) + 1) if t % step == 0]
    bar.set_ticks(ticks, labels=[f"{2**t}×" if t >= 0 else f"1/{2**-t}×" for t in ticks])
    return figure


DRAW: dict[str, Callable[[RunReport, dict[str, str]], Figure | None]] = {
    "latency": _latency,
    "throughput": _throughput,
    "scaling": _scaling,
    "speedup": _speedup,
    "memory": _memory,
    "heatmap": _heatmap,
    "distribution": _distribution,
}
NO_PAIR = "no case has both an ok cpu/torch baseline and an ok result on another target"
TEXTS = {  # key: (title, caption, why the plot is left out when there is nothing to draw)
    key: tuple(part.strip() for part in text.split("|"))
    for key, text in {
        "latency": "Latency by hardware target | p50 per model and case; whiskers reach p90. | no result has timings",
        "throughput": "Throughput by hardware target | items/s: batch × 1000 / mean latency. | no result has timings",
        "scaling": "Batch-size scaling | p50 against batch size, one line per target. | no target ran two batch sizes",
        "speedup": f"Speedup vs CPU (cpu/torch) | cpu/torch p50 ÷ target p50, same model and case. | {NO_PAIR}",
        "memory": "Memory by hardware target | memory_peak_mb (RSS high-water mark). | no result has memory_peak_mb",
        "heatmap": "Family × hardware speedup | Geometric mean over the family's cases of cpu/torch p50 ÷ target p50; "
        f"a cell without a measured pair names its best status. | {NO_PAIR}",
        "distribution": "Latency distribution per result | Every timed iteration from the samples table (box: "
        "quartiles, whiskers 1.5 IQR, dots beyond). | no result has raw samples",
    }.items()
}


def target_colors(report: RunReport) -> dict[str, str]:
    """One colour per target, the same in every plot; cpu/torch first."""
    targets = sorted({short_target(r) for r in report.results}, key=lambda t: (t != BASELINE_LABEL, t))
    palette = colormaps["tab10"].colors
    return {t: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, t in enumerate(targets)}


def _ttft(report: RunReport, colors: dict[str, str]) -> Figure | None:
    return _bars(report, colors, lambda r: r["ttft_ms"] if r["status"] in MEASURED else None, "TTFT p50 (ms)")


def _decode(report: RunReport, colors: dict[str, str]) -> Figure | None:
    return _bars(report, colors, lambda r: r["decode_tokens_per_s"] if r["status"] in MEASURED else None,
                 "decode tokens/s")  # fmt: skip


# A generate run's plots: its rows are not a forward pass (the plots above), but the same bars per model and case.
GENERATE_DRAW: dict[str, Callable[[RunReport, dict[str, str]], Figure | None]] = {"ttft": _ttft, "decode": _decode}
GENERATE_TEXTS = {
    "ttft": ("Time to first token by hardware target", "TTFT p50 per model and case (--mode generate).",
             "no generate result has a TTFT"),
    "decode": ("Decode rate by hardware target", "Generated tokens per second after the first (tg), per model and "
               "case.", "no generate result has a decode rate"),
}  # fmt: skip


def render_plots(report: RunReport) -> list[Plot]:
    """Every plot of the run, drawn once (cached on the report for HTML and Markdown): the inference results'
    plots, and a generate run's TTFT and decode rate. A generate row is not a forward pass: it is never in the
    inference plots. Training rows are in the tables only.
    """
    if "plots" in report.cache:
        return report.cache["plots"]
    colors = target_colors(report)  # one colour per target across the inference and the generate plots
    inference, generate = (
        RunReport(report.run, report.hardware, [r for r in report.results if mode_of(r) == mode], report.samples)
        for mode in ("inference", "generate")
    )
    plots = []
    if inference.results or not generate.results:  # a generate-only run has no inference plots to leave out
        plots += _draw(inference, DRAW, TEXTS, colors)
    if generate.results:
        plots += _draw(generate, GENERATE_DRAW, GENERATE_TEXTS, colors)
    report.cache["plots"] = plots
    return plots


def _draw(report: RunReport, draw: dict[str, Any], texts: dict[str, tuple[str, ...]],
          colors: dict[str, str]) -> list[Plot]:  # fmt: skip
    plots = []
    for key, drawn in draw.items():
        title, caption, no_data = texts[key]
        figure = drawn(report, colors) if report.results else None
        note = None if figure is not None else no_data if report.results else "the run has no results"
        plots.append(Plot(key, title, caption, figure, note))
    return plots
