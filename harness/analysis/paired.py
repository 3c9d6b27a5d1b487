"""The paired analysis of an `accelharness ab` run: did variant B get slower or faster than A?

In every round of an ab run both variants measured a block of iterations back to back (ABBA order),
so whatever the machine did in that round (other load, clocks, caches) hit both alike. The unit of
evidence is therefore the round, not the iteration:

  round ratio r_i = median(B's samples in round i) / median(A's samples in round i)
  effect          = the Hodges-Lehmann estimate of the ratio: exp(median of the Walsh averages of
                    log r_i), the median's robust cousin that goes with the signed-rank test
  95% CI          = percentile bootstrap of that estimate over rounds (rounds resampled, fixed seed)
  p               = Wilcoxon signed-rank test of log r_i against 0 (exact for few rounds)

and the verdict is compare's (harness.analysis.compare.verdict) with these numbers: a regression
needs p < 0.05, a CI above 1 and an effect beyond the threshold. With 6 rounds the smallest
possible two-sided p is 2/64 = 0.031, so fewer rounds can never show a change (MIN_PAIRED_ROUNDS).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from harness.analysis.compare import RESAMPLES, SEED, Comparison, ComparisonRow, case_fields, verdict
from harness.analysis.tables import AnalysisError
from harness.core.labels import case_label, target_label
from harness.core.records import MEASURED
from harness.core.roofline import limit_fraction
from harness.core.stats import MIN_PAIRED_ROUNDS
from harness.store import StoreError, open_store

BROWSER_NAME = re.compile(r"[a-z]{1,16}")  # a browser --a-browser/--b-browser names (chromium, firefox, …)


@dataclass(frozen=True)
class PairedEffect:
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    rounds: int
    round_ratios: list[float]


def hodges_lehmann(values: np.ndarray) -> np.ndarray:
    """Median of the Walsh averages (x_i + x_j) / 2, i <= j, along the last axis."""
    i, j = np.triu_indices(values.shape[-1])
    return np.median((values[..., i] + values[..., j]) / 2, axis=-1)


def round_ratios(a_rounds: dict[int, list[float]], b_rounds: dict[int, list[float]]) -> list[float]:
    """median(B) / median(A) for every round both variants measured, in round order."""
    common = sorted(a_rounds.keys() & b_rounds.keys())
    return [float(np.median(b_rounds[r]) / np.median(a_rounds[r])) for r in common if a_rounds[r] and b_rounds[r]]


def paired_effect(ratios: list[float]) -> PairedEffect:
    """The effect of B against A from per-round ratios (the module docstring's rule)."""
    if len(ratios) < MIN_PAIRED_ROUNDS:
        raise AnalysisError(f"a paired verdict needs >= {MIN_PAIRED_ROUNDS} rounds (got {len(ratios)})")
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    rng = np.random.default_rng(SEED)
    resampled = logs[rng.integers(0, len(logs), size=(RESAMPLES, len(logs)))]
    low, high = np.percentile(hodges_lehmann(resampled), [2.5, 97.5])
    # identical medians in every round: no difference at all (the test has nothing to rank)
    p = 1.0 if np.allclose(logs, 0) else float(stats.wilcoxon(logs, alternative="two-sided").pvalue)
    return PairedEffect(float(np.exp(hodges_lehmann(logs))), float(np.exp(low)), float(np.exp(high)), p,
                        len(ratios), ratios)  # fmt: skip


def paired_row(base: dict, a: dict, b: dict, a_rounds: dict, b_rounds: dict, threshold: float,
               browsers: tuple[str, str] | None = None) -> ComparisonRow:  # fmt: skip
    """One case of an ab run: A's and B's rows compared round by round (`browsers`: A's and B's, when the run put
    them in two: the row's target then names both)."""
    target = target_label(base)
    if browsers is not None:
        target = f"{target_label(base | {'device': None})} ({browsers[0]} → {browsers[1]})"
    row = ComparisonRow(
        **case_fields(base),
        target=target,
        case=case_label(base),
        status_a=a["status"],
        status_b=b["status"],
        verdict="",
        noisy_a=a["noisy"],
        noisy_b=b["noisy"],
        limit_a=limit_fraction(a),
        limit_b=limit_fraction(b),
    )
    for name in ("model", "precision"):  # what differs between the sides, A → B
        if a[name] != b[name]:
            setattr(row, name, f"{a[name]} → {b[name]}")
    row.case = f"{row.case} {row.precision}"
    if row.status_a not in MEASURED or row.status_b not in MEASURED:
        failed = a if row.status_a not in MEASURED else b
        row.verdict = "unmeasured"
        row.note = f"{failed['variant'].upper()} {failed['status']}: " + (failed["error"] or "").split("\n", 1)[0][:120]
        return row
    row.a_ms, row.b_ms = a["latency_p50_ms"], b["latency_p50_ms"]
    row.n_a, row.n_b = a["iterations"], b["iterations"]
    ratios = round_ratios(a_rounds, b_rounds)
    if len(ratios) < MIN_PAIRED_ROUNDS:
        row.verdict, row.note = "noisy", f"{len(ratios)} paired rounds: a verdict needs >= {MIN_PAIRED_ROUNDS}"
        return row
    effect = paired_effect(ratios)
    row.ratio, row.ci_low, row.ci_high, row.p_value = effect.ratio, effect.ci_low, effect.ci_high, effect.p_value
    row.verdict, note = verdict(effect.ratio, effect.ci_low, effect.ci_high, effect.p_value, False, threshold)
    spread = f"round ratios {min(ratios):.3f}-{max(ratios):.3f} over {effect.rounds} rounds"
    row.note = "; ".join(filter(None, [note, spread]))
    return row


def is_ab_run(db_path: Path, run: str, cwd: Path | None = None) -> bool:
    """Whether the run a selector names was made by `accelharness ab` (False when it names none)."""
    with open_store(Path(db_path), read_only=True) as store:
        try:
            return store.run_info(store.resolve_run(run, cwd))["command"] == "ab"
        except StoreError:
            return False


def ab_browsers(info: dict) -> tuple[str, str] | None:
    """(A's browser, B's) of an ab run that put the variants in two browsers (--a-browser/--b-browser), else None."""
    try:
        arguments = json.loads(info.get("arguments") or "{}")
    except ValueError:
        return None
    a, b = (arguments.get(f"{side}_browser") if isinstance(arguments, dict) else None for side in "ab")
    named = all(isinstance(name, str) and BROWSER_NAME.fullmatch(name) for name in (a, b))  # a bundle's: bounded
    return (a, b) if named else None  # type: ignore[return-value]


def compare_pair(db_path: Path, run: str, threshold: float = 0.05, cwd: Path | None = None) -> Comparison:
    """The paired analysis of an `ab` run (a selector): one row per case, B against A."""
    if not 0 < threshold < 1:
        raise AnalysisError(f"threshold must be between 0 and 1 (got {threshold})")
    with open_store(Path(db_path), read_only=True) as store:
        try:
            run_id = store.resolve_run(run, cwd)
        except StoreError as exc:
            raise AnalysisError(str(exc)) from None
        info = store.run_info(run_id)
        if info["command"] != "ab":
            raise AnalysisError(f"run {run_id} is a '{info['command']}' run, not an `ab` run: compare it with another")
        browsers = ab_browsers(info)
        differ = ("model", "precision") + (("device",) if browsers else ())
        sides: dict[tuple, dict[str, dict]] = {}
        for result in store.results(run_id):
            # the sides may differ in model and precision (and browser: --a-browser/--b-browser): a case is the rest
            key = tuple(v for k, v in case_fields(result).items() if k not in differ)
            sides.setdefault(key, {})[result["variant"]] = result
        rows = []
        for pair in sides.values():
            if "a" in pair and "b" in pair:
                a, b = pair["a"], pair["b"]
                rounds = store.rounds(a["result_id"]), store.rounds(b["result_id"])
                rows.append(paired_row(b, a, b, *rounds, threshold, browsers))
    runs = {run_id: {k: info[k] for k in ("started_at", "status", "git_sha", "hostname", "command")}}
    return Comparison(str(db_path), run_id, run_id, threshold, 0.5, runs, rows, paired=True)
