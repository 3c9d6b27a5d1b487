"""Latency from operators: per target, a cost per op class fitted on profiled operator times,
summed over a model's graph, calibrated on measured end-to-end latencies.

For each class of operator (linear-layer matmuls, activation matmuls, convolutions, norms, softmax,
elementwise, data movement, other) the time a target spends on it in one iteration is modelled as an
additive roofline with a per-call overhead:

    t_class = flops · a + bytes · b + nodes · c        (a = 1/compute rate, b = 1/bandwidth)

with a, b, c ≥ 0 fitted on that class's time across every profiled case of the target. A class's
time in a case is its share of the profiled operator time times the measured latency: the profile
says how an iteration divides among the classes, the timed loop how long it takes. (The profiled
iterations run on a twin session, with the profiler's overhead, at another moment than the timed
loop, so their absolute times drift from the latency by a factor that differs from case to case on
a shared machine; their shares drift far less.) The work (flops, bytes, nodes) comes from the
case's ONNX graph (harness.core.graph_cost), never from the profile, so a model that was never run
is predicted from its graph alone. What the class costs leave unexplained is calibrated per target:

    latency = s · Σ t_class + o                        (s, o ≥ 0: scale and per-run overhead)

Both fits minimise relative error (rows weighted by 1/latency), the quantity MAPE scores. Like
nn-Meter's kernel-level predictors, costs are learned per kind of operator, not per model, which is
what lets a fit on some models carry to another.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from harness.core.op_types import CLASSES
from harness.store import open_store

FEATURES = ("gflops", "mb", "nodes")  # the fit's units: ms per GFLOP, per MB moved, per node
MIN_MODELS = 2  # a fit needs profiles of at least this many models of the target


class NotEnoughProfiles(ValueError):
    """The target has too few profiled models for an operator fit."""


@dataclass(frozen=True)
class Work:
    """One class's work in one case's graph."""

    flops: float
    bytes: float
    nodes: int

    def features(self) -> np.ndarray:
        return np.array([self.flops / 1e9, self.bytes / 1e6, float(self.nodes)])


@dataclass(frozen=True)
class Observation:
    """A profiled case on one target: its graph's work, its operator time and its latency."""

    model: str
    batch_size: int
    seq_len: int | None
    latency_ms: float  # measured end to end (the timed loop's median)
    work: Mapping[str, Work]  # per class, from the ONNX graph at this case's shapes
    class_ms: Mapping[str, float]  # per class, profiled time per iteration
    result_id: str | None = None  # the stored result it comes from


@dataclass(frozen=True)
class ClassCost:
    ms_per_gflop: float
    ms_per_mb: float
    ms_per_node: float

    def time_ms(self, work: Work) -> float:
        return float(np.dot([self.ms_per_gflop, self.ms_per_mb, self.ms_per_node], work.features()))

    def describe(self) -> str:
        rate = f"{1 / self.ms_per_gflop:.3g} GFLOP/ms" if self.ms_per_gflop > 0 else "no FLOP term"
        bandwidth = f"{1 / self.ms_per_mb:.3g} MB/ms" if self.ms_per_mb > 0 else "no byte term"
        return f"{rate}, {bandwidth}, {self.ms_per_node * 1000:.3g} µs/node"


@dataclass
class OperatorModel:
    """One target's fitted costs."""

    costs: dict[str, ClassCost]
    scale: float
    overhead_ms: float
    models: list[str] = field(default_factory=list)  # the models it was fitted on
    rows: int = 0

    def operator_ms(self, work: Mapping[str, Work]) -> float:
        return sum(self.costs[c].time_ms(w) for c, w in work.items() if c in self.costs)

    def predict(self, work: Mapping[str, Work]) -> float:
        return self.scale * self.operator_ms(work) + self.overhead_ms


def _relative_nnls(features: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Non-negative least squares of weights·(features·x − targets), columns scaled for conditioning."""
    scaled = features * weights[:, None]
    norms = np.linalg.norm(scaled, axis=0)
    usable = norms > 0
    solution = np.zeros(features.shape[1])
    if usable.any():
        found, _ = nnls(scaled[:, usable] / norms[usable], targets * weights)
        solution[usable] = found / norms[usable]
    return solution


def fit(observations: Iterable[Observation]) -> OperatorModel:
    """Per-class costs on the profiled class times, then the calibration on end-to-end latencies."""
    rows = list(observations)
    models = sorted({o.model for o in rows})
    if len(models) < MIN_MODELS:
        raise NotEnoughProfiles(f"profiles of {len(models)} model(s); an operator fit needs {MIN_MODELS}")
    weights = np.array([1.0 / o.latency_ms for o in rows])
    empty = Work(0.0, 0.0, 0)
    costs = {}
    for name in CLASSES:
        features = np.array([o.work.get(name, empty).features() for o in rows])
        times = np.array([_class_time(o, name) for o in rows])
        costs[name] = ClassCost(*_relative_nnls(features, times, weights))
    fitted = OperatorModel(costs, 1.0, 0.0, models, len(rows))
    operator = np.array([fitted.operator_ms(o.work) for o in rows])
    latency = np.array([o.latency_ms for o in rows])
    fitted.scale, fitted.overhead_ms = _relative_nnls(np.column_stack([operator, np.ones(len(rows))]), latency, weights)
    return fitted


def _class_time(observation: Observation, name: str) -> float:
    """The class's share of the profiled operator time, times the measured latency."""
    total = sum(observation.class_ms.values())
    return observation.class_ms.get(name, 0.0) / total * observation.latency_ms if total > 0 else 0.0


def leave_one_model_out(observations: Iterable[Observation]) -> list[tuple[Observation, float]]:
    """Each observation with the latency predicted by a fit that saw no case of its model."""
    rows = list(observations)
    predicted = []
    for model in sorted({o.model for o in rows}):
        held_out = [o for o in rows if o.model == model]
        fitted = fit(o for o in rows if o.model != model)
        predicted += [(o, fitted.predict(o.work)) for o in held_out]
    return predicted


def mape(pairs: Iterable[tuple[Observation, float]]) -> float:
    """Mean absolute percentage error, as a fraction."""
    errors = [abs(guess - o.latency_ms) / o.latency_ms for o, guess in pairs]
    return float(np.mean(errors)) if errors else float("nan")


# --- from the store --------------------------------------------------------------------------------------
TargetKey = tuple[str, str, str, str]  # (hardware, engine, provider, precision): each has its own costs

# The latest profiled ok result per case (model, target, precision, batch, seq): a case measured again
# (a quieter machine, a newer engine) replaces its older measurement rather than weighing twice.
OBSERVATIONS_SQL = """
WITH latest AS (
    SELECT * FROM results
    WHERE status = 'ok' AND mode = 'inference' AND latency_p50_ms > 0 AND (details->'$.graph_work') IS NOT NULL
      AND result_id IN (SELECT result_id FROM operators)
    QUALIFY row_number() OVER (
        PARTITION BY model, hardware, engine, provider, precision, batch_size, seq_len ORDER BY created_at DESC
    ) = 1
)
SELECT r.result_id, r.model, r.hardware, r.engine, r.provider, r.precision, r.batch_size, r.seq_len,
       r.latency_p50_ms, r.details->'$.graph_work' AS graph_work, o.op_class,
       sum(o.total_ms / o.profile_iterations) AS class_ms
FROM latest r JOIN operators o USING (result_id)
GROUP BY ALL
"""


def observations(store: Any) -> dict[TargetKey, list[Observation]]:
    """The latest profiled ok inference result of each case with its graph's work, per target and precision."""
    rows: dict[str, dict[str, Any]] = {}
    for row in store.query(OBSERVATIONS_SQL):
        entry = rows.setdefault(row["result_id"], row | {"classes": {}})
        entry["classes"][row["op_class"]] = row["class_ms"]
    found: dict[TargetKey, list[Observation]] = defaultdict(list)
    for row in rows.values():
        work = {name: Work(*values) for name, values in json.loads(row["graph_work"]).items()}
        key = (row["hardware"], row["engine"], row["provider"], row["precision"])
        found[key].append(
            Observation(
                row["model"], row["batch_size"], row["seq_len"], row["latency_p50_ms"], work, row["classes"],
                row["result_id"],
            )
        )  # fmt: skip
    return dict(found)


@dataclass
class TargetFit:
    """One target's operator model (None when too few models were profiled on it) and its held-out error."""

    target: TargetKey
    observations: list[Observation]
    model: OperatorModel | None
    held_out: list[tuple[Observation, float]]  # leave-one-model-out predictions (needs 3 models)
    why_not: str | None = None  # why there is no model, or no held-out error

    @property
    def mape(self) -> float | None:
        return mape(self.held_out) if self.held_out else None

    @property
    def models(self) -> list[str]:
        return sorted({o.model for o in self.observations})


def fit_targets(db_path: Path) -> dict[TargetKey, TargetFit]:
    """Every profiled target's operator model, fitted on all its profiles, with its LOMO error."""
    with open_store(db_path, read_only=True) as store:
        found = observations(store)
    fits = {}
    for target, rows in sorted(found.items()):
        try:
            model = fit(rows)
        except NotEnoughProfiles as exc:
            fits[target] = TargetFit(target, rows, None, [], str(exc))
            continue
        if len({o.model for o in rows}) > MIN_MODELS:
            fits[target] = TargetFit(target, rows, model, leave_one_model_out(rows))
        else:
            why = f"a held-out error needs profiles of {MIN_MODELS + 1} models (each fit leaves one out)"
            fits[target] = TargetFit(target, rows, model, [], why)
    return fits
