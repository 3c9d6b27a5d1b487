"""Predict latency, throughput and memory for untested combinations, with an honest error.

A scikit-learn pipeline trained on the store's ok rows: ridge regression in log space on
log(parameters), log(FLOPs estimate), log(batch), log(sequence) and one-hot family / target /
precision. Latency scales roughly as a power of work with a per-target factor, so a log-linear
model extrapolates to unseen model sizes where trees would not. Every regressed quantity rises
with work (throughput is regressed as time per batch), so the coefficients are constrained to be
non-negative: when the data cannot separate two features (every text row at one sequence length,
say), a longer sequence is never predicted to be faster. A query outside the measured range of
its family is reported as an extrapolation.

Its error is leave-one-model-out MAPE: each row is predicted by a model that saw no row of the
same model, which is exactly the situation of a prediction for an untested model. With too
little data it refuses instead of guessing. Predictions are labelled as such wherever shown;
they are never stored as results.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import Ridge
from sklearn.metrics import mean_absolute_percentage_error
from sklearn.model_selection import LeaveOneGroupOut, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder

from harness.store import open_store

TARGETS = ("latency_p50_ms", "throughput_per_s", "memory_peak_mb")
CATEGORICAL = ("family", "hardware", "engine", "provider", "precision")
NUMERIC = ("log_parameters", "log_flops", "log_batch", "log_seq")
MIN_ROWS = 12
MIN_MODELS = 3


class InsufficientData(ValueError):
    """Too little measured data for an honest prediction; the message says how much there is."""


@dataclass(frozen=True)
class Query:
    model: str
    family: str
    parameters: int
    hardware: str
    engine: str
    provider: str
    batch_size: int
    seq_len: int | None
    precision: str = "fp32"


@dataclass
class PredictionSet:
    rows: list[dict[str, Any]]  # each query's fields plus predicted_<target> (and measured_<target> if any)
    mape: dict[str, float]  # leave-one-model-out MAPE per target, as a fraction
    training_rows: int
    training_models: int
    notes: list[str] = field(default_factory=list)


def flops_estimate(parameters: int, batch: int, seq: int | None) -> float:
    """Forward FLOPs ≈ 2 × parameters × tokens. Images and audio count as one token per item:
    a coarse feature for the regression, never a reported figure."""
    return 2.0 * parameters * batch * (seq or 1)


def features(row: dict[str, Any]) -> dict[str, Any]:
    seq = row.get("seq_len") or 1
    return {
        **{name: str(row[name]) for name in CATEGORICAL},
        "log_parameters": math.log(row["parameters"]),
        "log_flops": math.log(flops_estimate(row["parameters"], row["batch_size"], seq)),
        "log_batch": math.log(row["batch_size"]),
        "log_seq": math.log(seq),
    }


def _matrix(rows: list[dict[str, Any]]) -> np.ndarray:
    table = [features(r) for r in rows]
    return np.array([[t[name] for name in (*CATEGORICAL, *NUMERIC)] for t in table], dtype=object)


def _pipeline() -> Any:
    categorical = list(range(len(CATEGORICAL)))
    numeric = list(range(len(CATEGORICAL), len(CATEGORICAL) + len(NUMERIC)))
    # The numeric features are logs, in one unit (a factor of e), and stay unscaled: ridge then shrinks each
    # elasticity alike. Standardized, a feature the training models barely vary (two held-in models of 65,536
    # and 66,688 parameters) was blown up to unit variance, and the held-out one (4.4 M) sat hundreds of
    # deviations out: CI saw a held-out latency of 1e81 ms (tests/test_predict_ops.py).
    encode = ColumnTransformer(
        [("categorical", OneHotEncoder(handle_unknown="ignore"), categorical), ("numeric", "passthrough", numeric)]
    )
    # positive=True: more work never predicts less time or memory. The one-hot columns lose
    # nothing by it, since each group's baseline shifts into the (free) intercept.
    return make_pipeline(encode, Ridge(alpha=1.0, positive=True))


def _regressed(target: str, row: dict[str, Any]) -> float:
    """The quantity fitted for a target: throughput as time per batch, so that it rises with work."""
    return row["batch_size"] / row[target] if target == "throughput_per_s" else row[target]


def _from_regressed(target: str, row: dict[str, Any], value: float) -> float:
    return row["batch_size"] / value if target == "throughput_per_s" else value


def training_rows(db_path: Path, mode: str = "inference") -> list[dict[str, Any]]:
    """Every ok row of one mode with a known parameter count: a training step or a generate() call
    is not a forward pass, so each mode is learned from its own rows only."""
    sql = f"""
        SELECT result_id, model, family, hardware, engine, provider, precision, batch_size, seq_len,
               CAST(details->>'$.parameters' AS BIGINT) AS parameters, {", ".join(TARGETS)}
        FROM results
        WHERE status = 'ok' AND details->>'$.parameters' IS NOT NULL AND mode = ?
          AND device IS NULL  -- this machine's own targets: a served device's or another browser's would blur them
    """
    with open_store(db_path, read_only=True) as store:
        return [r for r in store.query(sql, [mode]) if all(r[t] and r[t] > 0 for t in TARGETS)]


class Predictor:
    """One log-linear model per target, with its leave-one-model-out error."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        models = {r["model"] for r in rows}
        if len(rows) < MIN_ROWS or len(models) < MIN_MODELS:
            raise InsufficientData(
                f"too little data to predict honestly: {len(rows)} ok rows over {len(models)} models in the store; "
                f"need at least {MIN_ROWS} rows from {MIN_MODELS} models (run more benchmarks first)"
            )
        self.rows = rows
        self.models = models
        self.known_targets = {(r["hardware"], r["engine"], r["provider"]) for r in rows}
        x = _matrix(rows)
        groups = [r["model"] for r in rows]
        self.fitted: dict[str, Any] = {}
        self.mape: dict[str, float] = {}
        self.held_out: dict[str, list[float]] = {}  # per target, each row's leave-one-model-out prediction
        # Throughput is fitted on its own: it is measured from the mean latency, which noise
        # pulls away from the p50 that latency_p50_ms predicts.
        for target in TARGETS:
            y = np.log([_regressed(target, r) for r in rows])
            held_out = np.exp(cross_val_predict(_pipeline(), x, y, groups=groups, cv=LeaveOneGroupOut()))
            guesses = [_from_regressed(target, r, v) for r, v in zip(rows, held_out, strict=True)]
            self.held_out[target] = guesses
            self.mape[target] = float(mean_absolute_percentage_error([r[target] for r in rows], guesses))
            self.fitted[target] = _pipeline().fit(x, y)

    def predict(self, queries: list[Query]) -> list[dict[str, float]]:
        x = _matrix([q.__dict__ for q in queries])
        regressed = {t: np.exp(model.predict(x)) for t, model in self.fitted.items()}
        return [
            {t: _from_regressed(t, query.__dict__, float(regressed[t][i])) for t in TARGETS}
            for i, query in enumerate(queries)
        ]

    def extrapolations(self, query: Query) -> list[str]:
        """The query's sizes that lie outside what was measured for its family."""
        family = [r for r in self.rows if r["family"] == query.family] or self.rows
        found = []
        sizes = (("parameters", "parameters"), ("batch", "batch_size"), ("seq", "seq_len"))
        for name, column in sizes:
            value = getattr(query, column)
            measured = [r[column] for r in family if r[column] is not None]
            if value is not None and measured and not min(measured) <= value <= max(measured):
                found.append(f"{name} {value:,} outside the measured {min(measured):,}–{max(measured):,}")
        return found


def _measured(rows: list[dict[str, Any]], query: Query) -> dict[str, float] | None:
    """The median of the measured values for exactly this combination, if it was measured."""
    key = (query.model, query.hardware, query.engine, query.provider, query.batch_size, query.seq_len)
    same = [
        r for r in rows if (r["model"], r["hardware"], r["engine"], r["provider"], r["batch_size"], r["seq_len"]) == key
    ]
    return {t: float(np.median([r[t] for r in same])) for t in TARGETS} if same else None


def predict(db_path: Path, queries: list[Query]) -> PredictionSet:
    """Predictions for the queries on targets the store has measurements of."""
    predictor = Predictor(training_rows(db_path))
    notes = []
    usable = []
    for query in queries:
        if (query.hardware, query.engine, query.provider) in predictor.known_targets:
            usable.append(query)
        else:
            notes.append(f"no measurements on {query.hardware}/{query.engine}:{query.provider} to learn from")
    rows = []
    for query, predicted in zip(usable, predictor.predict(usable) if usable else [], strict=True):
        row: dict[str, Any] = dict(query.__dict__) | {f"predicted_{t}": v for t, v in predicted.items()}
        if (measured := _measured(predictor.rows, query)) is not None:
            row |= {f"measured_{t}": v for t, v in measured.items()}
        if outside := predictor.extrapolations(query):
            note = f"b{query.batch_size} s{query.seq_len} extrapolated ({query.family}): {'; '.join(outside)}"
            notes += [note] if note not in notes else []  # one per case, not per target
        rows.append(row)
    return PredictionSet(rows, predictor.mape, len(predictor.rows), len(predictor.models), notes)


def spec_parameters(model: str) -> tuple[str, int]:
    """(family, parameter count) of a model spec, counted on the meta device: no weights allocated."""
    import torch
    import transformers

    from harness.prepare.specs import load_specs

    spec = load_specs()[model]
    config = transformers.AutoConfig.for_model(spec.model_type, **spec.config)
    with torch.device("meta"):
        module = getattr(transformers, spec.architecture)(config)
    return spec.family, sum(p.numel() for p in module.parameters())


def model_facts(db_path: Path, model: str) -> tuple[str, int]:
    """(family, parameters) from the store if the model was measured, else from its spec."""
    with open_store(db_path, read_only=True) as store:
        rows = store.query(
            "SELECT family, CAST(details->>'$.parameters' AS BIGINT) AS p FROM results "
            "WHERE model = ? AND details->>'$.parameters' IS NOT NULL LIMIT 1",
            [model],
        )
    return (rows[0]["family"], rows[0]["p"]) if rows else spec_parameters(model)


def as_json(result: PredictionSet) -> str:
    return json.dumps(result.__dict__, indent=2, default=str)
