"""`accelharness history --model M`: one metric over runs, per series, with step changes flagged.

A series is one case (model, hardware, engine, provider, batch_size, seq_len, precision, mode, new_tokens); its
points are that case's rows, one per run, ordered by the run's started_at. Only measured rows
(status ok or mismatch) carry a value and serve as baseline; the others are listed with their status.

Step-change rule, for a measured point with at least one measured point before it:

- baseline = median of the metric over the previous `window` (default 5) measured points, and
  |value / baseline - 1| > threshold (default 10%), and
- for metrics computed from the raw samples (latency_*, throughput_per_s), the point's samples
  differ from the previous measured point's samples: two-sided Mann-Whitney U, p < 0.05.

Besides the stored columns, `latency_pNN_ms` (e.g. latency_p25_ms) is computed from the raw samples
(nearest rank, as harness/core/stats.py does). Scheduler contention only ever adds time, so on a loaded
machine a lower quantile follows the workload rather than the load.

The median baseline keeps one odd run from hiding or faking a step; the test on the raw samples
keeps a large but unsupported jump of a noisy summary number from being called a step. Metrics
that have no samples behind them (load_ms, memory, …) use the threshold test only.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from harness.analysis import options as options_of
from harness.analysis.compare import ALPHA, case_fields, case_key
from harness.analysis.drift import control_ms, run_controls
from harness.analysis.options import HISTORY_FORMATS
from harness.analysis.tables import AnalysisError, Table, render_table
from harness.core.escaping import markdown_text
from harness.core.labels import case_label, target_label
from harness.core.options import declared
from harness.core.options import problem as bad_value
from harness.core.records import MEASURED
from harness.core.stats import nearest_rank
from harness.store import Store, open_store

FORMATS = HISTORY_FORMATS  # declared with --format (harness.analysis.options), light to import
SAMPLE_METRICS = ("throughput_per_s",)  # plus every latency_* column
NUMERIC_TYPES = ("DOUBLE", "INTEGER", "BIGINT", "FLOAT")
SAMPLE_QUANTILE = re.compile(r"^latency_p(\d{1,2})_ms$")


@dataclass
class Point:
    run_id: str
    started_at: Any
    git_sha: str | None
    status: str
    value: float | None
    baseline: float | None = None
    change: float | None = None  # value / baseline - 1
    p_value: float | None = None
    step: bool = False
    control_ms: float | None = None  # the run's drift control on this target (analysis.drift): the machine's speed


@dataclass
class Series:
    model: str
    target: str
    case: str
    key: dict[str, Any]
    points: list[Point] = field(default_factory=list)

    @property
    def steps(self) -> list[Point]:
        return [p for p in self.points if p.step]


@dataclass
class History:
    model: str
    metric: str
    threshold: float
    window: int
    series: list[Series]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def numeric_metrics(store: Store) -> list[str]:
    """The results columns a history can follow (numbers, not ids)."""
    rows = store.query(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'results' "
        "ORDER BY ordinal_position"
    )
    skip = {"batch_size", "seq_len"}
    return [r["column_name"] for r in rows if r["data_type"] in NUMERIC_TYPES and r["column_name"] not in skip]


def _fetch(store: Store, model: str, filters: dict[str, Any]) -> list[dict[str, Any]]:
    # an `ab` run's two sides are one paired measurement, not two points of a history
    where = ["r.model = ?", "r.variant IS NULL"] + [f"r.{column} = ?" for column in filters]
    return store.query(
        "SELECT r.*, runs.started_at AS run_started_at FROM results r JOIN runs USING (run_id) "
        f"WHERE {' AND '.join(where)} ORDER BY runs.started_at, r.created_at",
        [model, *filters.values()],
    )


def _value(store: Store, row: dict[str, Any], metric: str) -> float | None:
    """The metric of a measured row: its column, or a quantile of its raw samples."""
    if metric in row:
        return row[metric]
    samples = store.samples(row["result_id"])
    return nearest_rank(np.asarray(samples), int(SAMPLE_QUANTILE.match(metric)[1])) if samples else None


def _group(store: Store, rows: list[dict[str, Any]], metric: str) -> list[tuple[Series, list[str | None]]]:
    """Series with their points, and each point's result_id (for its samples)."""
    grouped: dict[tuple, tuple[Series, dict[str, tuple[Point, str]]]] = {}
    for row in rows:
        key = case_key(row)
        if key not in grouped:
            series = Series(row["model"], target_label(row), case_label(row), case_fields(row))
            grouped[key] = (series, {})
        measured = row["status"] in MEASURED
        value = _value(store, row, metric) if measured else None
        point = Point(row["run_id"], row["run_started_at"], row["git_sha"], row["status"], value)
        grouped[key][1][row["run_id"]] = (point, row["result_id"])  # a run measured twice keeps its last row
    result = []
    controls: dict[str, dict[str, list]] = {}
    for series, by_run in grouped.values():
        series.points = [point for point, _ in by_run.values()]
        for point in series.points:
            by_target = controls.setdefault(point.run_id, run_controls(store, point.run_id))
            point.control_ms = control_ms(by_target.get(series.target, []))
        result.append((series, [rid for _, rid in by_run.values()]))
    return result


def uses_samples(metric: str) -> bool:
    return metric.startswith("latency_") or metric in SAMPLE_METRICS


def _flag_steps(
    store: Store, series: Series, result_ids: list[str | None], metric: str, threshold: float, window: int
) -> None:
    previous: list[tuple[Point, str | None]] = []  # measured points so far
    for point, result_id in zip(series.points, result_ids, strict=True):
        if point.value is None:
            continue
        if previous:
            point.baseline = float(np.median([p.value for p, _ in previous[-window:]]))
            point.change = point.value / point.baseline - 1 if point.baseline else None
            beyond = point.change is not None and abs(point.change) > threshold
            if uses_samples(metric):
                before, now = store.samples(previous[-1][1]), store.samples(result_id)
                if len(before) >= 2 and len(now) >= 2:
                    point.p_value = float(stats.mannwhitneyu(before, now, alternative="two-sided").pvalue)
                point.step = beyond and point.p_value is not None and point.p_value < ALPHA
            else:
                point.step = beyond
        previous.append((point, result_id))


def history(
    db_path: Path,
    model: str,
    metric: str = "latency_p50_ms",
    filters: dict[str, Any] | None = None,
    threshold: float = 0.10,
    window: int = 5,
) -> History:
    """The metric over runs for every series of `model` matching `filters` (hardware, engine, batch_size…)."""
    filters = {k: v for k, v in (filters or {}).items() if v is not None}
    options = declared(options_of.History)  # the bounds the command's --window and --batch-size declare
    problem = bad_value("--window", options["window"], window)
    if "batch_size" in filters:  # a filter past the INT32 column is refused, not a DuckDB conversion error
        problem = problem or bad_value("--batch-size", options["batch_size"], filters["batch_size"])
    if problem:
        raise AnalysisError(problem)
    with open_store(Path(db_path), read_only=True) as store:
        metrics = numeric_metrics(store)
        if metric not in metrics and not SAMPLE_QUANTILE.match(metric):
            valid = ", ".join(metrics)
            raise AnalysisError(f"unknown metric '{metric}'; valid: {valid}, or latency_pNN_ms (from the samples)")
        rows = _fetch(store, model, filters)
        if not rows:
            models = [r["model"] for r in store.query("SELECT DISTINCT model FROM results ORDER BY model")]
            where = f" with {filters}" if filters else ""
            raise AnalysisError(f"no results for model '{model}'{where}; models in the store: {', '.join(models)}")
        grouped = _group(store, rows, metric)
        for series, result_ids in grouped:
            _flag_steps(store, series, result_ids, metric, threshold, window)
    return History(model, metric, threshold, window, [series for series, _ in grouped])


COLUMNS = ["run_id", "started_at", "git_sha", "status", "value", "control_ms", "baseline", "change", "p_value", "step"]


def render(result: History, fmt: str) -> str:
    if fmt not in FORMATS:
        raise AnalysisError(f"unknown format '{fmt}'; valid: {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps(result.to_dict(), indent=2, default=str)
    rule = f"step: |value / median of the previous {result.window} - 1| > {result.threshold:.0%}"
    if uses_samples(result.metric):
        rule += " and Mann-Whitney p < 0.05 against the previous run's samples"
    control = "control_ms: the run's drift control on the same target (a fixed MatMul chain): the machine's own speed"
    parts = [
        f"# History of {markdown_text(result.metric)} for {markdown_text(result.model)}",
        "",
        rule,
        "",
        control,
        "",
    ]
    for series in result.series:
        rows = []
        for point in series.points:
            row = asdict(point)
            row["git_sha"] = (point.git_sha or "")[:12] or None
            row["change"] = f"{point.change:+.1%}" if point.change is not None else None
            row["step"] = ("▲ step" if (point.change or 0) > 0 else "▼ step") if point.step else ""
            rows.append(row)
        title = f"{series.model} {series.target} {series.case}: {len(series.steps)} step(s)"
        parts.append(render_table(Table(title, COLUMNS, rows), "md"))
    return "\n".join(parts)
