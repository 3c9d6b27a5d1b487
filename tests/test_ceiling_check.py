"""Issue 46, a ceiling checked before it is reused (harness.run.ceiling_check): a prior of another run is reused only
when a quick check through the target's own engine does not exceed its fastest rate by more than TOLERANCE, the
fastest prior first; else it is measured afresh, and the stored ceiling states the check either way. Natively on real
ONNX Runtime CPU sessions, in the page on planted answers (PageCalibration's protocol), and end to end through the
CLI with a slow prior planted in a store."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from conftest import run_cli

from harness.browser.page_ceilings import PROBE_STOP, PageCalibration
from harness.core.records import Ceiling, Target
from harness.core.roofline import ceiling_figures
from harness.native import get_backend
from harness.run.ceiling_check import TOLERANCE, Check, checked, now
from harness.run.ceilings import CALIBRATIONS, Prior, engine_software, measure_ceilings, reusable
from harness.run.machine import machine_facts
from harness.store import open_store

CPU = Target("cpu", "onnxruntime", "CPUExecutionProvider")
BANDWIDTH = CALIBRATIONS[0]
FP32 = next(c for c in CALIBRATIONS if (c.kind, c.precision) == ("compute", "fp32"))
FLOOR = "bandwidth-expand-add-64mib"
AMOUNT = 3.0 * 64 * 2**20  # bytes the 64 MiB graph moves per run
SOFTWARE = engine_software({"onnxruntime_version": ort.__version__})
NATIVE = ["native", "--ceilings-only", "--hardware", "cpu", "--engines", "onnxruntime", "--precision", "fp32",
          "--no-reports"]  # fmt: skip


def prior(ms: float, run: str = "20260101T000000-abcdef", own: bool = False, software: str = SOFTWARE) -> Prior:
    """An earlier bandwidth ceiling of the 64 MiB graph whose fastest run took `ms` (201 MB / ms: GB/s)."""
    ceiling = Ceiling(CPU, "bandwidth", "bytes", FLOOR, AMOUNT, [ms, ms * 1.1], software=software, budget_ms=50.0,
                      sizing="probed 201 MB in 10 ms", reused_from=run,
                      measured_at=datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1))  # fmt: skip
    return Prior(ceiling, own)


def test_the_fastest_prior_is_chosen_this_runs_own_first_and_another_size_never() -> None:
    slow, fast, own = prior(40.0, "slow"), prior(10.0, "fast"), prior(80.0, "own", own=True)
    assert reusable([slow, fast], BANDWIDTH, SOFTWARE) is fast
    assert reusable([slow, fast, own], BANDWIDTH, SOFTWARE) is own
    assert reusable([prior(10.0, software="onnxruntime 0.1")], BANDWIDTH, SOFTWARE) is None
    elsewhere = Prior(replace(fast.ceiling, workload="bandwidth-expand-add-3mib"), False)  # not a size it has
    assert reusable([elsewhere], BANDWIDTH, SOFTWARE) is None


def test_a_check_past_the_tolerance_leaves_the_prior_and_says_why() -> None:
    """201 MB in 10 ms is 20.1 GB/s: a check at that rate times (1 + TOLERANCE) still stands, a hair faster does
    not; the words name the run, both rates and the check's time; a copy states only its own check."""
    earlier = prior(10.0, "20260101T000000-abcdef").ceiling
    at = datetime(2026, 11, 29, 6, 30)
    edge = Check(earlier, 10.0 / (1 + TOLERANCE) * 1.0001, 0.2, at)
    assert edge.stands and Check(earlier, 10.0 / (1 + TOLERANCE) * 0.999, 0.2, at).stands is False
    copy = checked(edge)
    assert copy.reused_from == "20260101T000000-abcdef" and copy.samples_ms == earlier.samples_ms
    assert copy.sizing.startswith("quick check 22.1 GB/s <= run 20260101T000000-abcdef's 20.1 GB/s x 1.1 (in 0.2 s")
    assert copy.sizing.endswith("2026-11-29 06:30:00 UTC): reused; probed 201 MB in 10 ms")
    again = checked(Check(copy, 12.0, 0.1, at))  # a copy of the copy: one check stated, the original's sizing kept
    assert again.sizing.count("quick check") == 1 and again.sizing.endswith("reused; probed 201 MB in 10 ms")
    fresh = replace(earlier, samples_ms=[4.0], reused_from=None, sizing="probed 201 MB in 4.1 ms")
    loaded = Check(prior(36.0).ceiling, 13.0, 0.3, at)  # the fault seen: 5.6 GB/s reused, 15 GB/s quiet
    remeasured = checked(loaded, fresh)
    assert remeasured.reused_from is None and remeasured.samples_ms == [4.0]
    assert remeasured.sizing.startswith("quick check 15.5 GB/s > run 20260101T000000-abcdef's 5.59 GB/s x 1.1")
    assert "prior of run 20260101T000000-abcdef re-measured; probed 201 MB in 4.1 ms" in remeasured.sizing


def test_natively_a_slow_prior_is_measured_afresh_and_a_fair_one_reused() -> None:
    """Real ORT CPU sessions: a prior at 0.2 GB/s (1 s a run) is exceeded by this CPU's quick check and measured
    again; one at 201 GB/s (1 ms) is not, and is copied; this run's own is taken unchecked."""
    backend = get_backend("onnxruntime")
    [fresh] = measure_ceilings(backend, CPU, [BANDWIDTH], [prior(1000.0)])
    assert fresh.reused_from is None and fresh.error is None and fresh.samples_ms != [1000.0, 1100.0]
    assert ceiling_figures(fresh.amount, fresh.samples_ms)[0] > 0.201 * (1 + TOLERANCE)
    assert fresh.sizing.startswith("quick check ") and "prior of run 20260101T000000-abcdef re-measured" in fresh.sizing
    assert "; probed " in fresh.sizing and fresh.calibration_s > 0
    [copy] = measure_ceilings(backend, CPU, [BANDWIDTH], [prior(1000.0, "slow"), prior(1.0)])  # the fastest checked
    assert copy.reused_from == "20260101T000000-abcdef" and copy.samples_ms == [1.0, 1.1]
    assert "x 1.1 (in " in copy.sizing and copy.sizing.split("; ")[0].endswith(": reused")
    assert list(measure_ceilings(backend, CPU, [BANDWIDTH], [prior(1000.0, own=True)])) == []


FACTS = {"ort_web_version": "1.30.0", "user_agent": "Mozilla/5.0 (X11; Linux x86_64; rv:140.0) Gecko Firefox/140.0"}


def answer(ms: float, runs: int) -> dict[str, Any]:
    return {"status": "ok", "samples_ms": [ms] * runs, "facts": FACTS}


def page_run(prior_ms: float, gbps: float) -> tuple[PageCalibration, list[tuple[str, Any]]]:
    """A page calibration with one prior of the page's software at `prior_ms`, against a planted page running
    `gbps` at every size; the jobs it asked for (size, stop rule)."""
    from harness.browser.page_ceilings import page_software

    earlier = Prior(replace(prior(prior_ms).ceiling, software=page_software(FACTS)), False)
    step, jobs = PageCalibration(CPU, BANDWIDTH, [earlier], lambda facts: False), []
    while not step.finished:
        jobs.append((step.size.name, step.stop))
        runs = step.stop.iterations if step.measuring else 2
        step.answered(answer(step.size.amount / (gbps * 1e6), runs))
    return step, jobs


def test_in_the_page_the_check_is_a_probe_job_at_the_priors_size() -> None:
    """The first probe names the software; the prior's size is then run under the probe's stop rule. A fair prior
    (201 GB/s against a 15 GB/s page) is copied; a slow one (0.2 GB/s) is measured afresh from the first probe's
    rate, and states its check."""
    smallest = BANDWIDTH.sizes[0].name
    fair, jobs = page_run(1.0, 15.0)
    assert jobs == [(smallest, PROBE_STOP), (FLOOR, PROBE_STOP)]
    assert fair.ceiling.reused_from == "20260101T000000-abcdef" and fair.ceiling.sizing.startswith("quick check 15")
    slow, jobs = page_run(1000.0, 15.0)
    assert jobs[:2] == [(smallest, PROBE_STOP), (FLOOR, PROBE_STOP)] and jobs[-1][1] != PROBE_STOP
    assert slow.ceiling.reused_from is None and ceiling_figures(AMOUNT, slow.ceiling.samples_ms)[0] is not None
    assert "re-measured; probed 3.15 MB in" in slow.ceiling.sizing  # sized from the first probe, kept meanwhile


def test_in_the_page_every_calibration_of_a_target_checks_its_own_prior() -> None:
    """calibrate_in_page (a launched or remote browser's loop): the software read once serves each later calibration,
    whose prior is still checked: a fair bandwidth prior copied, a slow MatMul prior (1 s a run) measured afresh."""
    import asyncio

    from harness.browser.page_ceilings import calibrate_in_page, page_software

    software = page_software(FACTS)
    matmul = next(size for size in FP32.sizes if size.dims == (512, 1024, 1024))
    slow = Ceiling(CPU, "compute", "fp32", matmul.name, matmul.amount, [1000.0], software=software, reused_from="m")
    priors = [Prior(replace(prior(1.0).ceiling, software=software), False), Prior(slow, False)]
    asked: list[str] = []

    async def run_page(calibration: Any, size: Any, stop: Any) -> dict[str, Any]:
        asked.append(size.name)
        per_ms = 15e6 if calibration.kind == "bandwidth" else 30e6  # 15 GB/s, 30 GFLOP/s
        return answer(size.amount / per_ms, stop.iterations)

    found = asyncio.run(calibrate_in_page(run_page, CPU, [BANDWIDTH, FP32], priors, lambda facts: False))
    copy, fresh = found
    assert copy.reused_from == "20260101T000000-abcdef" and copy.sizing.split("; ")[0].endswith(": reused")
    assert fresh.kind == "compute" and fresh.reused_from is None and "prior of run m re-measured" in fresh.sizing
    assert asked[:2] == [BANDWIDTH.sizes[0].name, FLOOR] and matmul.name in asked[3:4], asked  # each probe, then check


def test_a_run_re_measures_a_slow_prior_planted_in_its_store_and_reuses_a_fair_one(tmp_path: Path) -> None:
    """Planted an hour ago on this machine, with this ORT: a bandwidth ceiling of 0.2 GB/s (1 s a run) and an fp32
    MatMul ceiling of 1,070 GFLOP/s (1 ms a run, 3x this CPU's). `native --ceilings-only` measures the first again and
    says why; it copies the second, naming the run that measured it and stating its check (both outcomes are
    planted far past the tolerance: the test holds whatever the machine's load)."""
    db = tmp_path / "c.duckdb"
    matmul = next(size for size in FP32.sizes if size.dims == (512, 1024, 1024))
    fair = Ceiling(CPU, "compute", "fp32", matmul.name, matmul.amount, [1.0, 1.1], software=SOFTWARE, budget_ms=50.0,
                   sizing="probed 1.07 GFLOP in 1 ms")  # fmt: skip
    with open_store(db) as store:
        planted = store.start_run("native", {}, {}, None, machine_facts(None, store.machine_salt()))
        store.add_ceiling(planted, replace(prior(1000.0).ceiling, reused_from=None))
        store.add_ceiling(planted, fair)
    done = run_cli(*NATIVE, "--db", str(db), "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    with open_store(db, read_only=True) as store:
        rows = store.query("SELECT * FROM ceilings WHERE run_id <> ? AND kind <> 'bandwidth_large'", [planted])
    fresh, copy = sorted(rows, key=lambda c: c["kind"])
    assert fresh["kind"] == "bandwidth" and fresh["reused_from"] is None, fresh
    assert fresh["value"] > 0.201 * (1 + TOLERANCE) and f"prior of run {planted} re-measured" in fresh["sizing"]
    assert fresh["sizing"].startswith("quick check ") and "; probed " in fresh["sizing"]
    assert copy["kind"] == "compute" and copy["reused_from"] == planted and copy["value"] == pytest.approx(1073.7, 1e-3)
    assert copy["sizing"].startswith("quick check ") and f"<= run {planted}'s 1.07e+03 GFLOP/s x 1.1" in copy["sizing"]
    assert copy["sizing"].endswith("): reused; probed 1.07 GFLOP in 1 ms") and copy["measured_at"] < now()


def test_a_launched_firefox_that_never_opens_the_page_leaves_each_ceiling_saying_why(tmp_path: Path) -> None:
    """`web --ceilings-only --browser firefox` (no longer refused) with a binary that names itself Firefox and exits:
    every ceiling of the setting is stored with why, and no value (the run's browser part, harness.browser.launched)."""
    fake = tmp_path / "firefox"
    fake.write_text('#!/bin/sh\n[ "$1" = "--version" ] && echo "Mozilla Firefox 153.0esr"\nexit 3\n')
    fake.chmod(0o755)
    db = tmp_path / "f.duckdb"
    done = run_cli("web", "--ceilings-only", "--hardware", "wasm", "--threads", "1", "--precision", "fp32", "--browser",
                   "firefox", "--browser-path", str(fake), "--no-reports", "--db", str(db), "--output-dir",
                   str(tmp_path / "out"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    with open_store(db, read_only=True) as store:
        found = store.query("SELECT * FROM ceilings")
    assert {(c["kind"], c["precision"]) for c in found} >= {("bandwidth", "bytes"), ("compute", "fp32")}
    for ceiling in found:
        assert ceiling["device"] == "firefox" and ceiling["value"] is None and ceiling["samples_ms"] == [], ceiling
        assert "did not stay up" in ceiling["error"], ceiling
