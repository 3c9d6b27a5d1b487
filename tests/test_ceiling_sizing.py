"""Issue 46, the ceilings half: each calibration sized to a time budget per run (harness.run.ceilings.Sizing), a
target's ceilings reused from an earlier run on the same machine and software within a day
(harness.run.ceiling_reuse), and `--ceilings-only`. Real ONNX Runtime CPU sessions on the small sizes; the page's
side runs in tests/test_roofline.py's real run and in docs/measurement.md's figures."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from conftest import run_cli

import harness.run.ceilings as ceilings_module
from harness.core.records import Ceiling, Target
from harness.core.roofline import ceiling_figures
from harness.native import get_backend
from harness.run.ceiling_job import only_calibrations
from harness.run.ceiling_reuse import REUSE_AGE, CeilingBook
from harness.run.ceilings import (
    BANDWIDTH_FLOOR,
    CALIBRATIONS,
    CEILING_BUDGET_MS,
    ENOUGH,
    MATMUL_REFERENCE,
    Prior,
    Sizing,
    engine_software,
    measure_ceilings,
)
from harness.store import open_store

CPU = Target("cpu", "onnxruntime", "CPUExecutionProvider")
BANDWIDTH, LARGE, FP32, INT4 = CALIBRATIONS
# fp32 only: the int4 calibration costs another ~0.3 s a run (only_calibrations: every class without --precision)
NATIVE = ["native", "--ceilings-only", "--hardware", "cpu", "--engines", "onnxruntime", "--precision", "fp32",
          "--no-reports"]  # fmt: skip


def probed(calibration: Any, per_ms: float, budget_ms: float = CEILING_BUDGET_MS) -> Sizing:
    """Sizing run to its end against a planted target that does `per_ms` of work per ms at every size."""
    sizing = Sizing(calibration, budget_ms)
    while not sizing.done:
        sizing.observe(sizing.size.amount / per_ms)
    return sizing


def test_a_slow_target_shrinks_and_a_fast_one_grows_each_within_the_budget() -> None:
    """A software adapter's 0.45 GFLOP/s runs the smallest MatMuls, a GPU's 50 TFLOP/s the largest; each
    size's run fits the budget, and is long enough (ENOUGH of it) or the next size up would not fit (the ladder's
    ends aside)."""
    sizes = FP32.sizes
    for rate_gflops in (0.45, 31.0, 330.0, 50_000.0):
        per_ms = rate_gflops * 1e6
        run_ms = sizes[(index := probed(FP32, per_ms).index)].amount / per_ms
        assert run_ms <= CEILING_BUDGET_MS or index == 0, rate_gflops
        if index + 1 < len(sizes):
            assert run_ms >= ENOUGH * CEILING_BUDGET_MS or sizes[index + 1].amount / per_ms > CEILING_BUDGET_MS
    # SwiftShader shrinks; this CPU (3.3 ms a run) and wasm (35 ms) keep the reference size; a GPU grows to the top
    assert probed(FP32, 0.45e6).index < MATMUL_REFERENCE == probed(FP32, 330e6).index == probed(FP32, 31e6).index
    assert probed(FP32, 50_000e6).index == len(FP32.sizes) - 1


def test_the_bandwidth_graph_stays_past_a_cache_unless_the_target_is_slow() -> None:
    """The 64 MiB floor holds for every target that runs it within SLACK budgets (a phone's 5 GB/s too);
    SwiftShader's 0.76 GB/s shrinks below it."""
    for gbps in (5.0, 13.0, 20.0):
        assert probed(BANDWIDTH, gbps * 1e6).index >= BANDWIDTH_FLOOR, gbps
    assert probed(BANDWIDTH, 0.76e6).index < BANDWIDTH_FLOOR


def test_the_first_jump_goes_no_further_than_the_reference_size() -> None:
    """A tiny graph's rate (in a cache, or mostly fixed cost) is not trusted past the reference size: the second
    probe runs there, and its rate chooses."""
    sizing = Sizing(FP32)
    sizing.observe(FP32.sizes[0].amount / 1e9)  # an absurd rate from the smallest size
    assert not sizing.done and sizing.index == MATMUL_REFERENCE


def test_a_planted_slow_target_measures_a_smaller_graph_and_states_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget of 0.05 ms per run makes this CPU as slow as the budget: its graphs are the smallest sizes, and
    each ceiling states its size, budget and probes; its value is its own samples'."""
    monkeypatch.setattr(ceilings_module, "CEILING_BUDGET_MS", 0.05)
    found = list(measure_ceilings(get_backend("onnxruntime"), CPU, [BANDWIDTH, FP32]))
    assert [(c.kind, c.precision) for c in found] == [("bandwidth", "bytes"), ("compute", "fp32")]
    for ceiling, calibration in zip(found, (BANDWIDTH, FP32), strict=True):
        assert ceiling.error is None and ceiling.budget_ms == 0.05
        names = [size.name for size in calibration.sizes]
        assert names.index(ceiling.workload) <= 1, ceiling.workload  # the smallest sizes
        assert ceiling.amount == calibration.sizes[names.index(ceiling.workload)].amount
        assert ceiling.sizing.startswith("probed ") and ceiling.workload in ceiling.sizing
        assert ceiling.software == engine_software({"onnxruntime_version": ort.__version__})
        assert ceiling.calibration_s > 0 and ceiling.reused_from is None
        assert ceiling_figures(ceiling.amount, ceiling.samples_ms)[0] > 0


def earlier(software: str, hours: float, own: bool = False) -> Prior:
    # 201 GB/s: above what any CPU here runs, so the quick check before reuse (harness.run.ceiling_check) keeps it
    measured = Ceiling(CPU, "bandwidth", "bytes", "bandwidth-expand-add-64mib", 3.0 * 64 * 2**20, [1.0, 1.1],
                       software=software, budget_ms=50.0, reused_from="20260101T000000-abcdef",
                       measured_at=datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=hours))  # fmt: skip
    return Prior(measured, own)


def test_an_earlier_ceiling_of_the_same_software_is_copied_and_another_softwares_is_measured() -> None:
    software = engine_software({"onnxruntime_version": ort.__version__})
    [copied] = measure_ceilings(get_backend("onnxruntime"), CPU, [BANDWIDTH], [earlier(software, 1)])
    assert copied.reused_from == "20260101T000000-abcdef" and copied.samples_ms == [1.0, 1.1]
    assert copied.calibration_s is None  # the original's (none planted): a copy costs this run no calibration
    assert list(measure_ceilings(get_backend("onnxruntime"), CPU, [BANDWIDTH], [earlier(software, 1, True)])) == []
    [measured] = measure_ceilings(get_backend("onnxruntime"), CPU, [BANDWIDTH], [earlier("onnxruntime 0.1", 1)])
    assert measured.reused_from is None and measured.samples_ms != [1.0, 1.1]


def stored(db: Path, hours: float, software: str = "the same", machine: str = "m1", error: str | None = None) -> str:
    """A run on `machine` holding one bandwidth ceiling measured `hours` ago; its run id."""
    with open_store(db) as store:
        run_id = store.start_run("native", {}, {}, None, {"machine_id": machine})
        when = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=hours)
        ceiling = replace(earlier(software, hours).ceiling, reused_from=None, measured_at=when, error=error)
        store.add_ceiling(run_id, ceiling if error is None else replace(ceiling, samples_ms=[]))
    return run_id


def test_a_run_takes_this_machines_ceilings_within_the_age_and_fresh_takes_none(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    recent = stored(db, 1)
    stored(db, REUSE_AGE.total_seconds() / 3600 + 1)  # past the age
    stored(db, 1, machine="m2")  # another machine
    stored(db, 1, error="planted")  # no value
    this = stored(db, 0.01)  # the run asking: its own ceiling is no other run's
    book = CeilingBook()
    with open_store(db) as store:
        book.load(store, this)
    taken = book.for_target(CPU, "reuse")
    assert sorted(p.ceiling.reused_from for p in taken if not p.own) == [recent]
    assert [p.ceiling.reused_from for p in taken if p.own] == [this]  # a resumed run's own, of any age
    assert book.for_target(CPU, "fresh") == ()
    assert book.for_target(replace(CPU, provider="CPUExecutionProvider:threads=1"), "reuse") == ()


def ceilings_of(db: Path) -> list[dict[str, Any]]:
    with open_store(db, read_only=True) as store:
        return store.query("SELECT * FROM ceilings ORDER BY run_id, kind, precision")


def test_ceilings_only_stores_ceilings_and_no_result_a_resume_takes_its_own_and_a_new_run_copies_them(
    tmp_path: Path,
) -> None:
    """`native --ceilings-only` stores the cpu target's ceilings and no result; resumed, the run takes its
    own and stores nothing again; the same command again copies them (naming the run that measured them, its
    figures and measured_at), and `--ceilings fresh` measures them again."""
    db, where = tmp_path / "c.duckdb", ["--db", str(tmp_path / "c.duckdb"), "--output-dir", str(tmp_path / "out")]
    first = run_cli(*NATIVE, *where)
    assert first.returncode == 0, first.stderr
    assert "Ceilings" in first.stdout and "sized to a run of" in first.stdout
    with open_store(db, read_only=True) as store:
        assert store.query("SELECT count(*) AS n FROM results")[0]["n"] == 0
    measured = ceilings_of(db)
    run_id = measured[0]["run_id"]
    assert {(c["kind"], c["precision"]) for c in measured} == {("bandwidth", "bytes"), ("compute", "fp32")}
    everything = tuple(c for c in CALIBRATIONS if c is not LARGE)  # conftest: ACCELHARNESS_NO_BANDWIDTH_LARGE=1
    assert only_calibrations(None) == everything and only_calibrations("q4,fp32") == everything
    assert all(c["value"] > 0 and c["budget_ms"] == CEILING_BUDGET_MS and c["software"] for c in measured)
    with open_store(db) as store:  # the run as a stop left it
        store.connection.execute("UPDATE runs SET status = 'interrupted'")
    resumed = run_cli(*NATIVE, "--resume", *where)
    assert resumed.returncode == 0 and f"continuing run {run_id}" in resumed.stdout, resumed.stdout
    assert ceilings_of(db) == measured  # its own, taken: nothing measured or stored again
    with open_store(db) as store:  # made 10x faster: the quick check before reuse (ceiling_check) lets them stand
        for c in measured:  # whatever the load of either run
            samples = [ms / 10 for ms in c["samples_ms"]]
            store.connection.execute("UPDATE ceilings SET samples_ms = ?, value = ?, spread = ? WHERE kind = ?",
                                     [samples, *ceiling_figures(c["amount"], samples), c["kind"]])  # fmt: skip
    measured = ceilings_of(db)
    assert run_cli(*NATIVE, *where).returncode == 0
    copies = [c for c in ceilings_of(db) if c["run_id"] != run_id]
    assert [c["reused_from"] for c in copies] == [run_id] * 2
    figures = ("workload", "amount", "value", "spread", "samples_ms", "measured_at", "software", "budget_ms")
    assert [[c[f] for f in figures] for c in copies] == [[c[f] for f in figures] for c in measured]
    assert run_cli(*NATIVE, "--ceilings", "fresh", *where).returncode == 0
    fresh = [c for c in ceilings_of(db) if c["run_id"] not in (run_id, copies[0]["run_id"])]
    assert len(fresh) == 2
    assert all(c["reused_from"] is None and c["measured_at"] > measured[-1]["measured_at"] for c in fresh)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-ceilings"], "--ceilings-only measures ceilings and --no-ceilings measures none"),
        (["--model", "bert-tiny"], "--ceilings-only runs no model: drop --model"),
        (["--profile"], "--ceilings-only runs no model: drop --profile"),
    ],
)
def test_a_bad_combination_is_refused_and_nothing_is_written(tmp_path: Path, args: list[str], message: str) -> None:
    db = tmp_path / "n.duckdb"
    done = run_cli(*NATIVE, *args, "--db", str(db))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not db.exists()


def test_fresh_ceilings_with_no_ceilings_is_refused(tmp_path: Path) -> None:
    done = run_cli("native", "--model", "bert-tiny", "--ceilings", "fresh", "--no-ceilings", "--db",
                   str(tmp_path / "n.duckdb"))  # fmt: skip
    assert done.returncode == 2 and "--ceilings fresh measures ceilings and --no-ceilings" in done.stderr


class PlantedServer:
    """The device server's side a served calibration uses: files served by name, jobs added to a device's list."""

    def set_job_files(self, files: dict[str, Any]) -> dict[str, str]:
        return {name: f"/job/{name}" for name in files}

    def add_job(self, device: Any, job: Any) -> None:
        device.jobs.append(job)


def test_a_served_devices_calibration_adds_each_next_job_after_the_last_and_stores_its_ceiling() -> None:
    """web --serve: the probe of the smallest size, then (its answer planted: a 0.45 GFLOP/s device) the next job
    right after it in the device's list, before a model job already there; the measuring answer's ceiling stored."""
    from harness.browser.run import EpSetting
    from harness.browser.served_ceilings import ServedCeilings

    stored: list[Ceiling] = []
    served, files, setting = ServedCeilings(stored.append), PlantedServer(), EpSetting("wasm", 1, device="phone-1")
    device = type("Device", (), {})()
    device.jobs = [*served.jobs(files, setting, [FP32], ()), "a model's job"]
    facts = {"ort_web_version": "1.30.0", "user_agent": "Mozilla/5.0 (Linux; Android 14) Chrome/141.0"}
    per_ms = 0.45e6
    while not stored:
        job = next(j for j in device.jobs if j != "a model's job" and getattr(j, "outcome", None) is None)
        size = next(s for s in FP32.sizes if s.name in job.label)
        samples = [size.amount / per_ms] * (5 if "measure" in job.label else 2)
        job.taken, job.outcome = 0.0, served.answered(files, device, job, {"status": "ok", "samples_ms": samples,
                                                                           "facts": facts})  # fmt: skip
    assert device.jobs[-1] == "a model's job"  # each next job came right after the one answered
    [ceiling] = stored
    assert ceiling.target == setting.target and ceiling.target.device == "phone-1"
    assert ceiling.workload == FP32.sizes[probed(FP32, per_ms).index].name and ceiling.budget_ms == CEILING_BUDGET_MS
    assert "onnxruntime-web 1.30.0" in ceiling.software and "Android 14" in ceiling.software
    assert ceiling_figures(ceiling.amount, ceiling.samples_ms)[0] == pytest.approx(0.45)
