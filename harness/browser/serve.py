"""`accelharness web --serve`: every browser that opens the run's URL (a phone, a laptop, an Edge with an NPU
behind WebNN) becomes a measured target of the run, its rows in the same store as everything else.

The models are prepared as for `web` (same cache, same .npz inputs, same references). The device page
runs runner.mjs's jobs (the same in-page timing and EP checks as a browser driven through Playwright) and
posts each answer; the answer passes the same validator and becomes a row through the same
build_result, so parity is checked here against the reference. Each device is a target: its id (a hash
of its user agent and adapter facts, harness.web.device_server.device_identity) is part of every row's target,
and the row's details say what the device is (user agent, platform, cores, memory, adapter, WebNN
contexts, isolation, secure context, the origin it loaded from and the address it posted from).

from harness.browser.serve import ServeRequest, run_serve
summary = run_serve(ServeRequest(models=["bert-tiny"], hardware=["wasm"], devices=1), on_ready=print)
"""

from __future__ import annotations

import ssl
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.browser.run import (
    EpSetting,
    Prepared,
    WebRequest,
    build_result,
    case_model,
    check_browser_request,
    not_runnable,
    page_job,
    prepare_spec,
    web_cases,
)
from harness.browser.served_ceilings import ServedCeilings
from harness.core.bounds import MAX_DEVICES, MAX_PORT
from harness.core.generation import STEP_TOP_K
from harness.core.labels import case_label
from harness.core.options import check, declared, option, reuse
from harness.core.records import Case, Result, result_key
from harness.prepare.prepared import PreparedModel
from harness.prepare.specs import ModelSpec
from harness.run.ceiling_job import only_calibrations
from harness.run.ceiling_reuse import CeilingBook
from harness.run.ceilings import Calibration, ceilings_asked, wanted
from harness.run.plan import MAX_TIMEOUT_S, RequestError, RunOptions
from harness.run.recording import Body, Emit, RunSummary, record_run
from harness.web.eps import EPS, WEB_HARDWARE
from harness.web.page_job import PageJob

COMMAND = "web --serve"  # the run's command in the store, and what --resume looks for
INSECURE = (
    "not a secure context (plain HTTP off loopback): the browser hides WebGPU and WebNN, gives no "
    "SharedArrayBuffer (wasm threads drop to 1) and coarsens its timer; serve HTTPS with --certfile/--keyfile"
)
DEFAULT_MAX_DEVICES = 32  # devices one run takes unless told (--max-devices)
ServeEvent = Callable[[str, Any, Any], None]  # (kind, harness.web.device_server.Device, ServeJob | None)


@dataclass(frozen=True)
class ServeSwitch:
    """The switch that makes `web` a ServeRequest (whose own options, SERVING, need it)."""

    serve: bool = option(
        False, flag="--serve",
        help="Serve the jobs to any browser that opens the printed URL (a phone, a laptop, another browser): each "
        "device becomes a target of the run. See the manual's \"Your users' devices\" (docs/devices.md).",
    )  # fmt: skip


class ServeIncomplete(RuntimeError):
    """--serve-timeout passed before --devices devices finished: the run is kept, resumable."""


@dataclass
class ServeRequest(RunOptions):
    """`web --serve`'s request: the run options, the browser EPs, and how the jobs are served (each of these
    options is `--serve`'s only)."""

    hardware: list[str] = reuse(WebRequest, "hardware", factory=lambda: list(WEB_HARDWARE))
    # loopback unless asked: anyone who reaches the port with the URL can post
    host: str = option(
        "127.0.0.1", flag="--host",
        help="--serve: the address to listen on; 0.0.0.0 or a LAN address reaches other devices.",
    )  # fmt: skip
    port: int = option(0, flag="--port", low=0, high=MAX_PORT, help="--serve: the port (0: a free one).")
    # stop once this many devices finished every job (None: serve until Ctrl-C); at most max_devices (check_devices)
    devices: int | None = option(
        None, flag="--devices", low=1, high=MAX_DEVICES,
        help="--serve: stop once this many devices finished every job (default: Ctrl-C).",
    )  # fmt: skip
    # a device beyond these is refused (429), as hellos past a rate are
    max_devices: int = option(
        DEFAULT_MAX_DEVICES, flag="--max-devices", low=1, high=MAX_DEVICES,
        help=f"--serve: the most devices this run takes (1 to {MAX_DEVICES}); one beyond them is refused.",
    )  # fmt: skip
    serve_timeout_s: float | None = option(
        None, flag="--serve-timeout", seconds=(True, MAX_TIMEOUT_S),
        help="--serve: stop serving after this many seconds.",
    )  # fmt: skip
    # HTTPS (a self-signed pair works): a LAN origin is then a secure context
    certfile: Path | None = option(
        None, flag="--certfile", help="--serve: HTTPS certificate (PEM; self-signed works), with --keyfile."
    )
    keyfile: Path | None = option(None, flag="--keyfile", help="--serve: the certificate's private key (PEM).")


# The options only `web --serve` takes (ServeRequest's own, less the EPs `web` takes as well).
SERVING = tuple(name for name in declared(ServeRequest) if name not in declared(RunOptions) and name != "hardware")


@dataclass
class ServePlan:
    specs: list[ModelSpec]
    request: ServeRequest
    tls: ssl.SSLContext | None
    done: frozenset[str] = frozenset()  # result keys a resumed run holds: a device gets only what it lacks
    ceilings: CeilingBook = field(default_factory=CeilingBook)  # earlier ceilings it may take (record_run loads)

    def cases(self, spec: ModelSpec) -> list[Case]:
        return web_cases(self.request, spec)


def _answer_bytes(prepared: PreparedModel, case: Case, request: ServeRequest) -> int:
    """What a job's answer carries besides its facts and samples: the outputs (bytes of the reference), or for
    a generate job JSON numbers: the prefill logits (~24 characters a value), every decode step and each step's
    top-k."""
    shape = (case.batch_size, case.seq_len)
    if case.mode != "generate":
        return sum(r.nbytes for r in prepared.load_case(shape, on_graph=True)[1])
    made = prepared.load_generation(shape, case.new_tokens or 1)
    logits = made.prefill_logits.nbytes if made is not None and made.prefill_logits is not None else 0
    logits = logits or sum(r.nbytes for r in prepared.load_case(shape)[1])  # no reference: the whole output's size
    top_k = 2 * 24 * STEP_TOP_K * case.batch_size  # each step's top-k ids and logits
    return 3 * logits + (8 * (request.max_iterations + case.batch_size) + top_k) * (case.new_tokens or 1)


def validate_serve(request: ServeRequest) -> ServePlan:
    """Every input checked (the address bound once, the TLS pair loaded) before anything is written."""
    from harness.web.device_server import ServeError, check_bind, tls_context
    from harness.web.server import SetupError, dist_files

    specs = check_browser_request(request)
    if request.profile:  # a device's answer has no room for a trace, and its page's file is not counted here
        raise RequestError("--profile: not with --serve (profile in a browser this harness launches or reaches)")
    check(request, declared(ServeRequest), SERVING)
    check_devices(request.devices, request.max_devices)
    try:
        dist_files()
        check_bind(request.host, request.port)
        tls = tls_context(request.certfile, request.keyfile)
    except (ServeError, SetupError) as exc:
        raise RequestError(str(exc)) from exc
    return ServePlan(specs, request, tls)


def check_devices(devices: int | None, max_devices: int) -> None:
    """--devices at most --max-devices (each is bounded by its option)."""
    if devices is not None and not 1 <= devices <= max_devices:
        raise RequestError(
            f"--devices {devices}: must be 1 to --max-devices ({max_devices}), the most devices this run takes "
            "(or left out: serve until Ctrl-C)"
        )


def device_settings(request: ServeRequest, device: Any) -> list[EpSetting]:
    """What a device is asked to run: wasm at 1 thread and at its hardwareConcurrency, each WebNN device
    type, webgpu once. What the device does not offer answers `unsupported` in the page's own words."""
    cores = device.facts.get("hardware_concurrency") or 1
    settings: list[EpSetting] = []
    for ep in WEB_HARDWARE:
        if ep not in request.hardware:
            continue
        if ep == "wasm":
            settings += [EpSetting(ep, threads, device=device.id) for threads in dict.fromkeys((1, cores))]
        else:
            types = EPS[ep].device_types or (None,)
            settings += [EpSetting(ep, 1, device_type, device.id) for device_type in types]
    return settings


def device_details(device: Any, page: Any | None, lost: list[str]) -> dict[str, Any]:
    """What a row says about the device, and about the page that ran (or held) its job."""
    facts = page.facts if page is not None else device.facts
    details = {
        "served_device": True,
        "device": device.id,
        "device_name": device.name,
        "user_agent": facts.get("user_agent"),
        "platform": facts.get("platform"),
        "user_agent_data": facts.get("user_agent_data"),
        "hardware_concurrency": facts.get("hardware_concurrency"),
        "device_memory_gb": facts.get("device_memory"),  # navigator.deviceMemory: a rounded, capped figure
        "webgpu_adapter_report": facts.get("adapter"),
        "webnn_contexts": facts.get("webnn"),
        "cross_origin_isolated": facts.get("cross_origin_isolated"),
        "secure_context": facts.get("secure_context"),
        "timer_resolution_ms": facts.get("timer_resolution_ms"),
        "page_reported_origin": facts.get("origin"),
        "lease_history": list(lost),  # how earlier pages lost this job, if any did
    }
    if page is not None:
        details |= {
            "page_origin": page.origin,  # the scheme://host:port the browser asked for
            "client_address": page.address,
            "tab_hidden_during_job": facts.get("tab_hidden_during_job"),
        }
    if facts.get("secure_context") is False:
        details["secure_context_note"] = INSECURE
    return details


def _summary(result: Result) -> dict[str, Any]:
    """What the page shows of a stored row."""
    return {
        "status": result.status,
        "error": result.error,
        "p50_ms": statistics.median(result.samples_ms) if result.samples_ms else None,
        "max_abs_diff": result.max_abs_diff,
    }


@dataclass
class _Job:
    """What a served job's answer is checked against and stored with."""

    prepared: PreparedModel
    setting: EpSetting
    case: Case
    precision: str  # the precision that runs (fp32 may stand for an unconverted export)
    conversion: dict[str, Any]
    page: PageJob


class ServedJobs:
    """The run's side of the device server (harness.web.device_server.JobSource): each device's jobs, and its rows."""

    def __init__(self, plan: ServePlan, models: list[Prepared], emit: Emit) -> None:
        self.plan = plan
        self.models = models
        self.emit = emit
        self._jobs: dict[str, _Job] = {}
        self._ceilings = ServedCeilings(emit)  # each device setting's calibration slots
        self._files: Any = None  # the server the jobs' files are served through

    def describe(self) -> dict[str, Any]:
        request = self.plan.request
        cases = {f"{case_label(asdict(c))} {c.precision}": None for s in self.plan.specs for c in self.plan.cases(s)}
        measuring = (
            f"warmup {request.warmup}; at least {request.iterations} timed runs and {request.min_duration_s:g} s "
            f"(at most {request.max_iterations}); --timeout {request.timeout_s:g} s per job"
        )
        models = [spec.name for spec in self.plan.specs]
        return {"models": models, "cases": list(cases), "hardware": request.hardware, "measuring": measuring}

    def jobs(self, device: Any, files: Any) -> list[Any]:
        """The device's jobs, one setting after another (a page load runs one setting); the cases that
        cannot reach a browser (no export, a precision with no conversion) get their rows here."""
        from harness.web.device_server import ServeJob

        jobs = []
        self._files = files
        for setting in self.settings(device):
            prior = self.plan.ceilings.for_target(setting.target, self.plan.request.ceilings)
            jobs += self._ceilings.jobs(files, setting, self.calibrations(), prior)
            for spec, prepared, why in self.models:
                for case in self.plan.cases(spec):
                    key = result_key(spec.name, setting.target, case)
                    if key in self.plan.done:
                        continue
                    job = self._job(device, files, (spec, prepared, why), setting, case)
                    if job is not None:
                        jobs.append(ServeJob(key, setting.provider, _label(spec, case, setting), *job))
        return jobs

    def settings(self, device: Any) -> list[EpSetting]:
        return device_settings(self.plan.request, device)

    def calibrations(self) -> tuple[Calibration, ...]:
        """Each setting's ceilings: every class with --ceilings-only, else those its cases' precisions need."""
        request = self.plan.request
        if request.ceilings_only:
            return only_calibrations(request.precision)
        precisions = [case.precision for spec in self.plan.specs for case in self.plan.cases(spec)]
        return tuple(wanted(precisions, set(), ceilings_asked(request.no_ceilings)))

    def details(self, device: Any, page: Any | None, lost: list[str]) -> dict[str, Any]:
        return device_details(device, page, lost)

    def fault(self, _setting: EpSetting) -> str | None:
        return None  # a served device is never handed a planted fault

    def _job(
        self, device: Any, files: Any, model: Prepared, setting: EpSetting, case: Case
    ) -> tuple[PageJob, int] | None:
        """(the page job, the largest answer it may post), or None after storing why it cannot run."""
        from harness.web.device_server import answer_limit

        spec, prepared, why = model
        row = not_runnable(spec, prepared, why, setting, case)
        if row is None:
            assert prepared is not None
            converted, precision, conversion = case_model(prepared, case)
            if converted is None:
                row = prepared.result(
                    setting.target, case, conversion["status"], conversion["why"], precision=precision
                )
        if row is not None:
            row.details |= self.details(device, None, [])
            self.emit(row)
            return None
        assert prepared is not None
        page = page_job(files, prepared, setting, case, self.plan.request, self.fault(setting), converted)
        self._jobs[result_key(spec.name, setting.target, case)] = _Job(
            prepared, setting, case, precision, conversion, page
        )
        return page, answer_limit(_answer_bytes(prepared, case, self.plan.request), self.plan.request.max_iterations)

    def answered(self, device: Any, job: Any, answer: dict[str, Any], page: Any) -> dict[str, Any]:
        if self._ceilings.holds(job):
            return self._ceilings.answered(self._files, device, job, answer)
        found = self._jobs[job.key]
        details = self.details(device, page, job.lost) | found.conversion
        details["input_shapes"] = found.page.input_shapes
        shape, inference = (found.case.batch_size, found.case.seq_len), found.case.mode == "inference"
        _, reference = found.prepared.load_case(shape, on_graph=inference)
        extra = {"precision": found.precision, "details": details}
        model = case_model(found.prepared, found.case)[0]  # the file the page ran, its tokens checked on it
        result = build_result(found.prepared, found.setting, found.case, answer, extra, reference, model)
        self.emit(result)
        return _summary(result)

    def unanswered(self, device: Any, job: Any, status: str, why: str) -> dict[str, Any]:
        if self._ceilings.holds(job):
            return self._ceilings.unanswered(job, status, why)
        found = self._jobs[job.key]
        page = device.pages.get(job.holder) if job.holder else None
        details = self.details(device, page, job.lost)
        result = found.prepared.result(
            found.setting.target, found.case, status, why, precision=found.precision, details=details
        )
        self.emit(result)
        return _summary(result)


def _label(spec: ModelSpec, case: Case, setting: EpSetting) -> str:
    return f"{spec.name} {case_label(asdict(case))} {case.precision} on {setting.provider}"


def execute_serve(plan: ServePlan, on_ready: Callable[[str], None], on_event: ServeEvent | None = None) -> Body:
    """The served part of a run, as a body for record_run: prepare the models, then serve until done."""

    def body(emit: Emit) -> None:
        from harness.web.device_server import DeviceServer, serve_until
        from harness.web.driver import run_sync

        request = plan.request
        models = [prepare_spec(plan, spec) for spec in plan.specs]
        jobs = ServedJobs(plan, models, emit)
        server = DeviceServer(
            jobs, request.timeout_s, request.host, request.port, plan.tls, on_event, max_devices=request.max_devices
        )
        ended = run_sync(serve_until(server, request.devices, request.serve_timeout_s, on_ready))
        if ended == "timeout" and request.devices is not None:
            raise ServeIncomplete(
                f"--serve-timeout {request.serve_timeout_s:g}s passed with {server.finished_devices()} of "
                f"{request.devices} devices finished; the run is kept as interrupted, and the same command with "
                "--resume continues it (a device that comes back gets only the jobs it lacks)"
            )

    return body


def run_serve(
    request: ServeRequest,
    on_result: Callable[[Result, str], None] | None = None,
    plan: ServePlan | None = None,
    resume_run_id: str | None = None,
    on_ready: Callable[[str], None] = print,
    on_event: ServeEvent | None = None,
) -> RunSummary:
    """Serve the request's jobs to every browser that opens the URL (on_ready gets it); each answer is
    committed as it arrives. Ctrl-C, or --serve-timeout before --devices, leaves the run interrupted."""
    plan = plan or validate_serve(request)
    body = execute_serve(plan, on_ready, on_event)
    outputs = request.outputs
    return record_run(
        request.db_path,
        COMMAND,
        asdict(request),
        [body],
        on_result,
        outputs,
        None,
        resume_run_id,
        request.machine_label,
        ceilings=[plan.ceilings],
    )
