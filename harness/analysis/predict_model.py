"""`predict` for one model: each target by the method with the lowest held-out error it has, and the
methods' held-out errors.

A target with profiles of enough models is predicted from operators (harness.analysis.op_predict):
the asked model's graph work at each case, priced by that target's fitted per-class costs. A target with
measured ceilings and rows of enough models whose work was counted is predicted by the roofline
(harness.analysis.roofline_inference): a fixed overhead plus the graph's FLOPs and bytes at fitted fractions of
its ceilings. Both graphs are counted by the caller (an export, never a run), so a model that was never
measured, even an unknown `--model-path`, is predicted. Every target can fall back to the log-linear fit
on parameter counts (harness.analysis.predict), whose error is one over the whole store. Each target takes
the method whose leave-one-model-out error is lowest (an unknown error ranks last), and each row names its
method and that error; predictions are never stored as results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.op_predict import TargetFit, TargetKey, Work, fit_targets
from harness.analysis.predict import TARGETS, InsufficientData, Predictor, Query, predict, training_rows
from harness.analysis.roofline_data import Book, read_book
from harness.analysis.roofline_fit import lomo_error
from harness.analysis.roofline_inference import inference_fits, roofline_rows
from harness.core.labels import MARK_STYLES, marks
from harness.prepare.prepared import CaseShape
from harness.store import open_store

OPERATORS, LOG_LINEAR, ROOFLINE = "operators", "log-linear", "roofline"
PREFERENCE = (OPERATORS, ROOFLINE, LOG_LINEAR)  # the order of methods whose errors tie (or are all unknown)


@dataclass(frozen=True)
class Asked:
    """The model and the cases a prediction is asked for, and the targets it is limited to."""

    model: str
    family: str
    parameters: int | None
    shapes: list[CaseShape]
    precision: str = "fp32"
    hardware: list[str] | None = None  # None: every target the store knows
    engines: list[str] | None = None

    def wants(self, hardware: str, engine: str) -> bool:
        return (not self.hardware or hardware in self.hardware) and (not self.engines or engine in self.engines)


@dataclass
class ModelPredictions:
    rows: list[dict[str, Any]]  # per target and case: predicted_<quantity>, method, held_out_mape, measured_*
    notes: list[str] = field(default_factory=list)


def operator_fits(db_path: Path, asked: Asked) -> dict[TargetKey, TargetFit]:
    """The asked targets (at the asked precision) whose profiles give an operator model."""
    return {
        key: found
        for key, found in fit_targets(db_path).items()
        if found.model is not None and key[3] == asked.precision and asked.wants(key[0], key[1])
    }


def learned_marks(db_path: Path, fits: Mapping[TargetKey, TargetFit]) -> dict[TargetKey, str]:
    """Per target, the mark codes (M, F, C, P, T, B, ~) of the measured rows its fit learned from: a
    prediction learned from a software adapter's or a noisy loop's rows carries their marks."""
    ids = {key: {o.result_id for o in found.observations if o.result_id} for key, found in fits.items()}
    with open_store(db_path, read_only=True) as store:
        rows = store.query(
            "SELECT * FROM results WHERE result_id IN (SELECT unnest(?))", [sorted(set().union(*ids.values()))]
        )
    kinds = {row["result_id"]: {kind for kind, _ in marks(row)} for row in rows}
    return {
        key: "".join(style.code for kind, style in MARK_STYLES.items() if any(kind in kinds.get(i, ()) for i in found))
        for key, found in ids.items()
    }


def _operator_rows(
    asked: Asked, fits: Mapping[TargetKey, TargetFit], work: Mapping[CaseShape, Any], db_path: Path
) -> list[dict]:
    rows = []
    learned = learned_marks(db_path, fits)
    for (hardware, engine, provider, precision), found in fits.items():
        assert found.model is not None
        for (batch, seq), by_class in work.items():
            latency = found.model.predict({name: Work(*values) for name, values in by_class.items()})
            row = {
                "model": asked.model, "family": asked.family, "parameters": asked.parameters,
                "hardware": hardware, "engine": engine, "provider": provider, "precision": precision,
                "batch_size": batch, "seq_len": seq, "method": OPERATORS, "held_out_mape": found.mape,
                "predicted_latency_p50_ms": latency, "predicted_throughput_per_s": batch * 1000.0 / latency,
                "predicted_memory_peak_mb": None,  # operators say nothing of memory
                "learned_from_marks": learned[(hardware, engine, provider, precision)],
            }  # fmt: skip
            same = [
                o.latency_ms
                for o in found.observations
                if (o.model, o.batch_size, o.seq_len) == (asked.model, batch, seq)
            ]
            if same:
                row["measured_latency_p50_ms"] = float(np.median(same))
            rows.append(row)
    return rows


def _log_linear_rows(db_path: Path, asked: Asked, covered: set[tuple[str, str, str]]) -> tuple[list[dict], list[str]]:
    """The log-linear fit's rows for the asked targets no operator model covers."""
    targets = sorted({(r["hardware"], r["engine"], r["provider"]) for r in training_rows(db_path)} - covered)
    queries = [
        Query(asked.model, asked.family, asked.parameters, *t, batch_size=b, seq_len=s, precision=asked.precision)
        for t in targets
        if asked.wants(t[0], t[1])
        for b, s in asked.shapes
    ]
    if not queries:
        return [], []
    found = predict(db_path, queries)
    rows = [row | {"method": LOG_LINEAR, "held_out_mape": found.mape["latency_p50_ms"]} for row in found.rows]
    return rows, found.notes


def predict_model(
    db_path: Path,
    asked: Asked,
    fits: Mapping[TargetKey, TargetFit],
    work: Mapping[CaseShape, Any] | None,
    per_item: Mapping[CaseShape, Mapping[str, Any]] | None = None,
) -> ModelPredictions:
    """Every method each target has: operators where `fits` has it and the graph's `work` (per case, per class)
    is known; the roofline where its ceilings and rows allow and the graph's `per_item` work is known; the
    log-linear fit: every method's rows (best_per_target keeps each target's best; --method one of them).
    Raises InsufficientData when no method can predict anything."""
    rows = _operator_rows(asked, fits, work, db_path) if work else []
    if per_item:
        rows += roofline_rows(inference_fits(db_path, asked.precision, asked.model, asked.wants), asked, per_item)
    notes = []
    covered: set[tuple[str, str, str]] = set()
    if asked.parameters is None:
        notes.append(f"{LOG_LINEAR}: the model's parameter count is unknown")
    else:
        try:
            found, found_notes = _log_linear_rows(db_path, asked, covered)
            rows += found
            notes += found_notes
        except InsufficientData as exc:
            if not rows:
                raise InsufficientData(f"{exc}; nor has any target profiles of enough models (--profile)") from None
            notes.append(f"{LOG_LINEAR}: {exc}")
    if not rows:
        raise InsufficientData("no measured target matches the asked hardware, engines and precision")
    return ModelPredictions(rows, notes)


def best_per_target(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target's rows of the one method with the lowest held-out error (unknown: last; ties: PREFERENCE)."""
    errors: dict[tuple[str, str, str], dict[str, float]] = {}
    for row in rows:
        error = row["held_out_mape"]
        target = (row["hardware"], row["engine"], row["provider"])
        errors.setdefault(target, {})[row["method"]] = float("inf") if error is None else error
    chosen = {t: min(found, key=lambda m: (found[m], PREFERENCE.index(m))) for t, found in errors.items()}
    return [row for row in rows if chosen[(row["hardware"], row["engine"], row["provider"])] == row["method"]]


# --- predict --evaluate ----------------------------------------------------------------------------------
@dataclass
class MethodErrors:
    """One target's held-out latency error by each method, on the same profiled results."""

    target: TargetKey
    rows: int
    models: int
    operators: float | None  # leave-one-model-out MAPE of the operator predictor
    log_linear: float | None  # ... and of the log-linear fit, trained on the same results
    roofline: float | None = None  # ... and of the roofline, on the same results where their ceilings were measured
    notes: list[str] = field(default_factory=list)


def compare_methods(db_path: Path) -> list[MethodErrors]:
    """Per profiled target, both predictors' leave-one-model-out MAPE for latency on the same data:
    the results with profiles. The log-linear fit learns across targets (as it always does), from
    those results only, and its held-out predictions are scored per target."""
    fits = fit_targets(db_path)
    book = read_book(db_path, "inference")
    profiled = {o.result_id for f in fits.values() for o in f.observations}
    same = [r for r in training_rows(db_path) if r["result_id"] in profiled]
    try:
        old, old_why = Predictor(same), None
    except InsufficientData as exc:
        old, old_why = None, str(exc)
    errors = []
    for target, found in fits.items():
        notes = [f"{OPERATORS}: {found.why_not}"] if found.why_not else []
        log_linear = None
        if old is not None:
            pairs = [
                (row["latency_p50_ms"], guess)
                for row, guess in zip(old.rows, old.held_out[TARGETS[0]], strict=True)
                if (row["hardware"], row["engine"], row["provider"], row["precision"]) == target
            ]
            log_linear = float(np.mean([abs(g - y) / y for y, g in pairs])) if pairs else None
        else:
            notes.append(f"{LOG_LINEAR}: {old_why}")
        roofline = roofline_error(book, target, profiled)
        errors.append(MethodErrors(target, len(found.observations), len(found.models), found.mape, log_linear,
                                   roofline, notes))  # fmt: skip
    return errors


def roofline_error(book: Book, target: TargetKey, kept: set[str]) -> float | None:
    """The roofline's leave-one-model-out latency MAPE on a target's results among `kept` (None: too few models, or
    no ceilings measured)."""
    hardware, engine, provider, precision = target
    points = [
        p
        for where in book.rows
        if (where.hardware, where.engine, where.provider, where.device) == (hardware, engine, provider, "")
        for p in book.points(where, "inference", precision=precision)
        if p.result_id in kept
    ]
    return lomo_error(points, scored="time")


# --- predict --method / --max-error: only what a user can act on -------------------------------------------
# the choices of --method: harness.analysis.options.METHOD_CHOICES


def believable(
    rows: list[dict[str, Any]], method: str = "any", max_error: float | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of `method` (any: every method) whose held-out error is known and at most `max_error`
    (None: any known error), and one reason per target left out. Without a filter every row is kept."""
    if method == "any" and max_error is None:
        return rows, []
    kept, left_out = [], {}
    methods: dict[str, set[str]] = {}
    for row in rows:
        methods.setdefault(f"{row['hardware']}/{row['engine']}:{row['provider']}", set()).add(row["method"])
    for row in rows:
        target = f"{row['hardware']}/{row['engine']}:{row['provider']}"
        error = row["held_out_mape"]
        if method != "any" and row["method"] != method:
            if method not in methods[target]:
                left_out[target] = f"{target} has no {method} prediction (only {', '.join(sorted(methods[target]))})"
        elif error is None:
            left_out[target] = f"{target}: {row['method']} has no held-out error (too few models)"
        elif max_error is not None and error > max_error:
            why = f"the {row['method']} method's held-out error {error:.0%} is above {max_error:.0%}"
            left_out[target] = f"{target}: {why}"
        else:
            kept.append(row)
    return kept, sorted(set(left_out.values()))
