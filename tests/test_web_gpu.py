"""The browser on real accelerators: GPU launch profiles, adapter truth, fp16, remote browsers, browser memory.

This host has no GPU, so the real-Chromium tests prove the honest side: `--gpu on` still lands on
SwiftShader here and every row says so; --require-hardware-gpu refuses it before loading anything;
a Chromium started by the test and reached over CDP gets everything through Playwright's routing
while the harness opens no listening socket. bert-tiny, 3 iterations, no warm-up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.browser.execute import run_web
from harness.browser.run import WebRequest, validate_web
from harness.core.parity import TOLERANCES
from harness.run.plan import RequestError
from harness.store import open_store
from harness.web.adapter import classify_adapter, webgpu_refusal
from harness.web.flags import LINUX_GPU_FLAGS, gpu_profile, host_gpu_evidence, launch_flags

CHROMIUM = Path("/usr/lib/chromium/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's Chromium at /usr/lib/chromium")
QUICK = {"iterations": 3, "min_duration_s": 0.0, "warmup": 0, "max_iterations": 50, "output_dir": None}
QUICK_CLI = ["--iterations", "3", "--warmup", "0", "--min-duration", "0"]
SOFTWARE_SWITCHES = ("--use-webgpu-adapter=swiftshader", "--use-vulkan=swiftshader")


def rows_of(db: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the latest run, its results with details parsed)."""
    with open_store(db, read_only=True) as store:
        run_id = store.resolve_run("latest")
        rows = [r | {"details": json.loads(r["details"])} for r in store.results(run_id)]
        return store.run_info(run_id), rows


# --- launch profiles -------------------------------------------------------------------------------


def test_flag_lists_per_profile() -> None:
    off = launch_flags(["wasm"], gpu_profile("off"), platform="linux")
    on = launch_flags(["wasm"], gpu_profile("on"), platform="linux")
    assert "--disable-gpu" in off and not set(LINUX_GPU_FLAGS) & set(off)
    assert "--disable-gpu" not in on and all(flag in on for flag in LINUX_GPU_FLAGS)
    assert "--use-angle=vulkan" in on and "--enable-features=Vulkan" in on and "--ignore-gpu-blocklist" in on
    mac = launch_flags(["webgpu"], gpu_profile("on"), platform="darwin")  # Metal, the platform's default
    assert "--disable-gpu" not in mac and "--ignore-gpu-blocklist" in mac and "--use-angle=vulkan" not in mac
    for flags in (off, on, mac):
        assert "--enable-unsafe-webgpu" in flags and not set(SOFTWARE_SWITCHES) & set(flags)
    # Chromium reads only the last --enable-features: the profile's, the EP's and the user's become one
    extra = ["--enable-features=SharedArrayBuffer", "--force-device-scale-factor=1"]
    webnn_on = launch_flags(["webnn"], gpu_profile("on"), extra, platform="linux")
    features = [f for f in webnn_on if f.startswith("--enable-features")]
    assert features == ["--enable-features=Vulkan,WebMachineLearningNeuralNetwork,SharedArrayBuffer"]
    assert webnn_on[-1] == "--force-device-scale-factor=1"


def test_auto_profile_follows_the_host(tmp_path: Path) -> None:
    dri = tmp_path / "dri"
    dri.mkdir()
    no_smi = lambda _name: None  # noqa: E731
    assert host_gpu_evidence("linux", dri, no_smi) is None
    off = gpu_profile("auto", lambda: host_gpu_evidence("linux", dri, no_smi))
    assert (off.requested, off.name) == ("auto", "off") and "no /dev/dri/renderD*" in off.reason
    (dri / "renderD128").touch()
    on = gpu_profile("auto", lambda: host_gpu_evidence("linux", dri, no_smi))
    assert on.name == "on" and "renderD128" in on.reason
    smi = host_gpu_evidence("linux", tmp_path / "none", lambda _name: "/usr/bin/nvidia-smi")
    assert smi is not None and "nvidia-smi" in smi
    assert host_gpu_evidence("darwin", tmp_path / "none", no_smi) is not None  # Metal
    assert gpu_profile("off").name == "off" and gpu_profile("on").reason == "--gpu on"


# --- adapter truth ---------------------------------------------------------------------------------

# SwiftShader as Chromium 156 reports it on this host (with --enable-webgpu-developer-features, which
# the harness's launches set); the others as Chromium reports those adapters: vendor and architecture
# from Dawn's GPU tables, description and driver in the driver's own words.
ADAPTERS = {
    "swiftshader": (
        {
            "vendor": "google",
            "architecture": "swiftshader",
            "device": "0xc0de",
            "description": "SwiftShader Device (Subzero)",
            "isFallbackAdapter": True,
            "type": "CPU",
            "backend": "vulkan",
            "driver": "SwiftShader driver 5.0.0",
        },
        "software",
    ),
    "swiftshader, bare": (
        {"vendor": "google", "architecture": "swiftshader", "device": "", "description": ""},
        "software",
    ),
    "llvmpipe": ({"vendor": "mesa", "architecture": "", "description": "llvmpipe (LLVM 15.0.6, 256 bits)"}, "software"),
    "lavapipe": (
        {"vendor": "mesa", "architecture": "", "description": "", "driver": "lavapipe: Mesa 23.2.1 (LLVM 15.0.7)"},
        "software",
    ),
    "warp": (
        {"vendor": "microsoft", "architecture": "", "device": "0x008c", "description": "Microsoft Basic Render Driver"},
        "software",
    ),
    "nvidia": (
        {
            "vendor": "nvidia",
            "architecture": "lovelace",
            "device": "0x2684",
            "description": "NVIDIA GeForce RTX 4090",
            "isFallbackAdapter": False,
            "type": "discrete GPU",
            "backend": "vulkan",
            "driver": "NVIDIA: 550.54.14 550.54.14.0",
        },
        "hardware",
    ),
    "intel": (
        {"vendor": "intel", "architecture": "gen-12lp", "device": "0x4680", "description": "Intel(R) UHD Graphics 770"},
        "hardware",
    ),
    "apple": ({"vendor": "apple", "architecture": "metal-3", "device": "", "description": ""}, "hardware"),
}


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_adapter_classification(name: str) -> None:
    info, kind = ADAPTERS[name]
    verdict = classify_adapter(info)
    assert verdict is not None and verdict.kind == kind, verdict
    assert info["vendor"] in verdict.name  # the adapter's own words, quoted in reasons
    report = {"available": True, "info": info, "features": []}
    refusal = webgpu_refusal(report, "fp32", require_hardware=True)
    assert (refusal is not None) == (kind == "software")
    assert "lacks shader-f16" in (webgpu_refusal(report, "fp16", require_hardware=False) or "")
    assert webgpu_refusal(report | {"features": ["shader-f16"]}, "fp16", require_hardware=False) is None
    assert classify_adapter(None) is None


# --- real Chromium, launched --------------------------------------------------------------------------


@needs_chromium
def test_gpu_on_records_the_profile_flags_the_software_adapter_and_fp16(tmp_path: Path) -> None:
    """One run, --gpu on, wasm and webgpu at fp32 and fp16. The webgpu fp32 row records the profile, the flags
    the browser really got and the adapter it landed on (SwiftShader here, saying so). webgpu fp16 needs the
    adapter's shader-f16 (SwiftShader here has none: `unsupported`, saying so); wasm runs the same fp16 file
    native ORT runs, checked at the fp16 tolerance."""
    from harness.prepare.prepared import PrepareJob, prepare_model
    from harness.prepare.variants import precision_variant

    extra = "--force-color-profile=srgb"
    request = WebRequest(
        models=["bert-tiny"],
        hardware=["wasm", "webgpu"],
        precision="fp32,fp16",
        gpu="on",
        browser_args=[extra],
        db_path=tmp_path / "g.duckdb",
        **QUICK,
    )
    run_web(request)
    _, rows = rows_of(request.db_path)
    by_case = {(r["hardware"], r["requested_precision"]): r for r in rows}
    assert len(rows) == len(by_case) == 4  # wasm and webgpu, each at fp32 and fp16
    assert all(r["details"]["gpu_profile"] == "on" for r in rows)  # the launch's profile, whatever the EP
    assert by_case["wasm", "fp32"]["status"] == "ok", by_case["wasm", "fp32"]["error"]
    row = by_case["webgpu", "fp32"]
    details = row["details"]
    assert row["status"] == "ok", row["error"]
    assert (details["gpu_profile"], details["gpu_profile_requested"], details["gpu_profile_reason"]) == (
        "on",
        "on",
        "--gpu on",
    )
    assert details["flags"][-1] == extra and details["browser_args"] == [extra]
    assert "--disable-gpu" not in details["flags"] and "--use-angle=vulkan" in details["flags"]
    launched = details["browser_command_line"]  # what the browser process really got
    assert "--use-angle=vulkan" in launched and extra in launched and "--disable-gpu" not in launched
    # no GPU here: Chromium still lands on SwiftShader, and the row says so in the adapter's own words
    assert details["adapter_class"] == "software" and details["fallback_adapter"] is True
    assert details["adapter"]["architecture"] == "swiftshader" and details["adapter"]["type"] == "CPU"
    assert (
        details["adapter_limits"]["maxBufferSize"] > 0 and details["adapter_limits"]["maxStorageBufferBindingSize"] > 0
    )
    assert isinstance(details["adapter_shader_f16"], bool) and isinstance(details["adapter_timestamp_query"], bool)
    # fp16
    webgpu, wasm = by_case["webgpu", "fp16"], by_case["wasm", "fp16"]
    if webgpu["details"]["adapter_shader_f16"]:
        assert webgpu["status"] == "ok" and webgpu["precision"] == "fp16", webgpu["error"]
    else:
        assert webgpu["status"] == "unsupported" and "adapter lacks shader-f16" in webgpu["error"]
    assert wasm["requested_precision"] == "fp16"
    if wasm["status"] == "unsupported":  # ORT-web's own reason, e.g. no fp16 kernel for an operator
        assert wasm["error"]
        return
    assert wasm["status"] == "ok" and wasm["precision"] == "fp16", wasm["error"]
    atol, rtol = TOLERANCES["fp16"]
    assert wasm["details"]["parity_tolerance"] > atol and wasm["max_abs_diff"] <= wasm["details"]["parity_tolerance"]
    # the very file native ORT fp16 runs: the export's fp16 conversion, cached as <key>-fp16
    spec = validate_web(WebRequest(models=["bert-tiny"], hardware=["wasm"])).specs[0]
    prepared = next(prepare_model(PrepareJob(spec, [(1, 32)])))
    assert prepared.onnx_path is not None
    assert Path(wasm["details"]["precision_model"]) == precision_variant(prepared.onnx_path, "fp16").path
    assert rtol > 0  # the tolerance grows with the reference's magnitude


@needs_chromium
def test_require_hardware_gpu_refuses_the_software_adapter_before_loading_anything(tmp_path: Path) -> None:
    request = WebRequest(
        models=["bert-tiny"],
        hardware=["webgpu"],
        batch_sizes=[1, 2],
        require_hardware_gpu=True,
        db_path=tmp_path / "r.duckdb",
        **QUICK,
    )
    summary = run_web(request)
    assert summary.counts == {"unsupported": 2}
    _, rows = rows_of(request.db_path)
    for row in rows:
        assert "--require-hardware-gpu" in row["error"] and "SwiftShader Device (Subzero)" in row["error"]
        assert row["iterations"] is None and row["load_ms"] is None
        assert "ort_web_version" not in row["details"]  # no ORT-web runtime was ever started
        assert row["details"]["adapter_class"] == "software"


@pytest.mark.skipif(not shutil.which("Xvfb") and not os.environ.get("DISPLAY"), reason="needs a DISPLAY or Xvfb")
@needs_chromium
def test_headed_runs_on_a_virtual_display(tmp_path: Path) -> None:
    modes = {"modes": ["inference", "generate"], "new_tokens": 4, "sequence_lengths": [8]}
    request = WebRequest(models=["gpt2-tiny"], hardware=["wasm"], headed=True, db_path=tmp_path / "d.duckdb",
                         **modes, **QUICK)  # fmt: skip
    run_web(request)
    _, rows = rows_of(request.db_path)
    row, generated = (next(r for r in rows if r["mode"] == mode) for mode in ("inference", "generate"))
    assert row["status"] == "ok" and generated["status"] == "ok", (row["error"], generated["error"])
    # the full browser's page measures its own heaps after the warm-up and after the repeats of a generation
    assert generated["details"]["memory_growth_flag"] is False and generated["details"]["page_memory_before_mb"] > 0
    assert row["details"]["headed"] is True and row["details"]["display"]
    assert "--headless" not in row["details"]["browser_command_line"]
    # headed: the full browser, never the headless shell, and the page's own memory figure that only it gives
    assert row["details"]["browser_binary"] == "/usr/lib/chromium/chromium"
    assert row["details"]["browser_headless_shell"] is False
    assert row["details"]["page_memory_mb"] > 0
    assert "measureUserAgentSpecificMemory" in row["details"]["page_memory_covers"]


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu": "maybe"},
        {"precision": "fp8"},
        {"browser_endpoint": "ftp://127.0.0.1:9222"},
        {"browser_endpoint": "http://127.0.0.1:9222", "gpu": "on"},
        {"browser_endpoint": "http://127.0.0.1:9222", "browser_args": ["--foo"]},
    ],
)
def test_bad_launch_options_are_refused_before_anything_runs(bad: dict, tmp_path: Path) -> None:
    with pytest.raises(RequestError):
        validate_web(WebRequest(models=["bert-tiny"], db_path=tmp_path / "x.duckdb", **bad))
    assert not (tmp_path / "x.duckdb").exists()


def test_suite_config_gpu_key(tmp_path: Path) -> None:
    from harness.suite.config import ConfigError, load_config
    from harness.suite.plan import suite_requests

    config = tmp_path / "suite.toml"
    config.write_text('gpu = "maybe"\n')
    with pytest.raises(ConfigError, match=r"'gpu'.*auto, on, off"):
        load_config(config)
    config.write_text('gpu = "on"\n[hardware]\nweb_platforms = ["webgpu"]\n')
    _, web = suite_requests(load_config(config))
    assert web is not None and web.gpu == "on"


# --- real Chromium, remote --------------------------------------------------------------------------


@pytest.fixture
def remote_chromium(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, str, str]]:
    """Debian's Chromium started the way a lab machine would: remote debugging on loopback, a fresh profile."""
    process = subprocess.Popen(
        [
            str(CHROMIUM),
            "--headless",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-renderer-backgrounding",  # as docs/gpu-and-remote-browsers.md advises
            "about:blank",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    port = None
    for line in process.stderr:
        found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if found:
            port = found.group(1)
            break
    threading.Thread(target=process.stderr.read, daemon=True).start()  # keep its stderr pipe drained
    assert port, "Chromium did not report its DevTools port"
    endpoint = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{endpoint}/json/version", timeout=10) as answer:
        version = json.load(answer)["Browser"].split("/", 1)[1]  # Chrome/156.0.8078.79
    try:
        yield process, endpoint, version
    finally:
        process.kill()
        process.wait(timeout=10)


def _listening(pid: int) -> list[str]:
    """The TCP/UDP sockets a process and its descendants listen on."""
    found = []
    try:
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append(f"{process.name()}[{process.pid}] {conn.laddr.ip}:{conn.laddr.port}")
    except psutil.Error:
        pass
    return found


# slow: CI's remote path is test_remote_browser_over_a_playwright_server (the same routes, 12 s, not 40 s)
@pytest.mark.slow
@needs_chromium
def test_remote_browser_over_cdp_gets_everything_through_routing(
    remote_chromium: tuple[subprocess.Popen, str, str], tmp_path: Path
) -> None:
    """The CLI against a Chromium reached over CDP, the harness never listening: the page, ORT-web's threads,
    and a model with external data (the graph as ranges, mm.onnx.data as the externalData URL ORT-web
    fetches) all arrive through Playwright's routes; fp32 and q4 both match."""
    from int4_models import matmul_model

    _, endpoint, version = remote_chromium
    model = matmul_model(tmp_path / "mm.onnx", external=True)
    db = tmp_path / "remote.duckdb"
    cli = str(Path(sys.executable).parent / "accelharness")
    command = [cli, "web", "--browser-endpoint", endpoint, "--hardware", "wasm", "--threads", "2"]
    process = subprocess.Popen(
        [
            *command,
            "--model-path",
            str(model),
            "--precision",
            "fp32,q4",
            *QUICK_CLI,
            "--db",
            str(db),
            "--no-reports",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    listening: list[str] = []
    watching = threading.Event()

    def watch() -> None:  # sampled all through the run: the harness must never listen
        while not watching.wait(0.05):
            listening.extend(_listening(process.pid))

    watcher = threading.Thread(target=watch)
    watcher.start()
    output, _ = process.communicate(timeout=300)
    watching.set()
    watcher.join()
    assert process.returncode == 0, output
    assert not listening, listening
    run, rows = rows_of(db)
    assert run["status"] == "completed" and len(rows) == 2
    assert {r["requested_precision"] for r in rows} == {"fp32", "q4"}
    assert {r["model"] for r in rows} == {"mm"}  # the file with external data, named by its file
    for row in rows:
        assert row["provider"] == "wasm:threads=2"
        details = row["details"]
        assert row["status"] == "ok", row["error"]
        assert row["max_abs_diff"] <= details["parity_tolerance"]
        assert details["browser"] == "remote" and details["browser_version"] == version
        assert details["browser_endpoint"] == endpoint and details["browser_endpoint_host"] == "127.0.0.1"
        assert "--remote-debugging-port=0" in details["browser_command_line"]  # the flags it reports
        assert "HeadlessChrome" in details["user_agent"]
        assert details["flags"] is None and details["gpu_profile"] is None
        assert details["page_transport_origin"] == "https://accelharness.local"
        assert details["cross_origin_isolated"] is True  # COOP/COEP arrive through route.fulfill too
        assert row["memory_peak_mb"] is None and "remote" in details["memory_covers"]
        assert details["threads_effective"] == 2  # ORT's wasm worker threads load through the routes too


# slow: a browser killed mid-run is CI's in test_serve.py (a served device) and test_firefox.py (a launched one)
@pytest.mark.slow
@needs_chromium
def test_remote_browser_killed_mid_run_leaves_error_rows_and_a_finished_run(
    remote_chromium: tuple[subprocess.Popen, str, str], tmp_path: Path
) -> None:
    browser, endpoint, _ = remote_chromium
    request = WebRequest(
        models=["bert-tiny"],
        hardware=["wasm"],
        threads=[1, 2, 3],
        browser_endpoint=endpoint,
        timeout_s=60,
        db_path=tmp_path / "k.duckdb",
        **QUICK,
    )
    killer: list[threading.Timer] = []

    # the 2nd job stalls (until the 60 s timeout); the browser dies under it. The kill waits out the
    # drift control measured between the jobs (after the 1st setting, before the 2nd), ~1 s each, and the
    # 2nd page's load: 6 s once fell short on a loaded machine (the browser died before the 2nd job reached it).
    def on_result(_result: Any, _result_id: str) -> None:
        if not killer:
            killer.append(threading.Timer(20.0, browser.send_signal, [signal.SIGKILL]))
            killer[0].start()

    summary = run_web(request, on_result=on_result, faults={"wasm:threads=2": "stall"})
    run, rows = rows_of(request.db_path)
    by_provider = {r["provider"]: r for r in rows}
    assert run["status"] == "completed" and summary.counts == {"ok": 1, "error": 2}
    assert by_provider["wasm:threads=1"]["status"] == "ok"
    mid_job = by_provider["wasm:threads=2"]
    assert mid_job["status"] == "error" and "disconnected" in mid_job["error"], mid_job["error"]
    after = by_provider["wasm:threads=3"]
    assert after["status"] == "error" and "cannot connect to the remote browser" in after["error"], after["error"]


@pytest.fixture
def playwright_server(tmp_path: Path) -> Iterator[str]:
    """A Playwright browser server (what device farms expose) launching Debian's Chromium; its ws:// endpoint."""
    config = tmp_path / "server.json"
    launch = {"executablePath": str(CHROMIUM), "args": ["--no-sandbox", "--disable-gpu"], "host": "127.0.0.1"}
    config.write_text(json.dumps(launch | {"port": 0}))
    command = [sys.executable, "-m", "playwright", "launch-server", "--browser", "chromium", "--config", str(config)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        endpoint = process.stdout.readline().strip()
        assert endpoint.startswith("ws://127.0.0.1:"), endpoint
        yield endpoint
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the server and the browser it launched
        process.wait(timeout=10)


@needs_chromium
def test_remote_browser_over_a_playwright_server(playwright_server: str, tmp_path: Path) -> None:
    request = WebRequest(
        models=["bert-tiny"],
        hardware=["wasm"],
        browser_endpoint=playwright_server,
        db_path=tmp_path / "w.duckdb",
        **QUICK,
    )
    run_web(request)
    _, (row,) = rows_of(request.db_path)
    details = row["details"]
    assert row["status"] == "ok", row["error"]
    assert details["browser_connection"] == "Playwright connect"
    assert details["browser_endpoint"] == playwright_server.rsplit("/", 1)[0]  # the path (a key, maybe) is not kept
    assert details["browser_command_line"] and "--disable-gpu" in details["browser_command_line"]
    assert details["cross_origin_isolated"] is True
