"""Issue 46, a bandwidth ceiling past the last-level cache: bandwidth_large (harness.run.ceilings) measured after the
floor, skipped where it would not fit the time rules, stored with its workload; and the predictor holding a step's
bytes against the bandwidth they see (harness.core.roofline.effective_bandwidth, harness.analysis.roofline_data.Book).
One real ONNX Runtime CPU calibration at a planted budget (the large graph measured for real: test_roofline.py); the
predictions are on stores whose truth is known."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import harness.run.ceilings as ceilings_module
from harness.analysis.roofline_data import read_book
from harness.analysis.roofline_predict import METHODS, GenerationAsk, predict_generation
from harness.core.records import Case, Ceiling, Result, Target
from harness.core.roofline import effective_bandwidth, working_set_bytes
from harness.native import get_backend
from harness.run.ceilings import BANDWIDTH_LARGE, CALIBRATIONS, Sizing, measure_ceilings, new_ceiling
from harness.store import open_store

MIB = 2**20
BANDWIDTH, LARGE = (next(c for c in CALIBRATIONS if c.kind == kind) for kind in ("bandwidth", "bandwidth_large"))
CPU = Target("cpu", "onnxruntime", "CPUExecutionProvider")


def test_the_bandwidth_a_steps_bytes_see_is_the_cache_s_below_the_large_one_s_above_and_between_in_log() -> None:
    small, large = (128 * MIB, 20.0), (512 * MIB, 12.0)
    assert effective_bandwidth(1e6, small, large) == effective_bandwidth(128 * MIB, small, large) == 20.0
    assert effective_bandwidth(512 * MIB, small, large) == effective_bandwidth(4e9, small, large) == 12.0
    assert effective_bandwidth(256 * MIB, small, large) == pytest.approx(16.0)  # halfway in log(bytes)
    assert 12.0 < effective_bandwidth(400 * MIB, small, large) < 16.0
    assert effective_bandwidth(4e9, small, None) == 20.0  # no large ceiling: the one there is, as before
    assert working_set_bytes(3.0 * 4 * BANDWIDTH_LARGE) == 512 * MIB  # E and T live, not the three passes


def test_the_large_graph_is_sized_from_the_floor_s_rate_and_a_slow_target_skips_it_saying_why() -> None:
    """This CPU's 18.6 GB/s and wasm's ~10 measure the 256 MiB graph; SwiftShader's 0.76 GB/s would take ~1 s a run:
    the ceiling is stored with no value, its workload the graph it did not run, and why."""
    for gbps in (18.6, 10.0):
        sizing = Sizing(LARGE)
        sizing.take(gbps * 1e6, "a planted rate")
        assert sizing.done and sizing.skipped is None and sizing.size.dims == (BANDWIDTH_LARGE,)
    sizing = Sizing(LARGE)
    sizing.take(0.76e6, "a planted rate")
    assert sizing.skipped and "not measured" in sizing.skipped and "bandwidth-expand-add-256mib" in sizing.skipped
    ceiling = sizing.unmeasured(new_ceiling(CPU, LARGE))
    assert ceiling.workload == "bandwidth-expand-add-256mib" and not ceiling.samples_ms and ceiling.error


def test_the_large_ceiling_is_stored_with_its_workload_measured_or_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ONNX Runtime's CPU EP with a planted budget as slow as the CPU: the bandwidth graph shrinks, and
    bandwidth_large, sized at its rate (no probe of its own), is skipped, saying why; stored beside a measured one
    (its samples planted: test_roofline.py measures it for real, natively and in the page), each as its own kind."""
    monkeypatch.setattr(ceilings_module, "CEILING_BUDGET_MS", 0.05)
    bandwidth, skipped = measure_ceilings(get_backend("onnxruntime"), CPU, [BANDWIDTH, LARGE])
    assert bandwidth.error is None and bandwidth.samples_ms and skipped.kind == "bandwidth_large"
    assert not skipped.samples_ms and skipped.error.startswith("not measured: at the rate of the bandwidth ceiling's")
    assert skipped.workload == "bandwidth-expand-add-256mib" and skipped.sizing.startswith("not probed")
    sizing = Sizing(LARGE, 50.0)
    sizing.take(12e6, "a planted rate")
    measured = replace(sizing.stated(new_ceiling(Target("wasm", "onnxruntime-web", "wasm:threads=1"), LARGE)),
                       samples_ms=[65.0, 66.0, 70.0])  # fmt: skip
    with open_store(tmp_path / "s.duckdb") as store:
        run_id = store.start_run("native", {}, {})
        for ceiling in (bandwidth, skipped, measured):
            store.add_ceiling(run_id, ceiling)
        stored = {(c["hardware"], c["kind"]): c for c in store.ceilings(run_id)}
    large, none = stored["wasm", "bandwidth_large"], stored["cpu", "bandwidth_large"]
    assert (large["workload"], large["amount"]) == ("bandwidth-expand-add-256mib", 3.0 * 4 * BANDWIDTH_LARGE)
    assert large["value"] == pytest.approx(3.0 * 4 * BANDWIDTH_LARGE / 0.065 / 1e9)
    assert none["value"] is None and none["error"] == skipped.error and none["workload"] == large["workload"]


# --- the predictor, on a store whose truth is known ----------------------------------------------------------------
OVERHEAD_S, EFFICIENCY, SMALL_GBPS, LARGE_GBPS = 2e-4, 0.8, 20.0, 12.0
SMALL_SET, LARGE_SET = 128 * MIB, 512 * MIB  # the graphs' live bytes: amount = 1.5 x the working set
TRAINING = {"m1": 1e6, "m2": 8e6, "m3": 40e6}  # bytes per token: all inside the cache


def step_s(nbytes: float, gbps: float) -> float:
    return OVERHEAD_S + nbytes / (EFFICIENCY * gbps * 1e9)


def planted_store(db: Path, large: bool) -> None:
    """One target whose rows decode at exactly step_s(B, the in-cache ceiling), with or without bandwidth_large."""
    with open_store(db) as store:
        run_id = store.start_run("seed", {}, {})
        kinds = [("bandwidth", SMALL_GBPS, SMALL_SET)] + ([("bandwidth_large", LARGE_GBPS, LARGE_SET)] if large else [])
        for kind, gbps, live in kinds:  # value: amount / the fastest sample
            amount = 1.5 * live
            store.add_ceiling(run_id, Ceiling(CPU, kind, "bytes", "bw", amount, samples_ms=[amount / gbps / 1e6] * 3))
        store.add_ceiling(run_id, Ceiling(CPU, "compute", "fp32", "mm", 1e11, samples_ms=[1000.0] * 3))
        for model, nbytes in TRAINING.items():
            step_ms = 1000 * step_s(nbytes, SMALL_GBPS)
            result = Result(model, "llama", "random", CPU, Case(1, 8, "fp32", "generate", 4, 0), "ok",
                            samples_ms=[4 * step_ms] * 3, ttft_samples_ms=[step_ms] * 3,
                            step_samples_ms=[[step_ms] * 3] * 3, bytes_per_token=nbytes,
                            prefill_flops_per_token=1e6)  # fmt: skip
            store.add_result(run_id, result, None)


def predicted(db: Path, nbytes: float) -> dict:
    ask = GenerationAsk("big", "fp32", "fp32", {(1, 8, 0): {"bytes_per_token": nbytes, "prefill_flops_per_token": 1e6}},
                        4)  # fmt: skip
    (row,) = predict_generation(db, ask).rows
    return row


def test_a_store_without_the_large_ceiling_predicts_as_before_and_with_it_a_model_past_the_cache_is_slower(
    tmp_path: Path,
) -> None:
    """Without bandwidth_large every step is held against the bandwidth ceiling (the law before it); with it, the
    in-cache models fit the same law, a model past the large graph's working set is held against bandwidth_large,
    one between against the interpolation, and each row says which."""
    planted_store(before := tmp_path / "before.duckdb", large=False)
    planted_store(after := tmp_path / "after.duckdb", large=True)
    book = read_book(after, "generate")
    (where,) = book.rows
    assert book.working_sets[where.ceiling_key("bandwidth_large")] == pytest.approx(LARGE_SET)
    for nbytes in (20e6, 300 * MIB, 600 * MIB):
        old = predicted(before, nbytes)
        assert old["held_out_mape"] == pytest.approx(0.0, abs=1e-6)
        assert 1 / old["predicted_decode_tokens_per_s"] == pytest.approx(step_s(nbytes, SMALL_GBPS))
        assert old["bandwidth_used_gbps"] == pytest.approx(SMALL_GBPS) and "no bandwidth_large" in old["bandwidth_used"]
    inside, between, past = (predicted(after, n) for n in (20e6, 300 * MIB, 600 * MIB))
    assert inside["predicted_decode_tokens_per_s"] == pytest.approx(predicted(before, 20e6)[
        "predicted_decode_tokens_per_s"])  # fmt: skip
    assert 1 / past["predicted_decode_tokens_per_s"] == pytest.approx(step_s(600 * MIB, LARGE_GBPS))
    assert past["bandwidth_used"].startswith("bandwidth_large") and past["bandwidth_large_gbps"] == pytest.approx(
        LARGE_GBPS
    )
    assert LARGE_GBPS < between["bandwidth_used_gbps"] < SMALL_GBPS and "between" in between["bandwidth_used"]
    assert all("bandwidth_large" in METHODS[row["method"]] for row in (inside, between, past))


@pytest.mark.parametrize(("gbps", "measured"), [(12.0, True), (0.76, False)])
def test_a_served_device_probes_the_floor_then_measures_the_large_graph_or_skips_it(
    gbps: float, measured: bool
) -> None:
    """web --serve has no bandwidth ceiling at hand: its first job probes the 64 MiB graph, whose rate (planted)
    sizes the 256 MiB one: measured as the next job on a fast device, skipped with the reason on a slow one."""
    from test_ceiling_sizing import PlantedServer

    from harness.browser.run import EpSetting
    from harness.browser.served_ceilings import ServedCeilings

    stored: list[Ceiling] = []
    served, files, setting = ServedCeilings(stored.append), PlantedServer(), EpSetting("wasm", 1, device="phone-1")
    device = type("Device", (), {})()
    device.jobs = list(served.jobs(files, setting, [LARGE], ()))
    facts = {"ort_web_version": "1.30.0", "user_agent": "Mozilla/5.0 (Linux; Android 14) Chrome/141.0"}
    labels = []
    while not stored:
        job = next(j for j in device.jobs if getattr(j, "outcome", None) is None)
        labels.append(job.label)
        size = next(s for s in LARGE.sizes if s.name in job.label)
        samples = [size.amount / (gbps * 1e6)] * (3 if "measure" in job.label else 2)
        job.taken, job.outcome = 0.0, served.answered(files, device, job, {"status": "ok", "samples_ms": samples,
                                                                           "facts": facts})  # fmt: skip
    [ceiling] = stored
    assert "probe bandwidth-expand-add-64mib" in labels[0] and ceiling.workload == "bandwidth-expand-add-256mib"
    assert len(labels) == (2 if measured else 1) and bool(ceiling.samples_ms) is measured
    assert (ceiling.error is None) is measured and "Android 14" in ceiling.software
