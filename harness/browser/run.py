"""`accelharness web`: the native run's ONNX file and input tensors, run in Chromium through
onnxruntime-web (wasm, webgpu, webnn), parity-checked against the same reference, stored in the same tables.

The browser is launched here (headless or headed, with the GPU profile's flags) or reached at
--browser-endpoint; either way every row says which browser, flags and adapter it ran on.

from harness.browser.execute import run_web
from harness.browser.run import WebRequest
summary = run_web(WebRequest(models=["bert-tiny"], hardware=["wasm"], threads=[1, 2]))
summary = run_web(WebRequest(models=["bert-tiny"], hardware=["webgpu"], gpu="on", require_hardware_gpu=True))
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import psutil

from harness.browser.generate import (
    generate_job,
    generation_result,
    layout_files,
    passage_files,
    prompt_feeds,
    seq2seq_layout,
    served_graph,
)
from harness.browser.page_ceilings import calibrate_in_page
from harness.browser.runtimes import (
    check_runtime_folder,
    gguf_generate_job,
    gguf_precisions,
    runtime_details,
    runtime_fields,
    runtime_files,
    runtime_model,
    runtime_refusal,
    speech_feeds,
    work_file,
)
from harness.core.failures import UNSUPPORTED_OPERATOR
from harness.core.faults import injected_faults
from harness.core.generation import page_min_warmup_ms
from harness.core.labels import BROWSER_ENGINE
from harness.core.options import check, declared, option
from harness.core.parity import compare
from harness.core.profiles import PROFILE_ITERATIONS
from harness.core.records import Case, Ceiling, Control, Result, Target, UnsupportedError, result_key
from harness.core.threads import threads_option, with_threads
from harness.prepare.external import external_data_problem, external_locations, model_bytes
from harness.prepare.prepared import PreparedModel, PrepareJob, audio_lengths, inference_on_past, unprepared_result
from harness.prepare.seq2seq import precision_files, seq2seq_files
from harness.prepare.specs import ModelSpec
from harness.prepare.variants import model_for_precision
from harness.run.ceiling_job import only_calibrations
from harness.run.ceiling_reuse import CeilingBook
from harness.run.ceilings import (
    Calibration,
    Prior,
    Size,
    calibration_feeds,
    calibration_path,
    ceilings_asked,
    row_work,
    wanted,
)
from harness.run.control import (
    CONTROL_ITERATIONS,
    CONTROL_MAX_TIME_S,
    CONTROL_MIN_DURATION_S,
    CONTROL_NAME,
    CONTROL_WARMUP,
    control_feeds,
    control_model_path,
    control_positions,
)
from harness.run.hardware import PlatformStatus
from harness.run.plan import (
    RequestError,
    RunOptions,
    check_generation,
    check_measuring,
    check_paths,
    check_selection,
    check_shapes,
    plan_cases,
)
from harness.run.profiling import page_profile, profiled_fields
from harness.run.recording import Emit
from harness.run.worker import prepare_isolated
from harness.web.eps import EPS, WEB_HARDWARE, WEBNN_DEVICES
from harness.web.flags import BROWSERS, GPU_MODES, GpuProfile
from harness.web.launched import DRIVERS, LAUNCHED_BROWSERS, LaunchError
from harness.web.page_job import ExternalData, GenerateJob, PageInput, PageJob, StopRule
from harness.web.runtimes import OWN_RUNTIME, PAGE_RUNTIMES

ALL_BROWSERS = (*BROWSERS, *LAUNCHED_BROWSERS)  # what --browser takes
ENGINE = BROWSER_ENGINE
# The faults hook's planted input bug (tests): `page-window-audio:N` feeds the page of a speech case of N seconds
# the whole window's features, not its own, while its row is checked against native ORT on the case's own.
WINDOW_AUDIO_FAULT = "page-window-audio"
WEB_MODES = ("inference", "generate")  # training needs a backward pass ORT-web's inference build lacks
ANSI = re.compile(r"\x1b\[[0-9;]*m")
THREADS_HELP = "Comma-separated wasm thread counts (webgpu/webnn use the first)."
GPU_HELP = (
    "Browser GPU profile: on (real WebGPU: Vulkan/ANGLE on Linux, D3D12/Metal elsewhere, no --disable-gpu), "
    "off (software rendering), auto (on where the host shows a GPU). Recorded per row."
)


ENDPOINT_HELP = (
    "A remote browser: ws://… (Playwright browser server) or http://HOST:PORT (Chromium with "
    "--remote-debugging-port). Everything reaches it through Playwright; no local port is opened."
)


@dataclass
class WebRequest(RunOptions):
    hardware: list[str] = option(
        factory=lambda: list(WEB_HARDWARE), flag="--hardware", key="web_platforms", many=True, choices=WEB_HARDWARE,
        noun="web hardware", help=f"Comma-separated browser EPs: {','.join(WEB_HARDWARE)}.",
    )  # fmt: skip
    runtimes: list[str] = option(
        factory=lambda: [OWN_RUNTIME], flag="--runtimes", key="web_runtimes", many=True, choices=PAGE_RUNTIMES,
        noun="page runtime",
        help=f"Comma-separated page runtimes: {','.join(PAGE_RUNTIMES)} (each a target: wasm/transformers.js).",
    )  # fmt: skip
    # chrome and edge fall back to Chromium, recorded; firefox and safari run the served page (harness.browser.launched)
    browsers: list[str] = option(
        factory=lambda: ["chromium"], flag="--browser", many=True, choices=ALL_BROWSERS,
        noun="browser",
        help="Comma-separated browsers: chrome, chromium or edge (chrome/edge fall back to Chromium), firefox, "
        "safari (macOS, through safaridriver). Each is a target: its rows name it.",
    )  # fmt: skip
    browser_path: Path | None = option(None, flag="--browser-path", help="The browser executable to use instead.")
    webllm_model: Path | None = option(
        None, flag="--webllm-model",
        help="A WebLLM model folder for the webllm runtime: its compiled model library (.wasm) and MLC weights "
        "(mlc-chat-config.json, tensor-cache.json, params shards); read as data, served to the page.",
    )  # fmt: skip
    driver: str = option(
        "process", flag="--driver", choices=DRIVERS, noun="driver",
        help="How Firefox is launched: process (its own, opening the served page) or webdriver (through geckodriver).",
    )  # fmt: skip
    webdriver_url: str | None = option(
        None, flag="--webdriver-url",
        help="A remote W3C WebDriver (http://HOST:PORT: a device farm's, a Mac's safaridriver) for --browser "
        "firefox/safari; it must reach this machine's served page (--host).",
    )  # fmt: skip
    threads: list[int] = threads_option([1], flag="--threads", key="web_threads", help=THREADS_HELP)
    webnn_device: str = option(
        "gpu", flag="--webnn-device", choices=WEBNN_DEVICES, noun="WebNN device",
        help=f"WebNN deviceType: {', '.join(WEBNN_DEVICES)}.",
    )  # fmt: skip
    # the launch profile (harness.web.flags)
    gpu: str = option("auto", flag="--gpu", choices=GPU_MODES, help=GPU_HELP)
    # a headful browser (on a virtual display when the host has none)
    headed: bool = option(
        False, flag="--headed", help="A headful browser (on Xvfb without a DISPLAY): where headless forces software."
    )
    browser_args: list[str] = option(
        factory=list, flag="--browser-arg", repeat=True,
        help="A raw browser flag appended to the launch (repeatable); recorded per row.",
    )  # fmt: skip
    require_hardware_gpu: bool = option(
        False, flag="--require-hardware-gpu",
        help="webgpu cases on a software adapter (SwiftShader, llvmpipe, WARP) are `unsupported`, not run.",
    )  # fmt: skip
    # ws:// (Playwright server) or http:// (CDP): a remote browser
    browser_endpoint: str | None = option(None, flag="--browser-endpoint", help=ENDPOINT_HELP)
    # False drops COOP/COEP: the page is then not cross-origin isolated and ORT-web silently runs one
    # wasm thread. Only for showing that the harness detects it (details.threads_dropped).
    cross_origin_isolation: bool = True


# How the browser is launched or reached, and what its page runtimes load (--webllm-model): WebRequest's options
# that `web --serve` refuses (each device brings its own browser) and `run` takes as `web` does.
LAUNCH = ("browsers", "browser_path", "driver", "webdriver_url", "threads", "webnn_device", "gpu", "headed",
          "browser_args", "require_hardware_gpu", "browser_endpoint", "webllm_model")  # fmt: skip


@dataclass(frozen=True)
class EpSetting:
    ep: str
    threads: int
    device_type: str | None = None  # for an EP that takes one (WebNN's deviceType)
    device: str | None = None  # the served device that runs it (web --serve); None: a browser driven from here
    runtime: str = OWN_RUNTIME  # the page runtime (web/page/runtimes.json): the row's engine
    runtime_folder: Path | None = None  # the runtime's own model folder (webllm: --webllm-model), None: none

    @property
    def provider(self) -> str:
        # Threads are part of the wasm provider so 1 and 2 threads are distinct report columns.
        if EPS[self.ep].runs_threads:
            return with_threads(self.ep, self.threads)
        return f"{self.ep}:{self.device_type}" if self.device_type else self.ep

    @property
    def target(self) -> Target:
        return Target(self.ep, self.runtime, self.provider, self.device)


@dataclass
class WebPlan:
    specs: list[ModelSpec]
    settings: list[EpSetting]
    browser: Any  # harness.web.driver.BrowserChoice; None for a remote browser or none of the Chromium family
    request: WebRequest
    profile: GpuProfile | None = None  # the launch profile (None: a remote browser brings its own flags)
    done: frozenset[str] = frozenset()  # result keys a resumed run already holds: never run twice
    launched: tuple[Any, ...] = ()  # harness.web.launched.LaunchedChoice: Firefox, Safari (the served page)
    ceilings: CeilingBook = field(default_factory=CeilingBook)  # earlier ceilings it may take (record_run loads)

    def cases(self, spec: ModelSpec) -> list[Case]:
        return web_cases(self.request, spec)

    def browser_source(self, ep: str) -> Any:
        """How the browser for this EP is obtained: launched with its flags, or the remote one."""
        from harness.web.driver import LocalBrowser, RemoteBrowser
        from harness.web.flags import launch_flags

        if self.request.browser_endpoint:
            return RemoteBrowser(self.request.browser_endpoint)
        assert self.profile is not None
        extra = tuple(self.request.browser_args)
        flags = launch_flags([ep], self.profile, extra)
        return LocalBrowser(self.browser, flags, self.profile, self.request.headed, extra)

    def remaining(self, spec: ModelSpec, setting: EpSetting) -> list[Case]:
        return [c for c in self.cases(spec) if result_key(spec.name, setting.target, c) not in self.done]

    def has_work(self, spec: ModelSpec) -> bool:
        return any(self.remaining(spec, setting) for setting in self.settings)

    @property
    def total_results(self) -> int:
        return sum(len(self.remaining(spec, setting)) for spec in self.specs for setting in self.settings)


def web_cases(request: Any, spec: ModelSpec) -> list[Case]:
    """A spec's cases in the browser (plan_cases, native's one way): the page generates from a graph with
    past key/values only (harness.prepare.greedy)."""
    return plan_cases(request, spec, _page_plans)


def _page_plans(mode: str, with_past: bool) -> bool:
    return mode != "generate" or with_past


def browser_device(browser: str) -> str | None:
    """The target's device for a browser this run launches: None for the Chromium family (the default browser, as
    every row before the browser axis), the browser's name for the others (wasm/onnxruntime-web:... @ firefox)."""
    return browser if browser in LAUNCHED_BROWSERS else None


def _settings(request: WebRequest) -> list[EpSetting]:
    """Every EP setting of every browser and page runtime asked for: each EP's settings (its thread counts, its
    device type) once per runtime, the EPs in the table's order (one browser launch per EP), the runtimes in the
    order asked, the browsers likewise."""
    settings: list[EpSetting] = []
    for browser in dict.fromkeys(request.browsers):
        device = browser_device(browser)
        for ep in WEB_HARDWARE:
            if ep not in request.hardware:
                continue
            for runtime in dict.fromkeys(request.runtimes):
                folder = request.webllm_model if runtime == "webllm" else None
                if EPS[ep].runs_threads:
                    settings += [
                        EpSetting(ep, t, None, device, runtime, folder) for t in dict.fromkeys(request.threads)
                    ]
                else:  # ops the GPU/NPU EP cannot run fall back to wasm with this many threads
                    device_type = request.webnn_device if EPS[ep].device_types else None
                    settings.append(EpSetting(ep, request.threads[0], device_type, device, runtime, folder))
    return settings


def _check_launch(request: WebRequest) -> None:
    """The options that say how a browser is launched, or where the remote one is."""
    from harness.web.driver import ENDPOINT_SCHEMES
    from harness.web.flags import headed_problem

    check(request, declared(WebRequest), ("gpu",))
    _check_browsers(request)
    if request.browser_endpoint is None:
        problem = headed_problem() if request.headed else None
        if problem:
            raise RequestError(problem)
        return
    parts = urlsplit(request.browser_endpoint)
    if parts.scheme not in ENDPOINT_SCHEMES or not parts.hostname:
        raise RequestError(
            f"--browser-endpoint '{request.browser_endpoint}': need ws://HOST:PORT/… (a Playwright browser server) "
            "or http://HOST:PORT (a Chromium started with --remote-debugging-port)"
        )
    options, defaults = declared(WebRequest), WebRequest()
    launch_only = [options[name].flag for name in ("gpu", "headed", "browser_args", "browser_path", "browsers")
                   if getattr(request, name) != getattr(defaults, name)]  # fmt: skip
    if launch_only:
        named = ", ".join(launch_only)
        raise RequestError(
            f"{named}: these set how the harness launches a browser; a remote browser (--browser-endpoint) "
            "runs with the flags it was started with"
        )


def check_browser_request(request: Any) -> list[ModelSpec]:
    """What every browser run checks (web, and web --serve): cases, stop rule, EPs, precisions, the model
    selection and the store's path. Returns the selected specs."""
    check_shapes(request)
    check_measuring(request)
    if not request.hardware:
        raise RequestError(f"--hardware is empty; valid: {', '.join(WEB_HARDWARE)}")
    check(request, declared(WebRequest), ("hardware",))  # precision and modes: check_measuring
    unknown = [m for m in request.modes if m not in WEB_MODES]
    if unknown or not request.modes:
        raise RequestError(f"--mode {','.join(request.modes)}: the browser runs {', '.join(WEB_MODES)}")
    specs = check_selection(request)
    check_generation(request, specs, request.modes)
    check_paths(request)
    return specs


def validate_web(request: WebRequest) -> WebPlan:
    """Check every input (browser and ORT-web install included) before anything is written."""
    from harness.web.driver import BrowserNotFound, resolve_browser
    from harness.web.flags import gpu_profile
    from harness.web.server import SetupError, dist_files

    check(request, declared(WebRequest), ("threads", "webnn_device", "browsers", "runtimes", "driver"))
    if not request.runtimes:
        raise RequestError(f"--runtimes is empty; valid: {', '.join(PAGE_RUNTIMES)}")
    check_runtime_folder(request.runtimes, request.webllm_model)  # read as data before a run exists
    specs = check_browser_request(request)
    _check_launch(request)
    chromium = [b for b in dict.fromkeys(request.browsers) if b not in LAUNCHED_BROWSERS]
    try:
        dist_files()
        launched = tuple(launched_choices(request))
        if request.browser_endpoint:
            return WebPlan(specs, _settings(request), None, request, launched=launched)
        if not chromium:
            return WebPlan(specs, _settings(request), None, request, launched=launched)
        browser = resolve_browser(chromium[0], request.browser_path, headless=not request.headed)
    except (BrowserNotFound, SetupError, LaunchError) as exc:
        raise RequestError(str(exc)) from exc
    return WebPlan(specs, _settings(request), browser, request, gpu_profile(request.gpu), launched=launched)


def launched_choices(request: WebRequest) -> list[Any]:
    """The browsers this run launches outside Playwright (harness.browser.launched), each found and named."""
    from harness.web.launched import resolve_launched

    asked = [b for b in dict.fromkeys(request.browsers) if b in LAUNCHED_BROWSERS]
    return [resolve_launched(b, request.browser_path, request.driver, request.webdriver_url) for b in asked]


def _check_browsers(request: WebRequest) -> None:
    """The browser list: one of the Chromium family at most (its rows carry no browser name), a --browser-path that
    names one browser, and the options only a launched Firefox or Safari takes."""
    browsers = list(dict.fromkeys(request.browsers))
    if not browsers:
        raise RequestError(f"--browser is empty; valid: {', '.join(ALL_BROWSERS)}")
    chromium = [b for b in browsers if b not in LAUNCHED_BROWSERS]
    launched = [b for b in browsers if b in LAUNCHED_BROWSERS]
    if len(chromium) > 1:
        raise RequestError(
            f"--browser {','.join(browsers)}: one of {', '.join(BROWSERS)} per run (chrome and edge fall back to "
            "Chromium, and their rows would be the same target); run another for the other"
        )
    if request.browser_path is not None and len(browsers) > 1:
        raise RequestError(f"--browser-path names one browser's binary; --browser {','.join(browsers)} names several")
    if launched and request.browser_endpoint:
        raise RequestError("--browser-endpoint reaches a remote Chromium; Firefox and Safari take --webdriver-url")
    if (request.driver != "process" or request.webdriver_url) and not launched:
        raise RequestError("--driver and --webdriver-url drive Firefox or Safari (--browser firefox|safari)")
    if launched and request.profile:
        raise RequestError("--profile: a trace comes from a Chromium the harness drives, not from Firefox or Safari")
    if request.webdriver_url is not None:
        parts = urlsplit(request.webdriver_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
            raise RequestError(
                f"--webdriver-url: need http(s)://HOST:PORT[/path] without credentials, got {parts.scheme or '?'}://…"
            )


# --- one case ---------------------------------------------------------------------------------------


def _page_details(facts: dict[str, Any], setting: EpSetting, probed: dict[str, Any]) -> dict[str, Any]:
    from harness.web.adapter import classify_adapter

    details = dict(facts)
    details["console_warnings"] = [ANSI.sub("", line) for line in facts.get("console_warnings", [])]
    details["wasm_build"] = facts.get("wasm_binary")  # checked by the page against the glue ORT loaded
    runtime = facts.get("runtime")
    if isinstance(runtime, dict):  # another page runtime's own words (web.answers checked them): what ran
        details["page_runtime_version"] = runtime.get("version")
        if runtime.get("threads_effective") is not None:  # read back from the runtime, not the count asked
            details["threads_requested"] = setting.threads
            details["threads_effective"] = runtime["threads_effective"]
            details["threads_dropped"] = runtime["threads_effective"] < setting.threads
    if EPS[setting.ep].gpu_adapter:  # the adapter ORT's device runs on, else the one the page or driver probed
        proved = (facts.get("device_probe") or {}).get("adapter")
        verdict = classify_adapter(facts.get("adapter") or proved or probed.get("probed_adapter"))
        if verdict is not None:
            details |= {"adapter_class": verdict.kind, "adapter_class_why": verdict.why}
        details["fallback_adapter"] = verdict is not None and verdict.software
    if setting.device_type:
        details["webnn_device_type"] = setting.device_type
    placement = facts.get("node_placement")
    if placement:  # ORT's own CPU EP nodes inside the wasm runtime
        details["cpu_fallback_nodes"] = placement.get("CPUExecutionProvider", 0)
        details["cpu_fallback"] = details["cpu_fallback_nodes"] > 0
    return details


def _status(answer: dict[str, Any]) -> str:
    """The page's status; an operator ORT-web has no kernel for (e.g. fp16 on wasm) is `unsupported`, as native."""
    if answer["status"] == "error" and any(p in answer["error"].lower() for p in UNSUPPORTED_OPERATOR):
        return "unsupported"
    return answer["status"]


def build_result(
    prepared: PreparedModel,
    setting: EpSetting,
    case: Case,
    answer: dict[str, Any],
    extra: dict[str, Any],
    reference: list[np.ndarray],
    model: Path | None = None,
) -> Result:
    """The Result for one page answer: statistics come from samples_ms, parity from the first run's outputs
    at the tolerance of the precision that ran (extra['precision']); with the page's profile, operator rows
    counted on `model` (the file the page ran)."""
    from harness.web.answers import decode_outputs

    details = extra.pop("details")
    peak_mb, memory = _memory(answer, details)
    details |= _page_details(answer.get("facts", {}), setting, details) | memory
    if answer["status"] != "ok":
        return prepared.result(setting.target, case, _status(answer), answer["error"], details=details, **extra)
    fields = {"samples_ms": answer["samples_ms"], "load_ms": answer["load_ms"], "first_run_ms": answer["first_run_ms"]}
    fields["memory_peak_mb"] = peak_mb
    work, counted = row_work(model, case, details.get("input_shapes", {}))
    fields |= work
    details |= counted
    if case.mode == "generate":  # an ok answer holds a generation exactly then (web/answers.py checked it)
        return generation_result(prepared, setting.target, case, answer, fields, extra, details, model)
    names = [out["name"] for out in answer["outputs"]]  # the page's session.outputNames, in order
    try:
        parity = compare(decode_outputs(answer["outputs"]), reference, extra.get("precision") or "fp32", names)
    except ValueError as exc:
        return prepared.result(
            setting.target, case, "error", f"parity check failed: {exc}", details=details, **extra, **fields
        )
    details |= parity.details
    if "profile" in answer:  # asked for (--profile): the page's profile, or why it has none
        fields["operators"], profiled = profiled_fields(
            model, details["input_shapes"], *page_profile(answer["profile"], EPS[setting.ep].ort_provider)
        )
        details |= profiled
    return prepared.result(
        setting.target, case, parity.status, parity.error, details=details, **parity.fields, **extra, **fields
    )


def _memory(answer: dict[str, Any], details: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
    """The row's memory_peak_mb (the launched browser's processes during the timed loop) and details saying
    what it covers or why it is NULL, plus the page's own measureUserAgentSpecificMemory figure."""
    found = dict(answer.get("browser_memory") or {})
    peak_mb = found.pop("memory_peak_mb", None)
    if not found:
        if details.get("browser_launched_as"):  # harness.browser.launched: no binding marks its timed loop
            found["memory_covers"] = (
                "not measured: the browser's processes are sampled between the timed loop's marks, which only a "
                "Chromium driven through Playwright sends"
            )
        elif details.get("browser") == "remote" or details.get("served_device"):
            whose = "a served device's" if details.get("served_device") else "a remote browser's"
            found["memory_covers"] = f"not measured: {whose} processes are not on this machine"
        else:
            found["memory_covers"] = "not measured: the page never reached its timed loop"
    page = (answer.get("facts") or {}).get("page_memory") or {}
    if page.get("bytes") is not None:
        found["page_memory_mb"] = page["bytes"] / 2**20
        found["page_memory_covers"] = "performance.measureUserAgentSpecificMemory() after the timed loop: " + (
            ", ".join(f"{kind} {size / 2**20:.1f} MB" for kind, size in sorted(page.get("by_type", {}).items()))
        )
    elif page.get("error"):
        found["page_memory_covers"] = f"not measured: {page['error']}"
    return peak_mb, found


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def case_model(prepared: PreparedModel, case: Case) -> tuple[Path | None, str, dict[str, Any]]:
    """The file a case runs in the page: the export (generate: the graph with past key/values) in the
    case's precision, as precision_model gives it."""
    if prepared.spec.is_gguf_file and case.precision in prepared.gguf_files:  # the GGUF given as the model
        return Path(prepared.gguf_files[case.precision]), case.precision, {}
    if case.mode != "generate":
        assert prepared.onnx_path is not None
        return precision_model(prepared.onnx_path, case.precision)
    if prepared.onnx_past_path is None:
        why = prepared.onnx_past_error or "the model has no ONNX graph with past key/values"
        return None, case.precision, {"why": f"generate needs the ONNX export with past key/values: {why}"}
    return precision_model(prepared.onnx_past_path, case.precision)


# onnxruntime-web is a wasm32 build, whatever its EP: the graph and every byte of its external data are
# copied into its linear memory, which addresses at most 4 GiB.
BROWSER_MODEL_LIMIT_BYTES = 4 * 2**30


def browser_problem(model: Path) -> tuple[str, str] | None:
    """(status, why) when the page must not be handed this model: external data missing or truncated
    (an error: ORT-web would fail deep inside, or wait), or more than the browser can hold (unsupported)."""
    if (problem := external_data_problem(model)) is not None:
        return "error", problem
    size = model_bytes(model)
    if size > BROWSER_MODEL_LIMIT_BYTES:
        return "unsupported", (
            f"{model.name} and its external data are {size / 2**30:.2f} GiB; onnxruntime-web's wasm32 runtime "
            f"holds at most {BROWSER_MODEL_LIMIT_BYTES / 2**30:.0f} GiB (its linear memory): no browser EP can load it"
        )
    return None


@cache
def precision_model(onnx_path: Path, precision: str) -> tuple[Path | None, str, dict[str, Any]]:
    """(model file, precision it runs in, conversion facts) — the same file native ORT runs for that
    precision (cached as <key>-<precision> next to the export; an encoder–decoder's first decoder step, its
    other graphs beside it at their own precisions: harness.prepare.seq2seq.precision_files) — or (None,
    precision, {'why': …, 'status': …}) when it has no such file or the browser cannot take it (browser_problem)."""
    try:
        if seq2seq_files(onnx_path) is not None:  # an encoder–decoder's graphs, each at its own precision
            files, ran, facts = precision_files(onnx_path, precision)
            model, graphs = files.decoder, list(dict.fromkeys((files.encoder, files.decoder, files.decoder_past)))
        else:
            (model, ran, facts), graphs = model_for_precision(onnx_path, precision), []
    except UnsupportedError as exc:
        return None, precision, {"why": str(exc), "status": "unsupported"}
    graphs = graphs or [model]
    if (problem := next(filter(None, map(browser_problem, graphs)), None)) is not None:
        return None, precision, {"why": problem[1], "status": problem[0]}
    return model, ran, facts | {"model_bytes": sum(model_bytes(graph) for graph in graphs)}


def stop_rule(request: WebRequest) -> StopRule:
    """The request's stop rule, in the page's units (ms)."""
    return StopRule(
        warmup=request.warmup,
        iterations=request.iterations,
        min_duration_ms=request.min_duration_s * 1000,
        max_iterations=request.max_iterations,
        min_iterations=request.min_iterations,
        max_time_ms=None if request.max_time_s is None else request.max_time_s * 1000,
        profile_iterations=PROFILE_ITERATIONS if request.profile else 0,  # after the timed loop
    )


def page_job(
    files: Any,
    prepared: PreparedModel,
    setting: EpSetting,
    case: Case,
    request: WebRequest,
    fault: str | None = None,
    model: Path | None = None,
) -> PageJob:
    """Hand the page the case's ONNX file (the export, or `model`: its precision's conversion) and input
    tensors (from the PreparedModel's npz; a speech generation's at its audio length), and describe the page job:
    a generation's, or another runtime's inference, with the least time it warms up for (page_min_warmup_ms: its
    wasm's optimizing tier; our own loop's inference counts alone: its build ran at its steady time from its second
    call here, transformers.js's only after seconds of calls)."""
    job = _page_job(files, prepared, setting, case, request, fault, model)
    floor_ms = page_min_warmup_ms(request.warmup, request.max_time_s)
    if job.generate is None:
        return job if job.runtime == OWN_RUNTIME else replace(job, runtime_min_warmup_ms=floor_ms)
    return replace(job, generate=replace(job.generate, min_warmup_ms=floor_ms))


def _page_job(files: Any, prepared: PreparedModel, setting: EpSetting, case: Case, request: WebRequest,
              fault: str | None, model: Path | None) -> PageJob:  # fmt: skip
    planted = f"{WINDOW_AUDIO_FAULT}:{case.audio_seconds}" in injected_faults()
    audio = None if planted else case.audio_seconds
    feeds, _ = prepared.load_case((case.batch_size, case.seq_len), audio, on_graph=case.mode == "inference")
    model = model or case_model(prepared, case)[0]
    assert model is not None
    # the page keeps one session per model URL: each precision's file has its own name
    name = f"{_file_stem(prepared.spec.name)}-{case.precision}"
    stop = stop_rule(request)
    if setting.runtime != OWN_RUNTIME:  # another page runtime: its own layout of the same weights
        speech = prepared.spec.is_encoder_decoder  # transformers.js speech (the only one runtime_refusal lets by)
        given = speech_feeds(prepared, feeds, audio) if speech else prompt_feeds(feeds)
        if case.mode == "inference":  # a text encoder's inputs, as every row of the case is fed (transformers.js)
            given = feeds
        return runtime_job(files, prepared, setting, case, stop, fault, model, given)
    if case.mode == "generate":  # its own file name: the page keeps one session per URL
        layout = seq2seq_layout(prepared.onnx_past_path, case.precision)
        also = passage_files(prepared.passage) if layout is None else layout_files(f"{name}-past", layout[0])
        gpu = EPS[setting.ep].gpu_adapter
        # its URLs once the job's files are served
        generate = partial(generate_job, model, case, gpu, layout, eos=prepared.eos, passage=prepared.passage)
        served = served_graph(model)  # the model itself, but for the faults hook's planted weight
        return web_job(files, f"{name}-past", served, prompt_feeds(feeds, layout is not None), setting, stop,
                       case.key, fault, generate, also)  # fmt: skip
    return web_job(files, name, served_graph(model), feeds, setting, stop, case.key, fault)


def web_job(files: Any, name: str, model: Path, feeds: dict[str, np.ndarray], setting: EpSetting, stop: StopRule,
            case_key: str, fault: str | None = None,
            generate: GenerateJob | Callable[[dict[str, str]], GenerateJob] | None = None,
            also: dict[str, Path] | None = None) -> PageJob:  # fmt: skip
    """A page job: the model file, its external data files and the input tensors served to the page, the
    EP setting and the stop rule. Each external file is an `externalData` entry whose path is its location
    as the .onnx names it and whose data is its URL, which ORT-web fetches itself (streamed above 1 GB).
    `also`: an encoder–decoder's other graphs, served beside the model; a `generate` given as a function is
    called with their URLs."""
    arrays = {f"{name}.{i}.bin": np.ascontiguousarray(v) for i, v in enumerate(feeds.values())}
    external = {f"{name}.data{i}": location for i, location in enumerate(external_locations(model))}
    served = {f"{name}.onnx": model} | {k: model.parent / location for k, location in external.items()}
    urls = files.set_job_files(served | (also or {}) | {k: v.tobytes() for k, v in arrays.items()})
    if callable(generate):  # an encoder-decoder's part names its other graphs' URLs
        generate = generate({key: urls[key] for key in also or {}})
    inputs = [
        PageInput(input_name, urls[key], str(array.dtype), list(array.shape))
        for input_name, (key, array) in zip(feeds, arrays.items(), strict=True)
    ]
    return PageJob(
        model_url=urls[f"{name}.onnx"],
        inputs=inputs,
        ep=setting.ep,
        threads=setting.threads,
        stop=stop,
        case=case_key,
        device_type=setting.device_type,
        external_data=[ExternalData(location, urls[key]) for key, location in external.items()],
        fault=fault,
        generate=generate,
    )


def runtime_job(files: Any, prepared: PreparedModel, setting: EpSetting, case: Case, stop: StopRule,
                fault: str | None, model: Path, feeds: dict[str, np.ndarray]) -> PageJob:  # fmt: skip
    """A job of another page runtime (harness.browser.runtimes): its files served under one folder of the
    job's (transformers.js loads config.json and onnx/… from it; llama.cpp its GGUF), the prompt's ids as tensors
    (each runtime is handed ids, never text), and a generation's part the harness checks its answer against (an
    inference job's answer is its outputs, checked as our own loop's)."""
    served, main = runtime_files(prepared, setting.runtime, case, served_graph(model), setting.runtime_folder)
    stem = f"{_file_stem(prepared.spec.name)}-{case.precision}"
    arrays = {f"{stem}.{i}.bin": np.ascontiguousarray(v) for i, v in enumerate(feeds.values())}
    urls = files.set_job_files(served | {key: array.tobytes() for key, array in arrays.items()})
    inputs = [PageInput(name, urls[key], str(array.dtype), list(array.shape))
              for name, (key, array) in zip(feeds, arrays.items(), strict=True)]  # fmt: skip
    model_url = urls[main]
    gguf = prepared.spec.is_gguf_file  # a GGUF given as the model: no ONNX graph states its vocabulary
    generate = None  # an inference job: none
    if case.mode == "generate":
        generate = gguf_generate_job(prepared, case) if gguf else generate_job(model, case, False, eos=prepared.eos)
    return PageJob(model_url=model_url, inputs=inputs, ep=setting.ep, threads=setting.threads, stop=stop,
                   case=case.key, fault=fault, generate=generate, runtime_model_base=model_url.removesuffix(main),
                   **runtime_fields(setting.runtime, case))  # fmt: skip


# the drift control's stop rule (harness.run.control): the same in every page
CONTROL_STOP = StopRule(
    warmup=CONTROL_WARMUP,
    iterations=CONTROL_ITERATIONS,
    min_duration_ms=CONTROL_MIN_DURATION_S * 1000,
    max_iterations=10_000,
    min_iterations=3,
    max_time_ms=CONTROL_MAX_TIME_S * 1000,
)


async def measure_control(files: Any, session: Any, setting: EpSetting, position: str, beside: str,
                          timeout_s: float) -> Control:  # fmt: skip
    """The drift control (harness.run.control) in the page, on the EP setting; an EP that cannot run it
    (WebNN here) records the page's reason."""
    control = Control(CONTROL_NAME, setting.target, position, beside)
    job = web_job(files, CONTROL_NAME, control_model_path(), control_feeds(), setting, CONTROL_STOP, CONTROL_NAME)
    answer = await session.run_job(files.page_url, (CONTROL_NAME, setting), job, timeout_s)
    if answer["status"] == "ok":
        control.samples_ms, control.load_avg_1m = answer["samples_ms"], os.getloadavg()[0]
    else:
        control.error = answer["error"]
    return control


def calibration_job(files: Any, setting: EpSetting, calibration: Calibration, size: Size, stop: StopRule) -> PageJob:
    """A calibration graph's page job at one of its sizes (harness.run.ceilings), under a probe's or a
    measurement's stop rule (harness.browser.page_ceilings)."""
    path, feeds = calibration_path(calibration, size), calibration_feeds(calibration, size)
    return web_job(files, size.name, path, feeds, setting, stop, size.name)


def software_adapter(facts: dict[str, Any], setting: EpSetting) -> bool:
    """Whether a page answer ran WebGPU on a software adapter: its ceiling is flagged as its results are."""
    return bool(_page_details(facts, setting, {}).get("fallback_adapter"))


async def measure_page_ceilings(files: Any, session: Any, setting: EpSetting, calibrations: list[Calibration],
                                prior: Sequence[Prior], timeout_s: float) -> list[Ceiling]:  # fmt: skip
    """The target's ceilings in the page, on the EP setting, sized and timed by the page's own loop
    (harness.browser.page_ceilings), every job in one page of their own; `prior`: the earlier ceilings it may take."""

    async def run_page(calibration: Calibration, size: Size, stop: StopRule) -> dict[str, Any]:
        job = calibration_job(files, setting, calibration, size, stop)
        return await session.run_job(files.page_url, ("ceilings", setting), job, timeout_s)

    adapter = partial(software_adapter, setting=setting)
    return await calibrate_in_page(run_page, setting.target, calibrations, prior, adapter)


async def page_refusal(session: Any, setting: EpSetting, case: Case, request: WebRequest,
                       key: object = "adapter-probe") -> tuple[str | None, dict]:  # fmt: skip
    """(why this case must not run, the adapter facts for the row): webgpu on a software adapter under
    --require-hardware-gpu, or fp16 on an adapter without shader-f16. Decided before any model is loaded, in
    the page of `key` (the job's own, where the job then runs)."""
    from harness.web.adapter import adapter_details, webgpu_refusal

    if not EPS[setting.ep].gpu_adapter or session.browser is None:
        return None, {}
    if session.device_stall(setting.ep, setting.device_type) is not None:  # its page job answers at once
        return None, {}
    report = await session.webgpu_adapter(key)
    return webgpu_refusal(report, case.precision, request.require_hardware_gpu), adapter_details(report)


async def _run_case(
    files: Any, session: Any, plan: WebPlan, prepared: PreparedModel, setting: EpSetting, case: Case, fault: str | None
) -> Result:
    stall = session.device_stall(setting.ep, setting.device_type)
    if stall is not None:  # its device made no progress: no browser, no page, no wait
        return build_result(prepared, setting, case, stall, {"details": session.facts()}, [])
    problem = await session.ensure_started()
    key = (prepared.spec.name, setting)  # the job's page: a fresh one per model and EP setting
    refusal, adapter = await page_refusal(session, setting, case, plan.request, key)
    details = session.facts() | adapter  # the browser this job ran in, even if it is restarted after a failure
    details |= {"page_transport_origin": files.origin, "cross_origin_isolation_served": files.isolate}
    if problem is not None:  # not started, or not reachable: tried once for this case
        return prepared.result(setting.target, case, "error", problem, details=details)
    if refusal is not None:
        return prepared.result(setting.target, case, "unsupported", refusal, details=details)
    model, precision, conversion = case_model(prepared, case)
    if model is None:
        return prepared.result(
            setting.target, case, conversion["status"], conversion["why"], precision=precision, details=details
        )
    conversion |= runtime_details(setting.runtime) | runtime_model(
        prepared, setting.runtime, case, model, setting.runtime_folder
    )
    page = page_job(files, prepared, setting, case, plan.request, fault, model)
    psutil.cpu_percent(interval=None)  # starts the whole-machine CPU window for this job
    answer = await session.run_job(files.page_url, key, page, plan.request.timeout_s)
    extra = {
        "load_avg_1m": os.getloadavg()[0],
        "cpu_percent": psutil.cpu_percent(interval=None),
        "precision": precision,
        "details": details | conversion | {"input_shapes": page.input_shapes},
    }
    _, reference = prepared.load_case((case.batch_size, case.seq_len), on_graph=case.mode == "inference")
    return build_result(prepared, setting, case, answer, extra, reference,
                        work_file(prepared, setting.runtime, case, model))  # fmt: skip


# --- the run ----------------------------------------------------------------------------------------

Prepared = tuple[ModelSpec, PreparedModel | None, str]  # (spec, prepared or None, why not)


def prepare_spec(plan: Any, spec: ModelSpec) -> Prepared:
    """The same prepare_model child as native: same cached ONNX file, same npz inputs and reference (a served
    device's request has no page runtimes: our own loop only)."""
    cases = plan.cases(spec)
    shapes = sorted({(c.batch_size, c.seq_len) for c in cases}, key=str)
    generates = any(c.mode == "generate" for c in cases)  # the graph with past, and native ORT's tokens
    tokens = plan.request.new_tokens if generates else 0
    depths = tuple(sorted({c.depth or 0 for c in cases if c.mode == "generate"})) or (0,)
    # the page generates from the graph with past alone, and runs inference on it too where native does
    prefill = inference_on_past(spec, plan.request.modes) and any(c.mode == "inference" for c in cases)
    plain = any(c.mode != "generate" for c in cases) and not prefill
    job = PrepareJob(spec, shapes, with_past=(generates or prefill) and spec.has_past_export, reference_tokens=tokens,
                     plain=plain, stop_at_eos=plan.request.stop_at_eos, reference_depths=depths,
                     prefill=prefill, audio_seconds=audio_lengths(cases),
                     gguf_precisions=gguf_precisions(getattr(plan.request, 'runtimes', ()), cases),
                     reference_model=getattr(plan.request, "reference_model", None))  # fmt: skip
    prepared, outcome = prepare_isolated(job, plan.request.prepare_timeout_s)
    if prepared:
        return spec, prepared, ""
    return spec, None, f"model preparation failed ({outcome.status}): {outcome.message or 'no result'}"


def not_runnable(
    spec: ModelSpec, prepared: PreparedModel | None, why: str, setting: EpSetting, case: Case
) -> Result | None:
    """The row for a case that cannot reach the browser, or None when it can."""
    if prepared is None:
        return unprepared_result(spec, setting.target, case, "error", why)
    if outcome := prepared.unprepared(case):
        return prepared.result(setting.target, case, *outcome)
    if prepared.onnx_path is None and case.mode != "generate":  # generation runs the export with past
        return prepared.result(setting.target, case, "unsupported", f"ONNX export failed: {prepared.onnx_error}")
    if (refused := runtime_refusal(prepared, setting.runtime, setting.ep, case, setting.runtime_folder)) is not None:
        return prepared.result(setting.target, case, "unsupported", refused, details=runtime_details(setting.runtime))
    return None


def _ep_cases(
    plan: WebPlan, models: list[Prepared], ep: str
) -> Iterator[tuple[ModelSpec, PreparedModel | None, str, EpSetting, Case]]:
    for spec, prepared, why in models:
        for setting in (s for s in plan.settings if s.ep == ep and s.device is None):
            for case in plan.remaining(spec, setting):
                yield spec, prepared, why, setting, case


async def _run_ep(
    playwright: Any,
    files: Any,
    plan: WebPlan,
    models: list[Prepared],
    ep: str,
    emit: Emit,
    faults: Mapping[str, str],
) -> None:
    from harness.web.driver import BrowserSession

    session = None  # launched (or connected) on first use, with this EP's flags only
    jobs = list(_ep_cases(plan, models, ep))
    measured: dict[Target, set[tuple[str, str]]] = {}  # each target's ceilings measured in this run
    controls = _control_points(jobs)
    timeout_s = plan.request.timeout_s
    seen = False  # this EP's platform, as its own browser sees it, is stored once (the hardware table)
    try:
        for index, (spec, prepared, why, setting, case) in enumerate(jobs):
            row = not_runnable(spec, prepared, why, setting, case)
            if row is None:
                assert prepared is not None
                if session is None:
                    session = BrowserSession(playwright, plan.browser_source(ep), files)
                if (setting, "start") in controls.get(index - 1, []):
                    emit(await measure_control(files, session, own_loop(setting), "start", spec.name, timeout_s))
                # the EP's ceilings, measured once per run by the page's own loop before the first job that needs
                # each of them; every page runtime's rows on the EP are held against them (labels.ceiling_owner)
                asked = ceilings_asked(plan.request.no_ceilings)
                held = own_loop(setting)
                needed = wanted([case.precision], measured.setdefault(held.target, set()), asked)
                prior = plan.ceilings.for_target(held.target, plan.request.ceilings) if needed else ()
                for ceiling in await measure_page_ceilings(files, session, held, needed, prior, timeout_s):
                    emit(ceiling)
                # a fault for one runtime's setting ("transformers.js/wasm:threads=1"), or for every runtime's
                fault = faults.get(f"{setting.runtime}/{setting.provider}", faults.get(setting.provider))
                row = await _run_case(files, session, plan, prepared, setting, case, fault)
                if not seen and session.browser is not None:
                    seen = await platform_seen(session, setting, emit)
            emit(row)
            for each, position in controls.get(index, []):
                if session is not None and position != "start":
                    emit(await measure_control(files, session, own_loop(each), position, spec.name, timeout_s))
    finally:
        if session is not None:
            await session.close()


async def _ep_ceilings(playwright: Any, files: Any, plan: WebPlan, ep: str, emit: Emit) -> None:
    """--ceilings-only: the EP's ceilings at each of its settings (the page's own loop), and no model."""
    from harness.web.driver import BrowserSession

    calibrations = list(only_calibrations(plan.request.precision))
    session = BrowserSession(playwright, plan.browser_source(ep), files)
    seen = False
    try:
        for setting in dict.fromkeys(own_loop(s) for s in plan.settings if s.ep == ep and s.device is None):
            prior = plan.ceilings.for_target(setting.target, plan.request.ceilings)
            timeout_s = plan.request.timeout_s
            for ceiling in await measure_page_ceilings(files, session, setting, calibrations, prior, timeout_s):
                emit(ceiling)
            if not seen and session.browser is not None:
                seen = await platform_seen(session, setting, emit)
    finally:
        await session.close()


def own_loop(setting: EpSetting) -> EpSetting:
    """The setting's EP and threads under the page's own loop: what measures its ceilings and drift control, the
    one runtime with calibration graphs (another runtime's rows are held against them: the EP's limits)."""
    return replace(setting, runtime=OWN_RUNTIME)


async def platform_seen(session: Any, setting: EpSetting, emit: Emit) -> bool:
    """Store the EP's platform as the browser that ran it sees it; False when the probe page could not answer
    (the platform is then not stored: not probed is not unavailable)."""
    try:
        verdict = await session.platform_verdict(setting.ep, setting.device_type)
    except Exception:  # a browser that died mid-run: its rows say why; the next job's browser is asked
        return False
    emit(PlatformStatus(*verdict))
    return True


def _control_points(jobs: list[tuple[Any, ...]]) -> dict[int, list[tuple[EpSetting, str]]]:
    """Where the drift control is measured among an EP's jobs, per EP setting: before its first job
    (at index - 1), after its middle job and after its last."""
    indices: dict[EpSetting, list[int]] = {}
    for index, job in enumerate(jobs):
        indices.setdefault(job[3], []).append(index)
    points: dict[int, list[tuple[EpSetting, str]]] = {}
    for setting, mine in indices.items():
        for after, position in control_positions(len(mine)).items():
            at = mine[0] - 1 if after == -1 else mine[after]
            points.setdefault(at, []).append((setting, position))
    return points


async def run_playwright(plan: WebPlan, models: list[Prepared], emit: Emit, faults: Mapping[str, str]) -> None:
    from playwright.async_api import async_playwright

    from harness.web.server import PageServer, RoutedPages

    # A remote browser may not be able to connect back here: it gets everything through Playwright's
    # routing, and no local port is opened. A launched browser loads from a local server.
    kind = RoutedPages if plan.request.browser_endpoint else PageServer
    files = kind(isolate=plan.request.cross_origin_isolation)
    await files.start()
    try:
        async with async_playwright() as playwright:
            for ep in dict.fromkeys(s.ep for s in plan.settings if s.device is None):  # one browser launch per EP
                if plan.request.ceilings_only:
                    await _ep_ceilings(playwright, files, plan, ep, emit)
                else:
                    await _run_ep(playwright, files, plan, models, ep, emit, faults)
    finally:
        await files.stop()
