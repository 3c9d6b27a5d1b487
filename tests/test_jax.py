"""The optional jax engine: Flax NNX ports of ResNet and ViT, compile time kept out of the latency.

The run tests need the extra (pip install 'accelharness[jax]') and are skipped with that reason
without it; the probe test runs either way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_native_run import rows

from harness.core.records import Target
from harness.native import get_backend
from harness.run.native import run_native
from harness.run.plan import BenchmarkRequest

REASON = "the jax extra is not installed: pip install 'accelharness[jax]'"


def _run(db: Path, models: list[str], batch_sizes: list[int]) -> list[dict]:
    request = BenchmarkRequest(
        models=models,
        engines=["jax"],
        hardware=["cpu"],
        batch_sizes=batch_sizes,
        warmup=1,
        iterations=5,
        min_duration_s=0,
        db_path=db,
        output_dir=None,
    )
    summary = run_native(request)
    assert summary.counts, summary
    return rows(db, "SELECT * FROM results ORDER BY model, batch_size")


PORTED = ("resnet-tiny", "vit-tiny")


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """One run: the two ported models at batch 1 and 2, and bert-tiny, which JAX has no definition of."""
    pytest.importorskip("jax", reason=REASON)
    pytest.importorskip("flax", reason=REASON)
    db = tmp_path_factory.mktemp("jax") / "jax.duckdb"
    return db, _run(db, ["bert-tiny", *PORTED], [1, 2])


def test_jax_rows_carry_compile_ms_apart_from_the_samples(jax_run: tuple[Path, list[dict]]) -> None:
    import jax

    db, every_row = jax_run
    jax_rows = [r for r in every_row if r["model"] in PORTED]
    assert {(r["model"], r["batch_size"]) for r in jax_rows} == {(m, b) for m in PORTED for b in (1, 2)}
    for r in jax_rows:
        assert (r["engine"], r["hardware"], r["provider"]) == ("jax", "cpu", "cpu")
        assert r["status"] == "ok", r["error"]
        assert r["precision"] == "fp32" and r["requested_precision"] == "fp32"
        assert r["max_abs_diff"] <= 1e-3 and r["weights"] == "random"
        assert r["compile_ms"] > 0 and r["first_run_ms"] > 0 and r["latency_p50_ms"] > 0
        sql = f"SELECT latency_ms FROM samples WHERE result_id = '{r['result_id']}'"
        samples = [s["latency_ms"] for s in rows(db, sql)]
        assert len(samples) == r["iterations"] >= 5
        assert r["compile_ms"] not in samples and r["compile_ms"] != r["first_run_ms"]
        details = json.loads(r["details"])
        assert details["jax_version"] == jax.__version__ and details["flax_version"]
        assert details["x64_enabled"] is False and details["weights_ported_from"].startswith("torch ")
        # each batch size is its own XLA executable, compiled once in prepare()
        assert details["compile_reused"] is False


def test_each_shape_has_its_own_compile_time(jax_run: tuple[Path, list[dict]]) -> None:
    _, jax_rows = jax_run
    for model in PORTED:
        times = [r["compile_ms"] for r in jax_rows if r["model"] == model]
        assert len(set(times)) == 2, times  # batch 1 and batch 2 compiled separately


def test_unsupported_architecture_is_recorded_with_the_reason(jax_run: tuple[Path, list[dict]]) -> None:
    _, every_row = jax_run
    results = [r for r in every_row if r["model"] == "bert-tiny"]
    assert [r["batch_size"] for r in results] == [1, 2]  # a row per case, each refused
    for r in results:
        assert (r["engine"], r["status"]) == ("jax", "unsupported")
        assert "jax engine implements ResNet and ViT only; BertModel has no JAX definition here" in r["error"]
        assert r["compile_ms"] is None and r["latency_p50_ms"] is None  # nothing ran: nothing measured, NULL not 0


def test_int8_is_unsupported_with_the_reason(tmp_path: Path) -> None:
    pytest.importorskip("jax", reason=REASON)
    pytest.importorskip("flax", reason=REASON)
    from harness.native.base import LoadRequest, UnsupportedError
    from harness.prepare.specs import load_specs

    with pytest.raises(UnsupportedError, match="int8 needs quantized layers"):
        get_backend("jax").load(LoadRequest(load_specs()["vit-tiny"], None, "int8"), Target("cpu", "jax", "cpu"))


def test_probe_without_jax_reports_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` now raises ModuleNotFoundError
    backend = get_backend("jax")
    targets = backend.targets()
    assert {t.hardware for t in targets} >= {"cpu", "cuda"} and {t.engine for t in targets} == {"jax"}
    for target in targets:
        availability = backend.probe(target)
        assert not availability.ok
        assert availability.reason == "jax not installed: pip install 'accelharness[jax]'"
