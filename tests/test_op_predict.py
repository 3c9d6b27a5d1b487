"""The operator predictor on synthetic data with a known cost law: it must recover the law."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.analysis.op_predict import (
    ClassCost,
    NotEnoughProfiles,
    Observation,
    Work,
    fit,
    leave_one_model_out,
    mape,
)

# The law: per class ms per GFLOP, per MB, per node; the latency is the classes' sum. The profiler
# sees each case's class times scaled by a factor of its own (its overhead, another moment's load).
LAW = {
    "matmul": ClassCost(2.0, 0.05, 0.004),
    "matmul_act": ClassCost(5.0, 0.1, 0.01),
    "conv": ClassCost(3.0, 0.2, 0.02),
    "norm": ClassCost(0.0, 0.4, 0.006),
    "softmax": ClassCost(0.0, 0.6, 0.005),
    "elementwise": ClassCost(0.0, 0.3, 0.002),
    "data": ClassCost(0.0, 0.15, 0.001),
}
DRIFT = (0.5, 2.0)  # the profiled times over the timed ones, per case


def synthetic(noise: float, models: int = 8, seed: int = 0) -> list[Observation]:
    """Models with random per-class work, at four (batch, seq) cases each; work grows with tokens."""
    rng = np.random.default_rng(seed)
    observations = []
    for m in range(models):
        base = {
            name: (rng.uniform(0.05, 2.0), rng.uniform(0.5, 40.0), int(rng.integers(5, 150)))
            for name in LAW
            if name != "conv" or m % 2 == 0  # half the models have convolutions
        }
        for batch in (1, 4):
            for seq in (32, 128):
                tokens = batch * seq / 32
                work = {
                    name: Work(g * 1e9 * tokens ** rng.uniform(1.0, 1.3), mb * 1e6 * tokens, nodes)
                    for name, (g, mb, nodes) in base.items()
                }
                drift = rng.uniform(*DRIFT)
                class_ms = {name: LAW[name].time_ms(w) * drift * (1 + rng.normal(0, noise)) for name, w in work.items()}
                latency = sum(LAW[n].time_ms(w) for n, w in work.items()) * (1 + rng.normal(0, noise))
                observations.append(Observation(f"model-{m}", batch, seq, latency, work, class_ms))
    return observations


def test_exact_law_is_recovered() -> None:
    """Noise-free, whatever the profiler's drift: every class's three coefficients come back, and the
    calibration has nothing left to do (scale 1, no per-run overhead)."""
    fitted = fit(synthetic(noise=0.0))
    for name, cost in LAW.items():
        got = fitted.costs[name]
        assert got.ms_per_gflop == pytest.approx(cost.ms_per_gflop, rel=1e-4, abs=1e-9), name
        assert got.ms_per_mb == pytest.approx(cost.ms_per_mb, rel=1e-4, abs=1e-9), name
        assert got.ms_per_node == pytest.approx(cost.ms_per_node, rel=1e-4, abs=1e-9), name
    assert fitted.scale == pytest.approx(1.0, rel=1e-6)
    assert fitted.overhead_ms == pytest.approx(0.0, abs=1e-6)


def test_held_out_models_are_predicted_from_their_graph_alone() -> None:
    """Leave-one-model-out on noise-free data is exact; with 3% noise on every measurement it stays
    within a few percent, far from what a per-model fit could do on unseen work mixes."""
    assert mape(leave_one_model_out(synthetic(noise=0.0))) < 1e-6
    assert mape(leave_one_model_out(synthetic(noise=0.03, seed=1))) < 0.05


def test_a_class_never_profiled_costs_nothing_and_one_model_is_refused() -> None:
    """Work of a class no training case had cannot be priced: it adds no time (and no NaN); a single
    profiled model is too little to fit."""
    data = [o for o in synthetic(noise=0.0) if "conv" not in o.work]
    fitted = fit(data)
    assert fitted.costs["conv"] == ClassCost(0.0, 0.0, 0.0)
    assert fitted.predict({"conv": Work(1e9, 1e6, 3)}) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(NotEnoughProfiles, match="1 model"):
        fit(o for o in data if o.model == data[0].model)


def test_a_case_measured_again_counts_once_with_its_latest_profile(db: Path) -> None:
    """The store's observations: one per case and target, the latest profiled ok result (a later run
    without a profile does not hide it), with its graph work and per-class operator time per iteration."""
    from harness.analysis.op_predict import observations
    from harness.core.profiles import OperatorRow
    from harness.core.records import Case, Result, Target
    from harness.store import open_store

    def result(samples: list[float], profiled: bool) -> Result:
        found = Result("m", "embedding", "random", Target("cpu", "onnxruntime", "CPUExecutionProvider"),
                       Case(1, 8, "fp32"), "ok", samples_ms=samples)  # fmt: skip
        if profiled:
            found.details = {"graph_work": {"matmul": [2e9, 1e6, 4]}}
            found.operators = [OperatorRow("mm", "MatMul", "matmul", "CPUExecutionProvider", None, 5, 5,
                                           5 * samples[0], 1.0, 2e9, 1e6, False)]  # fmt: skip
        return found

    with open_store(db) as store:
        for samples, profiled in (([10.0], True), ([20.0], True), ([30.0], False)):
            store.add_result(store.start_run("test", {}, {}), result(samples, profiled), None)
        (only,) = observations(store).values()
    assert len(only) == 1
    assert only[0].latency_ms == 20.0 and only[0].class_ms == {"matmul": 20.0}
    assert only[0].work["matmul"] == Work(2e9, 1e6, 4)
