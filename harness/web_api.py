"""`accelharness web`: the native run's ONNX file and input tensors, run in headless Chromium through
onnxruntime-web (wasm, webgpu, webnn), parity-checked against the same reference, stored in the same tables.

from harness.web_api import WebRequest, run_web
summary = run_web(WebRequest(models=["bert-tiny"], hardware=["wasm"], threads=[1, 2]))
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from harness.api import (
    BenchmarkRequest,
    Plan,
    RequestError,
    RunOptions,
    check_db_path,
    check_measuring,
    check_positive,
    check_selection,
    execute_native,
    validate,
)
from harness.measure import MeasureConfig
from harness.parity import compare
from harness.prepare import PreparedModel, PrepareJob, prepare_isolated
from harness.recording import Body, Emit, RunSummary, record_run
from harness.result import Case, Result, Target, result_key
from harness.specs import ModelSpec
from harness.worker import Job, result_for

WEB_HARDWARE = ("wasm", "webgpu", "webnn")
WEBNN_DEVICES = ("cpu", "gpu", "npu")
ENGINE = "onnxruntime-web"
# --timeout bounds a page job; a cold export in the prepare child can legitimately take longer.
PREPARE_TIMEOUT_FLOOR_S = 120.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class WebRequest(RunOptions):
    hardware: list[str] = field(default_factory=lambda: list(WEB_HARDWARE))
    browser: str = "chromium"  # chrome | chromium | edge (chrome and edge fall back to Chromium, recorded)
    browser_path: Path | None = None
    threads: list[int] = field(default_factory=lambda: [1])  # wasm threads; webgpu/webnn use the first
    webnn_device: str = "gpu"
    # False drops COOP/COEP: the page is then not cross-origin isolated and ORT-web silently runs one
    # wasm thread. Only for showing that the harness detects it (details.threads_dropped).
    cross_origin_isolation: bool = True


@dataclass(frozen=True)
class EpSetting:
    ep: str
    threads: int
    device_type: str | None = None  # WebNN deviceType

    @property
    def provider(self) -> str:
        # Threads are part of the wasm provider so 1 and 2 threads are distinct report columns.
        if self.ep == "wasm":
            return f"wasm:threads={self.threads}"
        return f"webnn:{self.device_type}" if self.ep == "webnn" else self.ep

    @property
    def target(self) -> Target:
        return Target(self.ep, ENGINE, self.provider)


@dataclass
class WebPlan:
    specs: list[ModelSpec]
    settings: list[EpSetting]
    browser: Any  # harness.web.driver.BrowserChoice
    request: WebRequest
    done: frozenset[str] = frozenset()  # result keys a resumed run already holds: never run twice

    def cases(self, spec: ModelSpec) -> list[Case]:
        seqs: list[int | None] = list(self.request.sequence_lengths) if spec.inputs.uses_sequence else [None]
        return [Case(b, s, "fp32") for b in self.request.batch_sizes for s in seqs]

    def remaining(self, spec: ModelSpec, setting: EpSetting) -> list[Case]:
        return [c for c in self.cases(spec) if result_key(spec.name, setting.target, c) not in self.done]

    def has_work(self, spec: ModelSpec) -> bool:
        return any(self.remaining(spec, setting) for setting in self.settings)

    @property
    def total_results(self) -> int:
        return sum(len(self.remaining(spec, setting)) for spec in self.specs for setting in self.settings)


def _settings(request: WebRequest) -> list[EpSetting]:
    settings: list[EpSetting] = []
    for ep in WEB_HARDWARE:  # a fixed order: one browser launch per EP
        if ep not in request.hardware:
            continue
        if ep == "wasm":
            settings += [EpSetting("wasm", t) for t in dict.fromkeys(request.threads)]
        else:  # ops the GPU/NPU EP cannot run fall back to wasm with this many threads
            settings.append(EpSetting(ep, request.threads[0], request.webnn_device if ep == "webnn" else None))
    return settings


def validate_web(request: WebRequest) -> WebPlan:
    """Check every input (browser and ORT-web install included) before anything is written."""
    from harness.web.driver import BROWSERS, BrowserNotFound, resolve_browser
    from harness.web.server import SetupError, dist_files

    check_positive("--batch-sizes", request.batch_sizes)
    check_positive("--sequence-lengths", request.sequence_lengths)
    check_positive("--threads", request.threads)
    check_measuring(request)
    if not request.hardware:
        raise RequestError(f"--hardware is empty; valid: {', '.join(WEB_HARDWARE)}")
    for hw in request.hardware:
        if hw not in WEB_HARDWARE:
            raise RequestError(f"unknown web hardware '{hw}'; valid: {', '.join(WEB_HARDWARE)}")
    if request.webnn_device not in WEBNN_DEVICES:
        raise RequestError(f"unknown WebNN device '{request.webnn_device}'; valid: {', '.join(WEBNN_DEVICES)}")
    if request.browser not in BROWSERS:
        raise RequestError(f"unknown browser '{request.browser}'; valid: {', '.join(BROWSERS)}")
    specs = check_selection(request)
    check_db_path(Path(request.db_path))
    try:
        browser = resolve_browser(request.browser, request.browser_path)
        dist_files()
    except (BrowserNotFound, SetupError) as exc:
        raise RequestError(str(exc)) from exc
    return WebPlan(specs, _settings(request), browser, request)


# --- one case ---------------------------------------------------------------------------------------


def _page_details(facts: dict[str, Any], setting: EpSetting) -> dict[str, Any]:
    from harness.web.driver import is_fallback_adapter

    details = dict(facts)
    details["console_warnings"] = [ANSI.sub("", line) for line in facts.get("console_warnings", [])]
    wasm = [f for f in facts.get("wasm_files", []) if f.endswith(".wasm")]
    details["wasm_build"] = wasm[0] if wasm else None
    if setting.ep == "webgpu":
        details["fallback_adapter"] = is_fallback_adapter(facts.get("adapter") or facts.get("probed_adapter"))
    if setting.ep == "webnn":
        details["webnn_device_type"] = setting.device_type
    placement = facts.get("node_placement")
    if placement:  # ORT's own CPU EP nodes inside the wasm runtime
        details["cpu_fallback_nodes"] = placement.get("CPUExecutionProvider", 0)
        details["cpu_fallback"] = details["cpu_fallback_nodes"] > 0
    return details


def build_result(
    prepared: PreparedModel,
    setting: EpSetting,
    case: Case,
    answer: dict[str, Any],
    extra: dict[str, Any],
    reference: list[np.ndarray],
) -> Result:
    """The Result for one page answer: statistics come from samples_ms, parity from the first run's outputs."""
    from harness.web.server import decode_outputs

    job = Job(prepared, setting.target, [], MeasureConfig())
    details = extra.pop("details") | _page_details(answer.get("facts", {}), setting)
    if answer["status"] != "ok":
        return result_for(job, case, answer["status"], answer["error"], details=details, **extra)
    fields = {"samples_ms": answer["samples_ms"], "load_ms": answer["load_ms"], "first_run_ms": answer["first_run_ms"]}
    names = [out["name"] for out in answer["outputs"]]  # the page's session.outputNames, in order
    try:
        parity = compare(decode_outputs(answer["outputs"]), reference, "fp32", names)
    except ValueError as exc:
        return result_for(job, case, "error", f"parity check failed: {exc}", details=details, **extra, **fields)
    details |= parity.details
    return result_for(job, case, parity.status, parity.error, details=details, **parity.fields, **extra, **fields)


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def page_job(
    server: Any, prepared: PreparedModel, setting: EpSetting, case: Case, request: WebRequest, fault: str | None = None
) -> dict[str, Any]:
    """Serve the case's ONNX file and input tensors (from the PreparedModel's npz) and describe the page job."""
    from harness.web.driver import BUNDLES

    feeds, _ = prepared.load_case((case.batch_size, case.seq_len))
    stem = _file_stem(prepared.spec.name)
    arrays = {f"{stem}.{i}.bin": np.ascontiguousarray(v) for i, v in enumerate(feeds.values())}
    assert prepared.onnx_path is not None
    urls = server.set_job_files({f"{stem}.onnx": prepared.onnx_path} | {k: v.tobytes() for k, v in arrays.items()})
    return {
        "model_url": urls[f"{stem}.onnx"],
        "inputs": [
            {"name": name, "url": urls[key], "dtype": str(array.dtype), "dims": list(array.shape)}
            for name, (key, array) in zip(feeds, arrays.items(), strict=True)
        ],
        "ep": setting.ep,
        "device_type": setting.device_type,
        "threads": setting.threads,
        "bundle": BUNDLES[setting.ep],
        "warmup": request.warmup,
        "iterations": request.iterations,
        "min_duration_ms": request.min_duration_s * 1000,
        "max_iterations": request.max_iterations,
        "case": case.key,  # the page names the case whose session load a later case reuses
        "fault": fault,  # test-only
    }


async def _run_case(
    server: Any, session: Any, plan: WebPlan, prepared: PreparedModel, setting: EpSetting, case: Case, fault: str | None
) -> Result:
    job = page_job(server, prepared, setting, case, plan.request, fault)
    await session.ensure_started()  # a start failure is the job's answer, below
    browser_facts = session.facts()  # the browser this job ran in, even if it is restarted after a failure
    psutil.cpu_percent(interval=None)  # starts the whole-machine CPU window for this job
    answer = await session.run_job(server.page_url, (prepared.spec.name, setting), job, plan.request.timeout_s)
    extra = {
        "load_avg_1m": os.getloadavg()[0],
        "cpu_percent": psutil.cpu_percent(interval=None),
        "details": browser_facts
        | {
            "input_shapes": {i["name"]: i["dims"] for i in job["inputs"]},
            "cross_origin_isolation_served": server.isolate,
        },
    }
    _, reference = prepared.load_case((case.batch_size, case.seq_len))
    return build_result(prepared, setting, case, answer, extra, reference)


# --- the run ----------------------------------------------------------------------------------------

Prepared = tuple[ModelSpec, PreparedModel | None, str]  # (spec, prepared or None, why not)


def _prepare(plan: WebPlan, spec: ModelSpec) -> Prepared:
    """The same prepare_model child as native: same cached ONNX file, same npz inputs and reference."""
    shapes = sorted({(c.batch_size, c.seq_len) for c in plan.cases(spec)}, key=str)
    timeout_s = max(plan.request.timeout_s, PREPARE_TIMEOUT_FLOOR_S)
    prepared, outcome = prepare_isolated(PrepareJob(spec, shapes), timeout_s)
    if prepared:
        return spec, prepared, ""
    return spec, None, f"model preparation failed ({outcome.status}): {outcome.message or 'no result'}"


def _not_runnable(
    spec: ModelSpec, prepared: PreparedModel | None, why: str, setting: EpSetting, case: Case
) -> Result | None:
    """The row for a case that cannot reach the browser, or None when it can."""
    if prepared is None:
        return Result(spec.name, spec.family, "unknown", setting.target, case, "error", error=why)
    job = Job(prepared, setting.target, [], MeasureConfig())
    skip = prepared.skipped.get((case.batch_size, case.seq_len))
    if skip:
        return result_for(job, case, "unsupported", skip)
    if prepared.onnx_path is None:
        return result_for(job, case, "unsupported", f"ONNX export failed: {prepared.onnx_error}")
    return None


def _ep_cases(
    plan: WebPlan, models: list[Prepared], ep: str
) -> Iterator[tuple[ModelSpec, PreparedModel | None, str, EpSetting, Case]]:
    for spec, prepared, why in models:
        for setting in (s for s in plan.settings if s.ep == ep):
            for case in plan.remaining(spec, setting):
                yield spec, prepared, why, setting, case


async def _run_ep(
    playwright: Any,
    server: Any,
    plan: WebPlan,
    models: list[Prepared],
    ep: str,
    emit: Callable[[Result], None],
    faults: Mapping[str, str],
) -> None:
    from harness.web.driver import BrowserSession, launch_flags

    session = None  # launched on first use, with this EP's flags only
    try:
        for spec, prepared, why, setting, case in _ep_cases(plan, models, ep):
            row = _not_runnable(spec, prepared, why, setting, case)
            if row is None:
                assert prepared is not None
                session = session or BrowserSession(playwright, plan.browser, launch_flags([ep]))
                row = await _run_case(server, session, plan, prepared, setting, case, faults.get(setting.provider))
            emit(row)
    finally:
        if session is not None:
            await session.close()


async def _run_all(
    plan: WebPlan, models: list[Prepared], emit: Callable[[Result], None], faults: Mapping[str, str]
) -> None:
    from playwright.async_api import async_playwright

    from harness.web.server import PageServer

    server = PageServer(isolate=plan.request.cross_origin_isolation)
    await server.start()
    try:
        async with async_playwright() as playwright:
            for ep in dict.fromkeys(s.ep for s in plan.settings):  # one browser launch per EP
                await _run_ep(playwright, server, plan, models, ep, emit, faults)
    finally:
        await server.stop()


def execute_web(plan: WebPlan, faults: Mapping[str, str] | None = None) -> Body:
    """The browser part of a run, as a body for harness.recording.record_run."""

    def body(emit: Emit) -> None:
        from harness.web.driver import run_sync

        models = [_prepare(plan, spec) for spec in plan.specs if plan.has_work(spec)]
        run_sync(_run_all(plan, models, emit, faults or {}))

    return body


def run_web(
    request: WebRequest,
    on_result: Callable[[Result, str], None] | None = None,
    plan: WebPlan | None = None,
    faults: Mapping[str, str] | None = None,
    resume_run_id: str | None = None,
) -> RunSummary:
    """Benchmark the request in the browser; every result is committed as it completes.

    faults is test-only: {provider: 'throw' | 'hang' | 'stall' | 'kill'} makes that provider's page
    jobs fail on purpose so the recovery paths can be tested. Ctrl-C marks the run 'interrupted'.
    """
    plan = plan or validate_web(request)
    bodies = [execute_web(plan, faults)]
    return record_run(
        request.db_path, "web", asdict(request), bodies, on_result, request.output_dir, None, resume_run_id
    )


def run_both(
    native: BenchmarkRequest,
    web: WebRequest,
    on_result: Callable[[Result, str], None] | None = None,
    plans: tuple[Plan, WebPlan] | None = None,
    resume_run_id: str | None = None,
) -> RunSummary:
    """Native backends then the browser, as one run: one report puts their rows side by side.

    Both requests are validated before anything is written (unless their plans are given)."""
    native_plan, web_plan = plans or (validate(native), validate_web(web))
    bodies = [execute_native(native_plan), execute_web(web_plan)]
    arguments = both_arguments(native, web)
    return record_run(native.db_path, "run", arguments, bodies, on_result, native.output_dir, None, resume_run_id)


def both_arguments(native: BenchmarkRequest, web: WebRequest) -> dict[str, Any]:
    """What a combined run stores as its arguments (and --resume matches against)."""
    return {"native": asdict(native), "web": asdict(web)}
