"""`accelharness web` against the real thing: Chromium at /usr/bin/chromium, onnxruntime-web 1.30 from web/node_modules.

bert-tiny with 5 iterations and no minimum duration keeps each run to seconds; the runs that
share a setting are module fixtures, so the whole file stays well under the 4-minute budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.browser.execute import run_web
from harness.browser.run import EpSetting, WebRequest, validate_web
from harness.store import open_store
from harness.web import driver
from harness.web.eps import EPS
from harness.web.flags import gpu_profile, launch_flags

pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
QUICK = {"iterations": 5, "min_duration_s": 0.0, "warmup": 1, "max_iterations": 50}
# Chromium's headless shell (Debian's chromium-headless-shell): what a headless launch runs where it is installed
HEADLESS_SHELL = Path("/usr/lib/chromium/chromium-headless-shell")
SHELL_INSTALLED = HEADLESS_SHELL.exists()


@pytest.fixture(scope="session")
def web_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One export cache for the session (conftest's when it set one): bert-tiny is exported once."""
    previous = os.environ.get("ACCELHARNESS_CACHE_DIR")
    if previous:
        yield Path(previous)
        return
    path = tmp_path_factory.mktemp("accelharness-cache")
    os.environ["ACCELHARNESS_CACHE_DIR"] = str(path)  # inherited by the prepare_model child
    yield path
    os.environ.pop("ACCELHARNESS_CACHE_DIR", None)


def stored(db: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, list[float]]]:
    """(run row, results by provider with details parsed, samples by provider)."""
    with open_store(db, read_only=True) as store:
        run_id = store.resolve_run("latest")
        rows = {r["provider"]: r | {"details": json.loads(r["details"])} for r in store.results(run_id)}
        samples = {p: store.samples(r["result_id"]) for p, r in rows.items()}
        return store.run_info(run_id) | {"hardware": store.hardware_rows(run_id)}, rows, samples


@pytest.fixture(scope="module")
def all_eps(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict, dict, dict]:
    out = tmp_path_factory.mktemp("web-all")
    request = WebRequest(models=["bert-tiny"], db_path=out / "w.duckdb", output_dir=out / "reports", **QUICK)
    summary = run_web(request)
    return (summary, *stored(request.db_path))


def test_wasm_row_is_measured_and_matches_the_reference(all_eps: tuple) -> None:
    summary, run, rows, samples = all_eps
    assert run["command"] == "web" and run["status"] == "completed"
    row = rows["wasm:threads=1"]
    assert (row["hardware"], row["engine"], row["status"]) == ("wasm", "onnxruntime-web", "ok"), row["error"]
    assert row["iterations"] == len(samples["wasm:threads=1"]) >= 5
    assert all(s > 0 for s in samples["wasm:threads=1"])
    assert row["load_ms"] > 0 and row["first_run_ms"] > 0 and row["load_avg_1m"] is not None
    details = row["details"]
    assert row["max_abs_diff"] <= details["parity_tolerance"]
    assert details["reference"] == "torch-fp32"
    assert details["ort_web_version"] == "1.30.0"
    assert details["wasm_build"] == "ort-wasm-simd-threaded.wasm"  # the plain build, not asyncify/JSEP
    assert details["cross_origin_isolated"] is True and details["threads_dropped"] is False
    assert details["threads_effective"] == 1
    assert details["timer_resolution_ms"] < 0.05  # isolated: 5 µs, not 100 µs
    assert details["browser_version"] and details["browser"] == "chromium" and details["browser_fallback"] is None
    # headless: Chromium's headless shell where installed, as Playwright launches it; the Debian wrapper is skipped
    assert details["browser_binary"] == str(HEADLESS_SHELL if SHELL_INSTALLED else "/usr/lib/chromium/chromium")
    assert details["browser_headless_shell"] is SHELL_INSTALLED
    assert details["browser_found_as"] == ("chromium-headless-shell" if SHELL_INSTALLED else "chromium")
    assert details["flags"] == launch_flags(["wasm"], gpu_profile("auto"))  # no GPU here: --gpu auto is off
    assert (details["gpu_profile"], details["gpu_profile_requested"]) == ("off", "auto")
    assert "no /dev/dri/renderD*" in details["gpu_profile_reason"]
    assert "--enable-unsafe-webgpu" in details["browser_command_line"]
    # the launched browser's renderer (and GPU) processes during the timed loop; the page's own figure needs the
    # full browser (test_web_gpu.py::test_headed_runs_on_a_virtual_display): the headless shell says why it has none
    assert row["memory_peak_mb"] > 0 and "renderer" in details["memory_covers"]
    assert set(details["memory_processes"]) == {"renderer", "gpu-process"} and details["memory_samples"] >= 2
    covers = details["page_memory_covers"]
    if SHELL_INSTALLED:
        assert "page_memory_mb" not in details and covers.startswith("not measured: ") and "not available" in covers
    else:
        assert details["page_memory_mb"] > 0 and "measureUserAgentSpecificMemory" in covers
    assert summary.reports and all(p.exists() for p in summary.reports)


def test_each_ep_setting_measures_the_drift_control_in_the_page(all_eps: tuple) -> None:
    summary, _, _, _ = all_eps
    with open_store(summary.db_path, read_only=True) as store:
        controls = store.controls(summary.run_id)
    by_provider: dict[str, list[dict]] = {}
    for c in controls:
        by_provider.setdefault(c["provider"], []).append(c)
    # one case per setting: before it and after it
    assert {p: [c["position"] for c in cs] for p, cs in by_provider.items()} == {
        p: ["start", "end"] for p in ("wasm:threads=1", "webgpu", "webnn:gpu")
    }
    for c in by_provider["wasm:threads=1"] + by_provider["webgpu"]:
        assert c["error"] is None and c["iterations"] >= 3 and c["median_ms"] > 0 and c["beside"] == "bert-tiny"
    for c in by_provider["webnn:gpu"]:  # no WebNN context on this host: the page's reason, no samples
        assert c["error"] and c["iterations"] == 0 and c["median_ms"] is None


def test_webgpu_runs_on_swiftshader_flagged_as_fallback(all_eps: tuple) -> None:
    _, _, rows, _ = all_eps
    row = rows["webgpu"]
    assert row["status"] == "ok", row["error"]
    details = row["details"]
    assert details["fallback_adapter"] is True and details["adapter_class"] == "software"
    assert details["adapter"]["architecture"] == "swiftshader"
    assert details["probed_adapter"]["description"] == details["adapter"]["description"]
    assert row["memory_peak_mb"] > 0 and details["memory_peak_by_type_mb"]["gpu-process"] > 0
    assert details["node_placement"].get("WebGpuExecutionProvider", 0) > 0
    # the page proved the device before loading the model: the adapter's one trivial dispatch answered
    probe = details["device_probe"]
    assert probe["dispatch_ms"] > 0 and probe["adapter"]["architecture"] == "swiftshader" and probe["deadline_s"] == 10
    assert details["wasm_build"] == "ort-wasm-simd-threaded.asyncify.wasm"


def test_webnn_is_unsupported_with_the_browsers_message(all_eps: tuple) -> None:
    _, run, rows, _ = all_eps
    row = rows["webnn:gpu"]
    assert row["status"] == "unsupported"
    assert "navigator.ml.createContext" in row["error"] and "NotSupportedError" in row["error"]
    assert "--enable-features=WebMachineLearningNeuralNetwork" in row["details"]["flags"]
    hardware = {h["platform"]: h for h in run["hardware"]}
    assert hardware["webnn"]["available"] is False and "NotSupportedError" in hardware["webnn"]["reason"]
    assert hardware["webgpu"]["available"] is True and "fallback" in hardware["webgpu"]["reason"]
    assert hardware["wasm"]["available"] is True


def page_answers(prepared: Any, requests: dict[str, WebRequest]) -> dict[str, dict[str, Any]]:
    """The page's answer to one wasm job for `prepared` (bert-tiny, 1x32) under each request's stop rule, by
    name: one browser, a fresh page per job (as the harness gives each setting)."""
    from harness.browser.run import page_job
    from harness.core.records import Case
    from harness.web.server import PageServer

    async def answer() -> dict[str, dict[str, Any]]:
        from playwright.async_api import async_playwright

        server = PageServer()
        await server.start()
        try:
            async with async_playwright() as playwright:
                profile = gpu_profile("off")
                source = driver.LocalBrowser(driver.resolve_browser("chromium"), launch_flags(["wasm"], profile))
                session = driver.BrowserSession(playwright, source, server)
                try:
                    answers = {}
                    for name, request in requests.items():
                        job = page_job(server, prepared, EpSetting("wasm", 1), Case(1, 32, "fp32"), request)
                        answers[name] = await session.run_job(server.page_url, name, job, 60)
                    return answers
                finally:
                    await session.close()
        finally:
            await server.stop()

    return driver.run_sync(answer())


@pytest.fixture(scope="module")
def bert_tiny(web_cache: Path) -> Any:
    from harness.prepare.prepared import PrepareJob, prepare_model

    spec = validate_web(WebRequest(models=["bert-tiny"], hardware=["wasm"])).specs[0]
    return next(prepare_model(PrepareJob(spec, [(1, 32)])))


@pytest.fixture(scope="module")
def answered(bert_tiny: Any) -> dict[str, dict[str, Any]]:
    """The page's answers under QUICK, and under a 1 ms budget on 100 warmup runs and 1000 iterations."""
    many = {"warmup": 100, "iterations": 1000, "max_iterations": 1000, "min_duration_s": 0.0}
    budget = WebRequest(**many, max_time_s=0.001, min_iterations=2)
    return page_answers(bert_tiny, {"quick": WebRequest(**QUICK), "budget": budget})


def test_wasm_outputs_match_native_onnxruntime(bert_tiny: Any, answered: dict[str, dict[str, Any]]) -> None:
    """Same ONNX file, same npz inputs: the browser's outputs against ORT CPU run in this process."""
    from harness.core.parity import compare
    from harness.core.records import Target
    from harness.native import get_backend
    from harness.native.base import LoadRequest
    from harness.web.answers import decode_outputs

    feeds, reference = bert_tiny.load_case((1, 32))
    native = get_backend("onnxruntime").load(
        LoadRequest(bert_tiny.spec, bert_tiny.onnx_path, "fp32"),
        Target("cpu", "onnxruntime", "CPUExecutionProvider"),
    )
    native_outputs = native.run(native.prepare(feeds))
    answer = answered["quick"]
    assert answer["status"] == "ok", answer.get("error")
    web_outputs = decode_outputs(answer["outputs"])
    against_native = compare(web_outputs, native_outputs, "fp32")
    assert against_native.matches, against_native
    assert against_native.max_abs_diff < 1e-4
    assert compare(web_outputs, reference, "fp32").matches


def test_max_time_stops_the_page_loop_after_min_iterations(answered: dict[str, dict[str, Any]]) -> None:
    """A 1 ms budget on 100 warmup runs and 1000 iterations: the page stops at min_iterations and says so."""
    answer = answered["budget"]
    assert answer["status"] == "ok", answer.get("error")
    assert len(answer["samples_ms"]) == 2
    facts = answer["facts"]
    assert (facts["max_time_s"], facts["warmup_run"], facts["budget_stopped"]) == (0.001, 0, True)


def test_each_page_load_probes_its_wasm_tier(answered: dict[str, dict[str, Any]]) -> None:
    """web/page/tier.mjs, before a page load's first job (each of these answers is its own page's): Chromium's wasm
    tiers up, Liftoff then TurboFan, warm code ~4.5 times faster than first-call code here."""
    for answer in answered.values():
        tier = answer["facts"]["wasm_tier"]
        assert tier["tiered"] is True and tier["ratio"] > 1.5 and tier["cold_ms"] > tier["warm_ms"] > 0, tier
        assert "wasm_tier_error" not in answer["facts"]


WEB_FAULTS = ("throw", "hang", "kill", "frozen_timer", "bad_facts")  # the wasm settings 1 to 5; the 6th is fine


@pytest.fixture(scope="module")
def faulted(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict, dict, dict]:
    """One run, a fault planted in each wasm thread setting but the last: a page that throws, a hung page, a
    killed browser, a page whose clock stands still (0 ms samples) and one whose facts are malformed."""
    out = tmp_path_factory.mktemp("web-faults")
    request = WebRequest(
        models=["bert-tiny"], hardware=["wasm"], threads=[1, 2, 3, 4, 5, 6], timeout_s=10, db_path=out / "f.duckdb",
        output_dir=None, **QUICK,
    )  # fmt: skip
    faults = {f"wasm:threads={n}": fault for n, fault in enumerate(WEB_FAULTS, 1)}
    summary = run_web(request, faults=faults)
    return (summary, *stored(request.db_path))


def test_faults_leave_rows_and_the_run_goes_on(faulted: tuple) -> None:
    """A page that throws, a hung page and a killed browser: each its row, and the later settings run."""
    summary, run, rows, samples = faulted
    assert summary.counts == {"error": 4, "timeout": 1, "ok": 1} and run["status"] == "completed"
    thrown, hung, killed, fine = (rows[f"wasm:threads={n}"] for n in (1, 2, 3, 6))
    assert thrown["status"] == "error" and "the page threw" in thrown["error"]
    assert hung["status"] == "timeout" and "--timeout 10s" in hung["error"] and "restarted" in hung["error"]
    assert killed["status"] == "error" and "is gone" in killed["error"], killed["error"]
    assert fine["status"] == "ok" and len(samples["wasm:threads=6"]) >= 5
    assert fine["details"]["browser_restarts"] == 2  # once after the hang, once after the kill
    assert fine["details"]["threads_effective"] == 6


@pytest.mark.parametrize("fault", ["device_stall", "device_hang"])
def test_a_webgpu_device_that_makes_no_progress_fails_its_setting_once(
    web_cache: Path, tmp_path: Path, fault: str
) -> None:
    """A device whose trivial dispatch never finishes (device_stall: the page's own deadline answers) or
    whose page's main thread is stuck in it (device_hang: the driver's deadline answers): the case whose
    page met it and every later case and control of the setting are `unsupported` naming the adapter, in
    one probe deadline, never one --timeout per page (issue 24, item 6). The start control's page came
    first and proved the device; the fault is in the first case's page."""
    timeout_s = 120
    request = WebRequest(
        models=["bert-tiny"], hardware=["webgpu"], batch_sizes=[1, 2, 4], timeout_s=timeout_s,
        db_path=tmp_path / "d.duckdb", output_dir=None, **QUICK,
    )  # fmt: skip
    finished: list[float] = []
    started = time.monotonic()
    on_result = lambda _result, _id: finished.append(time.monotonic())  # noqa: E731
    summary = run_web(request, on_result=on_result, faults={"webgpu": fault})
    assert time.monotonic() - started < timeout_s  # a single page waiting out --timeout takes that long alone
    assert summary.counts == {"unsupported": 3}
    # the later cases waited for nothing: together they took less than one probe deadline
    deadline_s = EPS["webgpu"].device_probe_s
    assert deadline_s is not None and finished[-1] - finished[0] < deadline_s
    adapter = "WebGPU adapter 'google swiftshader: SwiftShader Device (Subzero)'"
    said = f"{adapter} made no progress on a trivial dispatch in {deadline_s:g} s"
    with open_store(request.db_path, read_only=True) as store:
        rows = [r | {"details": json.loads(r["details"])} for r in store.results(summary.run_id)]
        controls = {c["position"]: c for c in store.controls(summary.run_id)}
    for row in rows:
        assert row["status"] == "unsupported" and row["error"].startswith(said), row["error"]
        details = row["details"]
        assert details["device_probe"]["adapter"]["architecture"] == "swiftshader"
        assert "dispatch_ms" not in details["device_probe"]
        assert details["adapter_class"] == "software" and details["fallback_adapter"] is True
    if fault == "device_hang":  # the page could not say it: the driver did, and restarted the browser
        assert all("(its main thread is stuck)" in row["error"] for row in rows)
        assert rows[-1]["details"]["browser_restarts"] == 1
    assert controls["start"]["error"] is None and controls["start"]["median_ms"] > 0
    for position in ("middle", "end"):
        assert controls[position]["error"].startswith(said) and controls[position]["iterations"] == 0


def test_bad_answers_fail_their_row_only(faulted: tuple) -> None:
    """A page whose clock stands still (0 ms samples) and one whose facts are malformed: each row an
    `error` saying why, nothing of its numbers stored, and the run goes on (issue 11, items 3 and 11)."""
    _, run, rows, samples = faulted
    assert run["status"] == "completed"
    frozen, malformed, fine = (rows[f"wasm:threads={n}"] for n in (4, 5, 6))
    assert "is 0 ms: a timer fault, performance.now() did not advance" in frozen["error"], frozen["error"]
    assert "result.facts.node_placement must be an object of node counts" in malformed["error"], malformed["error"]
    for failed in (frozen, malformed):
        assert failed["status"] == "error" and failed["iterations"] is None and failed["throughput_per_s"] is None
        assert samples[failed["provider"]] == []
    assert fine["status"] == "ok" and all(s > 0 for s in samples["wasm:threads=6"])
    assert fine["details"]["load_measured_with"] == "b1_s32_fp32"  # the page's session was loaded for this case


def test_threads_dropped_without_cross_origin_isolation(web_cache: Path, tmp_path: Path) -> None:
    request = WebRequest(
        models=["bert-tiny"],
        hardware=["wasm"],
        threads=[2],
        cross_origin_isolation=False,
        db_path=tmp_path / "i.duckdb",
        output_dir=None,
        **QUICK,
    )
    run_web(request)
    _, rows, _ = stored(request.db_path)
    row = rows["wasm:threads=2"]
    assert row["status"] == "ok", row["error"]
    details = row["details"]
    assert details["cross_origin_isolated"] is False and details["shared_array_buffer"] is False
    assert (details["threads_requested"], details["threads_effective"], details["threads_dropped"]) == (2, 1, True)
    assert any("crossOriginIsolated" in w for w in details["console_warnings"])


def test_browser_resolution_and_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    edge = driver.resolve_browser("edge")  # no Edge here: Chromium, and the row says so
    assert edge.kind == "chromium" and edge.fallback and "microsoft-edge" in edge.fallback
    # headless: Chromium's headless shell where installed (the launcher script's own binary, not the full one)
    shell, full = driver.resolve_browser("chromium", headless=True), driver.resolve_browser("chromium")
    if SHELL_INSTALLED:
        assert (shell.binary, shell.headless_shell) == (HEADLESS_SHELL, True)
    assert (full.binary, full.headless_shell) == (Path("/usr/lib/chromium/chromium"), False)
    assert driver.resolve_browser("chromium", "/usr/bin/chromium", headless=True).headless_shell is False
    if SHELL_INSTALLED:  # a --browser-path to the shell is labelled the shell too
        assert driver.resolve_browser("chromium", "/usr/bin/chromium-headless-shell").headless_shell is True
    monkeypatch.setattr(
        driver, "CANDIDATES", {"chrome": ("no-such-chrome", "/nonexistent/chrome"), "chromium": ("no-such-chromium",)}
    )
    with pytest.raises(driver.BrowserNotFound) as caught:
        driver.resolve_browser("chrome")
    for looked in ("no-such-chrome", "/nonexistent/chrome", "no-such-chromium"):
        assert looked in str(caught.value)


def test_cli_missing_browser_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.duckdb"
    cli = str(Path(sys.executable).parent / "accelharness")
    command = [cli, "web", "--browser", "edge", "--browser-path", "/nonexistent"]
    done = subprocess.run(
        [*command, "--model", "bert-tiny", "--db", str(db), "--output-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "/nonexistent" in done.stderr
    assert not db.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "bad", [{"hardware": ["webgl"]}, {"threads": [0]}, {"browsers": ["opera"]}, {"batch_sizes": [0]}]
)
def test_bad_requests_are_refused_before_anything_runs(bad: dict, tmp_path: Path) -> None:
    from harness.run.plan import RequestError

    with pytest.raises(RequestError):
        validate_web(WebRequest(models=["bert-tiny"], db_path=tmp_path / "x.duckdb", **bad))
    assert not (tmp_path / "x.duckdb").exists()


def test_failed_export_gives_unsupported_rows_with_the_export_error() -> None:
    from harness.browser.run import not_runnable
    from harness.core.records import Case
    from harness.prepare.prepared import PreparedModel
    from harness.prepare.specs import select_specs

    spec = select_specs(["bert-tiny"], None, False)[0]
    prepared = PreparedModel(spec, "random", "seed=0", None, "exporter exploded", "torch-fp32", None)
    row = not_runnable(spec, prepared, "", EpSetting("wasm", 1), Case(1, 32, "fp32"))
    assert row is not None and row.status == "unsupported" and "exporter exploded" in (row.error or "")
    assert row.target.engine == "onnxruntime-web" and row.target.provider == "wasm:threads=1"


def test_missing_npm_install_names_make_setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from harness.run.plan import RequestError
    from harness.web import ort_dist

    monkeypatch.setattr(ort_dist, "CHECKOUT_DIR", tmp_path / "node_modules" / "onnxruntime-web" / "dist")
    with pytest.raises(RequestError, match="make setup"):
        validate_web(WebRequest(models=["bert-tiny"], db_path=tmp_path / "x.duckdb"))


def test_a_case_that_cannot_be_prepared_fails_alone_in_the_browser(tmp_path: Path) -> None:
    """The graph reshapes to [1, 7]: batch 2's reference cannot be computed, so that case is an `error` row
    with the real reason, and batch 1 of the same model runs in the page and is ok."""
    from test_native_run import _fixed_batch_onnx

    model = tmp_path / "fixed.onnx"
    _fixed_batch_onnx(model)
    request = WebRequest(model_path=model, hardware=["wasm"], batch_sizes=[1, 2], sequence_lengths=[7],
                         db_path=tmp_path / "p.duckdb", output_dir=None, **QUICK)  # fmt: skip
    assert run_web(request).counts == {"ok": 1, "error": 1}
    with open_store(request.db_path, read_only=True) as store:
        rows = {b: (status, error) for b, status, error in store.connection.execute(
            "SELECT batch_size, status, error FROM results").fetchall()}  # fmt: skip
    assert rows[1] == ("ok", None)
    status, error = rows[2]
    assert status == "error" and error.startswith("preparing the inputs and reference outputs failed")
    assert "reshape" in error.lower()
