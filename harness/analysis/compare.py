"""`accelharness compare A B`: per benchmark case, did run B get slower or faster than run A?

Cases match on (model, hardware, engine, provider, batch_size, seq_len, precision, mode, new_tokens):
an inference row is never compared with a training step or a generate() call. For a case
measured in both runs (status ok or mismatch) the effect is the ratio of medians B/A of the raw
samples, with a 95% percentile-bootstrap CI (scipy.stats.bootstrap, 2000 resamples of each run's
samples independently, fixed seed) and a two-sided Mann-Whitney U p-value. With threshold t:

1. fewer than 5 samples on a side -> noisy; a CI wider than 4·t -> noisy (no verdict at this resolution),
   unless p < 0.05 and the whole CI lies beyond the band (a large change: regressed / improved)
2. a side flagged noisy (cv > 10%): the whole CI must clear the band
   CI low > 1+t and p < 0.05 -> regressed; CI high < 1-t and p < 0.05 -> improved;
   CI inside 1±t -> unchanged (any change is smaller than the band: an equivalence test);
   CI contains 1 and lies within 1±2t -> unchanged (no difference, and none beyond 2t); otherwise noisy
3. both sides clean:
   CI low > 1 and ratio > 1+t and p < 0.05 -> regressed; CI high < 1 and ratio < 1-t and p < 0.05 -> improved;
   otherwise unchanged (the CI overlaps 1, or the change is within ±t)

The band t is what the reader calls a real change; the CI and the p-value say the change is not
sampling noise. The bootstrap treats a run's samples as independent, so the CI covers noise within
the runs, not a drift of the whole machine between them (other load, clocks): set t above the
run-to-run spread of your machine, or measure A and B at the same time. The CV flag is mean-based
and outlier-sensitive, so it does not veto a shift of the medians, it raises the bar to "the whole
CI is outside the band". Cases that ran in A but not in B are `broken` (and `fixed` the other way
round), cases in one run only are `added` / `removed`; `unmeasured` ran in neither.

`quantile` (default 0.5, the median) picks the statistic. Scheduler contention only ever adds time
to an iteration, and when it hits close to half of them the median jumps between the clean and the
preempted mode; a lower quantile such as 0.25 still reads the clean mode, so it is the robust choice
on a loaded shared machine.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from harness.analysis.browser_cost import BrowserCost, Unpaired, browser_costs, cost_table
from harness.analysis.drift import case_spread, control_drift, drift_verdict, spread_note
from harness.analysis.machines import machine_name
from harness.analysis.options import COMPARE_FORMATS
from harness.analysis.speech import row_wer
from harness.analysis.tables import AnalysisError, Table, render_table
from harness.core.labels import TARGET_FIELDS, case_label, mode_of, target_label
from harness.core.records import MEASURED
from harness.core.roofline import limit_fraction
from harness.store import Store, StoreError, open_store

KEY = ("model", *TARGET_FIELDS, "batch_size", "seq_len", "precision", "mode", "new_tokens", "depth",
       "audio_seconds")  # fmt: skip


def case_fields(row: dict[str, Any]) -> dict[str, Any]:
    """What identifies a case across runs: KEY's values (generate rows differ by their new tokens and KV-cache
    depth too, and speech by its audio length; a row stored before depths existed started at depth 0)."""
    depth = row.get("depth") if row.get("depth") is not None or mode_of(row) != "generate" else 0
    return {k: row.get(k) for k in KEY} | {"mode": mode_of(row), "depth": depth}


def case_key(row: dict[str, Any]) -> tuple:
    return tuple(case_fields(row).values())


FORMATS = COMPARE_FORMATS  # declared with --format (harness.analysis.options), light to import
ALPHA = 0.05
CI_WIDTH_FACTOR = 4.0
MIN_SAMPLES = 5
RESAMPLES = 2000
SEED = 20240604
FAILING = ("regressed", "broken")  # what --fail-on-regression exits 1 for


@dataclass
class ComparisonRow:
    model: str
    hardware: str
    engine: str
    provider: str | None
    device: str | None  # a device served by `web --serve`; None for this machine's targets
    batch_size: int
    seq_len: int | None
    precision: str
    mode: str
    new_tokens: int | None
    depth: int | None  # generate: the KV-cache depth the decode started at
    audio_seconds: int | None  # generate, speech: the audio's length (--audio-seconds); None: the encoder's window
    target: str
    case: str
    status_a: str | None
    status_b: str | None
    verdict: str
    a_ms: float | None = None  # the chosen quantile of A's samples (the median by default)
    b_ms: float | None = None
    n_a: int = 0
    n_b: int = 0
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    noisy_a: bool | None = None
    noisy_b: bool | None = None
    note: str = ""
    control_ratio: float | None = None  # the drift control's B/A on this target (analysis.drift)
    spread: float | None = None  # this case's run-to-run spread in earlier runs (slowest/fastest median)
    spread_runs: int = 0  # how many earlier runs that spread is over
    # how close each side came to its target's measured ceiling (harness.core.roofline): bandwidth for a
    # generate row's decode, compute for an inference row; None where either was not measured
    limit_a: float | None = None
    limit_b: float | None = None
    # speech: each side's real-time factor and word error rate (harness.prepare.wer); None where not measured
    rtf_a: float | None = None
    rtf_b: float | None = None
    wer_a: float | None = None
    wer_b: float | None = None


@dataclass
class Comparison:
    db_path: str
    run_a: str
    run_b: str
    threshold: float
    quantile: float
    runs: dict[str, dict[str, Any]]
    rows: list[ComparisonRow] = field(default_factory=list)
    paired: bool = False  # an `ab` run: A and B measured interleaved, compared round by round (analysis.paired)
    controls: dict[str, dict[str, float | None]] = field(default_factory=dict)  # per target: drift.control_drift
    # per run: page ÷ native on the same kernels (harness.analysis.browser_cost), the pairs and the refused
    browser_cost: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(r.verdict for r in self.rows))

    @property
    def statistic(self) -> str:
        return "median" if self.quantile == 0.5 else f"p{self.quantile * 100:g}"

    @property
    def regressed(self) -> list[ComparisonRow]:
        return [r for r in self.rows if r.verdict in FAILING]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "statistic": self.statistic, "counts": self.counts}


# --- input ---------------------------------------------------------------------------------------
def parse_threshold(text: str) -> float:
    """'5%' or '0.05' -> 0.05; anything outside (0, 1) is refused."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise AnalysisError(f"--threshold takes a percentage or a fraction, e.g. 5% or 0.05 (got '{text}')")
    return value


# --- statistics ----------------------------------------------------------------------------------
def ratio_ci(a: np.ndarray, b: np.ndarray, quantile: float = 0.5) -> tuple[float, float, float]:
    """Quantile(b)/quantile(a) (medians by default) and its 95% percentile-bootstrap CI.

    The two runs are resampled independently: their samples are not paired.
    """

    def ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.quantile(y, quantile, axis=axis) / np.quantile(x, quantile, axis=axis)

    result = stats.bootstrap(
        (a, b),
        ratio,
        n_resamples=RESAMPLES,
        vectorized=True,
        method="percentile",
        batch=max(1, 4_000_000 // (len(a) + len(b))),  # bound memory for runs with 10k samples
        rng=np.random.default_rng(SEED),
    )
    interval = result.confidence_interval
    return float(ratio(a, b)), float(interval.low), float(interval.high)


def verdict(ratio: float, low: float, high: float, p: float, noisy: bool, threshold: float) -> tuple[str, str]:
    """The rule in the module docstring; returns (verdict, note)."""
    significant = p < ALPHA
    if high - low > CI_WIDTH_FACTOR * threshold:  # a large change has a wide CI too: all of it beyond the band counts
        if significant and low > 1 + threshold:
            return "regressed", f"CI wider than {CI_WIDTH_FACTOR:g}×threshold, but all of it above the band"
        if significant and high < 1 - threshold:
            return "improved", f"CI wider than {CI_WIDTH_FACTOR:g}×threshold, but all of it below the band"
        return "noisy", f"CI wider than {CI_WIDTH_FACTOR:g}×threshold"
    if noisy:
        if significant and low > 1 + threshold:
            return "regressed", "noisy side, but the whole CI is above the band"
        if significant and high < 1 - threshold:
            return "improved", "noisy side, but the whole CI is below the band"
        if 1 - threshold <= low and high <= 1 + threshold:
            return "unchanged", "the whole CI is inside the band (a side has cv > 10%)"
        if low <= 1 <= high and 1 - 2 * threshold <= low and high <= 1 + 2 * threshold:
            return "unchanged", "CI contains 1 and rules out a change beyond 2×threshold (a side has cv > 10%)"
        return "noisy", "a side has cv > 10%: the CI neither clears the band nor stays within 1±2×threshold"
    if significant and low > 1 and ratio > 1 + threshold:
        return "regressed", ""
    if significant and high < 1 and ratio < 1 - threshold:
        return "improved", ""
    if significant and (low > 1 or high < 1):
        return "unchanged", f"significant but within ±{threshold:.0%}"
    return "unchanged", ""


def _measured_row(row: ComparisonRow, a: list[float], b: list[float], threshold: float, quantile: float) -> None:
    row.n_a, row.n_b = len(a), len(b)
    if min(row.n_a, row.n_b) < MIN_SAMPLES:
        row.verdict, row.note = "noisy", f"fewer than {MIN_SAMPLES} samples"
        return
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    row.a_ms, row.b_ms = float(np.quantile(xa, quantile)), float(np.quantile(xb, quantile))
    row.ratio, row.ci_low, row.ci_high = ratio_ci(xa, xb, quantile)
    row.p_value = float(stats.mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    noisy = bool(row.noisy_a or row.noisy_b)
    row.verdict, row.note = verdict(row.ratio, row.ci_low, row.ci_high, row.p_value, noisy, threshold)


# --- comparison ----------------------------------------------------------------------------------
def _by_key(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    # store.results orders by created_at last, so a key measured twice in one run keeps its latest row
    return {case_key(r): r for r in rows}


def _row(
    store: Store, ra: dict[str, Any] | None, rb: dict[str, Any] | None, limits: tuple[float, float]
) -> ComparisonRow:
    base = rb or ra
    assert base is not None
    row = ComparisonRow(
        **case_fields(base),
        target=target_label(base),
        case=case_label(base),
        status_a=ra["status"] if ra else None,
        status_b=rb["status"] if rb else None,
        verdict="",
        noisy_a=ra["noisy"] if ra else None,
        noisy_b=rb["noisy"] if rb else None,
        limit_a=limit_fraction(ra),
        limit_b=limit_fraction(rb),
        rtf_a=(ra or {}).get("real_time_factor"),
        rtf_b=(rb or {}).get("real_time_factor"),
        wer_a=row_wer(ra)[0] if ra else None,
        wer_b=row_wer(rb)[0] if rb else None,
    )
    measured_a, measured_b = row.status_a in MEASURED, row.status_b in MEASURED
    if ra is None or rb is None:
        row.verdict = "added" if ra is None else "removed"
    elif measured_a and measured_b:
        _measured_row(row, store.samples(ra["result_id"]), store.samples(rb["result_id"]), *limits)
        if row.status_a != row.status_b:
            row.note = "; ".join(filter(None, [f"status {row.status_a} → {row.status_b}", row.note]))
        if None not in (row.wer_a, row.wer_b) and row.wer_a != row.wer_b:  # other text: the time is not all that moved
            row.note = "; ".join(filter(None, [row.note, f"WER {row.wer_a:.3f} → {row.wer_b:.3f}"]))
    elif measured_a or measured_b:
        row.verdict = "broken" if measured_a else "fixed"
        failed = rb if measured_a else ra
        row.note = f"{failed['status']}: " + (failed["error"] or "").split("\n", 1)[0][:120]
    else:
        row.verdict = "unmeasured"
    return row


def compare_runs(
    db_path: Path,
    a: str,
    b: str,
    threshold: float = 0.05,
    quantile: float = 0.5,
    cwd: Path | None = None,
    across_machines: bool = False,
) -> Comparison:
    """Compare run b against run a (ids or selectors); every number comes from the store's samples.
    Runs of two hardware classes are refused unless across_machines: their ratio is the machines' too."""
    if not 0 < threshold < 1:
        raise AnalysisError(f"threshold must be between 0 and 1 (got {threshold})")
    if not 0 < quantile < 1:
        raise AnalysisError(f"quantile must be between 0 and 1, e.g. 0.5 for the median (got {quantile})")
    with open_store(Path(db_path), read_only=True) as store:
        try:
            run_a, run_b = store.resolve_run(a, cwd), store.resolve_run(b, cwd)
        except StoreError as exc:
            raise AnalysisError(str(exc)) from None
        runs = {rid: {k: store.run_info(rid)[k] for k in RUN_FACTS} for rid in (run_a, run_b)}
        check_machines(runs[run_a], runs[run_b], across_machines)
        results = {rid: store.results(rid) for rid in (run_a, run_b)}
        rows_a, rows_b = _by_key(results[run_a]), _by_key(results[run_b])
        keys = sorted(rows_a.keys() | rows_b.keys(), key=lambda k: tuple((v is None, str(v)) for v in k))
        rows = [_row(store, rows_a.get(k), rows_b.get(k), (threshold, quantile)) for k in keys]
        controls = control_drift(store, run_a, run_b)
        later = max(runs[run_a]["started_at"], runs[run_b]["started_at"])
        for row in rows:
            _explain(store, row, controls, later, (run_a, run_b), threshold)
    cost = {rid: _browser_cost(rows) for rid, rows in results.items()}
    return Comparison(str(db_path), run_a, run_b, threshold, quantile, runs, rows, controls=controls, browser_cost=cost)


def _browser_cost(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    paired, unpaired = browser_costs(rows)
    return {"pairs": [asdict(c) for c in paired], "unpaired": [asdict(u) for u in unpaired]}


RUN_FACTS = ("started_at", "status", "git_sha", "hostname", "command", "machine_label", "machine_id", "hardware_class")


def check_machines(a: dict[str, Any], b: dict[str, Any], across_machines: bool) -> None:
    """Refuse a verdict between two hardware classes unless asked: a change there is the machines' as much
    as the code's. Runs without a recorded class (an older store read as it is) are not refused."""
    classes = (a.get("hardware_class"), b.get("hardware_class"))
    if across_machines or None in classes or classes[0] == classes[1]:
        return
    raise AnalysisError(
        f"run A ran on {machine_name(a)} ({classes[0]}), run B on {machine_name(b)} ({classes[1]}): another "
        "hardware class, so a verdict would measure the machines as much as the change. Compare runs of one "
        "class, or pass --across-machines to compare them anyway (the table then says so)"
    )


def machines_note(comparison: Comparison) -> list[str]:
    """Say when A and B ran on different machines, and whether their hardware classes differ."""
    a, b = comparison.runs[comparison.run_a], comparison.runs[comparison.run_b]
    if (a.get("machine_id"), a.get("machine_label")) == (b.get("machine_id"), b.get("machine_label")):
        return []
    if a.get("hardware_class") == b.get("hardware_class"):
        return [f"A ran on {machine_name(a)}, B on {machine_name(b)}: one hardware class ({a.get('hardware_class')})"]
    return [
        f"across machines (--across-machines): A on {machine_name(a)} ({a.get('hardware_class')}), B on "
        f"{machine_name(b)} ({b.get('hardware_class')}); each ratio includes the difference between them"
    ]


def _explain(store: Store, row: ComparisonRow, controls: dict, before: Any, runs: tuple[str, ...], t: float) -> None:
    """What the machine explains of a change: the drift control's move on the row's target (a change
    within it is `drift`), and the case's run-to-run spread in the earlier runs (a change inside it is
    flagged)."""
    row.control_ratio = controls.get(row.target, {}).get("ratio")
    if row.ratio is None:
        return
    if drift_verdict(row.verdict, row.ratio, row.control_ratio, t):
        moved = f"{row.verdict} ×{row.ratio:.3f}, but the drift control moved ×{row.control_ratio:.3f} on this target"
        row.verdict, row.note = "drift", "; ".join(filter(None, [moved, row.note]))
    key = {k: getattr(row, k) for k in KEY}
    row.spread, row.spread_runs = case_spread(store, key, before, runs)
    if note := spread_note(row.verdict, row.ratio, row.spread, row.spread_runs):
        row.note = "; ".join(filter(None, [row.note, note]))


# --- output --------------------------------------------------------------------------------------
TABLE_COLUMNS = [
    "model", "target", "case", "status", "a_ms", "b_ms", "ratio", "ci_low", "ci_high", "p_value",
    "control_ratio", "spread", "limit_a", "limit_b", "verdict", "note",
]  # fmt: skip
SPEECH_COLUMNS = ["rtf_a", "rtf_b", "wer_a", "wer_b"]  # shown where a speech row is compared


def comparison_table(comparison: Comparison) -> Table:
    rows = []
    for r in comparison.rows:
        status = r.status_a if r.status_a == r.status_b else f"{r.status_a or '—'} → {r.status_b or '—'}"
        rows.append({**asdict(r), "status": status})
    counts = ", ".join(f"{v} {n}" for v, n in sorted(comparison.counts.items())) or "no cases"
    if comparison.paired:
        title = f"A/B run {comparison.run_a}"
        notes = [
            f"A and B measured interleaved in run {comparison.run_a} "
            f"(git {_short(comparison.runs[comparison.run_a]['git_sha'])}), ABBA rounds",
            "ratio = Hodges-Lehmann estimate of the per-round ratios median B / median A, 95% bootstrap CI "
            "over rounds, Wilcoxon signed-rank p; a_ms, b_ms: medians of all samples; "
            f"threshold ±{comparison.threshold:.1%}",
        ]
    else:
        title = f"Comparison: {comparison.run_b} vs {comparison.run_a}"
        notes = [
            f"A = {comparison.run_a} (git {_short(comparison.runs[comparison.run_a]['git_sha'])}), "
            f"B = {comparison.run_b} (git {_short(comparison.runs[comparison.run_b]['git_sha'])})",
            f"ratio = {comparison.statistic} B / {comparison.statistic} A (a_ms, b_ms), 95% bootstrap CI, "
            f"Mann-Whitney p; threshold ±{comparison.threshold:.1%}",
        ]
    notes += machines_note(comparison) + _control_notes(comparison)
    if any(r.limit_a is not None or r.limit_b is not None for r in comparison.rows):
        notes.append("limit_a, limit_b: the fraction of its target's ceiling measured in that run (decode: "
                     "bandwidth; inference: compute; docs/measurement.md)")  # fmt: skip
    columns = TABLE_COLUMNS
    if any(r.rtf_a is not None or r.rtf_b is not None or r.wer_a is not None or r.wer_b is not None
           for r in comparison.rows):  # fmt: skip
        columns = [*TABLE_COLUMNS[:-2], *SPEECH_COLUMNS, *TABLE_COLUMNS[-2:]]  # beside the verdict
        notes.append("rtf_a, rtf_b: the real-time factor (audio seconds ÷ processing seconds); wer_a, wer_b: the "
                     "word error rate of the row's text (details.wer), measured in that run")  # fmt: skip
    notes.append(f"verdicts: {counts}")
    return Table(title, columns, rows, notes)


def _control_notes(comparison: Comparison) -> list[str]:
    """The drift control per target: how much the machine itself moved between the runs."""
    if comparison.paired:
        return []
    if not comparison.controls:
        return ["drift control: not measured in both runs (runs before schema 6 have none): verdicts are not "
                "corrected for the machine's drift"]  # fmt: skip
    notes = ["drift control (a fixed MatMul chain each run measures) B/A per target; `drift`: a change within "
             "the control's move ±threshold"]  # fmt: skip
    for target, c in comparison.controls.items():
        ratio = f"×{c['ratio']:.3f}" if c["ratio"] else "not measured"
        inside = ", ".join(f"within {side} ×{c[f'within_{side}']:.3f}" for side in ("a", "b") if c[f"within_{side}"])
        notes.append(f"  {target}: {ratio} ({inside})" if inside else f"  {target}: {ratio}")
    return notes


def _short(sha: str | None) -> str:
    return sha[:12] + ("-dirty" if sha.endswith("-dirty") else "") if sha else "unknown"


def render(comparison: Comparison, fmt: str) -> str:
    if fmt not in FORMATS:
        raise AnalysisError(f"unknown format '{fmt}'; valid: {', '.join(FORMATS)}")
    if fmt == "json":
        import json

        return json.dumps(comparison.to_dict(), indent=2, default=str)
    text = render_table(comparison_table(comparison), fmt)
    if fmt != "md":
        return text
    for name, run_id in (("A", comparison.run_a), ("B", comparison.run_b)):
        if name == "B" and run_id == comparison.run_a:
            continue  # one run against itself: its pairs once
        found = comparison.browser_cost.get(run_id, {})
        table = cost_table([BrowserCost(**c) for c in found.get("pairs", [])],
                           [Unpaired(**u) for u in found.get("unpaired", [])])  # fmt: skip
        if table is not None:
            text += "\n" + render_table(replace(table, title=f"{table.title} in run {name} ({run_id})"), "md")
    return text


def check_plot_path(path: Path) -> None:
    if path.suffix.lower() not in (".png", ".svg"):
        raise AnalysisError(f"--plot-comparison writes .png or .svg (got '{path.name}')")


COLOURS = {
    "regressed": "tab:red", "improved": "tab:green", "unchanged": "tab:gray", "noisy": "tab:orange",
    "drift": "tab:blue",
}  # fmt: skip


def plot_comparison(comparison: Comparison, path: Path) -> Path:
    """Left: A vs B per case (median by default); right: B/A with its 95% CI as error bars, the ±threshold band."""
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    rows = [r for r in comparison.rows if r.ratio is not None]
    labels = [f"{r.model} {r.target} {r.case}" for r in rows]
    y = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 1.8 + 0.45 * max(1, len(rows))), sharey=True)
    left.barh(y - 0.2, [r.a_ms for r in rows], 0.4, label=f"A {comparison.run_a}", color="tab:blue")
    left.barh(y + 0.2, [r.b_ms for r in rows], 0.4, label=f"B {comparison.run_b}", color="tab:purple")
    left.set(xlabel=f"{comparison.statistic} latency (ms)", yticks=y, yticklabels=labels)
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncols=2, framealpha=0.9)
    t = comparison.threshold
    right.axvspan(1 - t, 1 + t, color="0.9", label=f"±{t:.0%}")
    right.axvline(1.0, color="0.4", linewidth=0.8)
    for i, r in enumerate(rows):
        xerr = [[r.ratio - r.ci_low], [r.ci_high - r.ratio]]
        right.errorbar(r.ratio, i, xerr=xerr, fmt="o", capsize=4, color=COLOURS.get(r.verdict, "black"))
        right.annotate(r.verdict, (r.ci_high, i), xytext=(6, -3), textcoords="offset points", fontsize=8)
    right.set(xlabel=f"{comparison.statistic} B / {comparison.statistic} A (95% bootstrap CI)")
    if not rows:
        left.text(0.5, 0.5, "no case measured in both runs", ha="center", transform=left.transAxes)
    fig.suptitle(f"{comparison.run_b} vs {comparison.run_a}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
