"""WebGPU natively: ONNX Runtime's WebGPU plugin EP (the `onnxruntime-ep-webgpu` package), the same
WebGPU kernels as onnxruntime-web, run by Dawn over Vulkan in the worker.

What Dawn needs, found in this process before the plugin is registered:
- a Vulkan loader and an ICD: the system's (a GPU's driver), else the ones a Chromium package ships
  beside the browser (libvulkan.so.1 and SwiftShader's ICD, a CPU Vulkan), searched for in the browser
  package's folders. The loader is opened by its path (RTLD_GLOBAL), so Dawn's own dlopen of
  libvulkan.so.1 finds it without LD_LIBRARY_PATH; VK_ICD_FILENAMES is set only for a browser's ICD,
  and one the environment already sets is used as it is.
- the adapter, read from Vulkan (the plugin does not expose Dawn's adapter info): the device Dawn's
  high-performance preference picks (discrete, then integrated, virtual, CPU). A software adapter is
  classified by the page's rule (harness.core.adapters); only then is
  ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER set (ORT lists no WebGPU device for a CPU otherwise).

A device that makes no progress fails once, quickly: the first tiny dispatch runs under a deadline
(as the page's device probe, web/device_probe.py), and its verdict holds for the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.adapters import adapter_name, classify_adapter, computes_fp16, f16_refusal
from harness.core.records import UnsupportedError

EP_NAME = "WebGpuExecutionProvider"
PACKAGE = "onnxruntime-ep-webgpu"
INSTALL = "pip install 'accelharness[webgpu]' (onnxruntime-ep-webgpu==0.4.0, the WebGPU plugin EP)"
SOFTWARE_ENV = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"
ICD_ENV = "VK_ICD_FILENAMES"
LOADER = "libvulkan.so.1"
ICD_PATTERN = "*swiftshader*icd.json"
# Where a Chromium package keeps its libraries: the folders globbed (bounded) for a loader and an ICD.
BROWSER_BINARIES = ("chromium", "chromium-browser", "google-chrome", "chrome")
BROWSER_FOLDERS = (
    "/usr/lib*/chromium*",
    "/opt/google/chrome*",
    "/snap/chromium/current/usr/lib/chromium*",
    "~/.cache/ms-playwright/chromium*/chrome-linux*",
)
MAX_FOLDERS = 64  # browser folders looked into, at most
FIRST_DISPATCH_S = 30.0  # the deadline on the first tiny dispatch (the page's device probe gives 20 s)

# The order Dawn's high-performance preference picks adapters in (vulkan_devices' type names)
PREFERENCE = ("discrete-gpu", "integrated-gpu", "virtual-gpu", "cpu", "other")
# PCI vendor ids as Dawn names them (its adapter info's vendor)
VENDORS = {0x1002: "amd", 0x10DE: "nvidia", 0x8086: "intel", 0x13B5: "arm", 0x5143: "qualcomm",
           0x1AE0: "google", 0x106B: "apple", 0x1010: "img-tec", 0x10005: "mesa", 0x144D: "samsung",
           0x1414: "microsoft"}  # fmt: skip
ADAPTER_SOURCE = (
    "Vulkan's physical device properties through the loader and ICD Dawn was given "
    "(the plugin EP does not expose Dawn's adapter info)"
)


@dataclass(frozen=True)
class Vulkan:
    """The loader and ICDs Dawn will use, how they were found, and the devices they offer."""

    loader: str | None  # a path, or None: none found
    icds: str | None  # VK_ICD_FILENAMES to set (a browser's ICD), or None: the system's or the environment's
    found: str  # how, in words
    devices: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class Setup:
    """This process made ready for the plugin: Vulkan, the adapter, the EP devices ORT lists."""

    vulkan: Vulkan
    adapter: dict[str, Any] | None
    software: bool
    devices: list[Any]  # onnxruntime OrtEpDevice of the WebGPU EP
    facts: dict[str, Any]


def plugin_library() -> str | None:
    """The plugin's shared library, or None where the package is not installed."""
    try:
        import onnxruntime_ep_webgpu
    except ImportError:
        return None
    return onnxruntime_ep_webgpu.get_library_path()


def browser_folders() -> list[Path]:
    """The folders a Chromium package keeps its libraries in, found on this machine (bounded)."""
    candidates: list[str] = []
    for binary in BROWSER_BINARIES:
        if (found := shutil.which(binary)) is not None:
            candidates.append(str(Path(found).resolve().parent))
    for pattern in BROWSER_FOLDERS:
        candidates += sorted(glob.glob(os.path.expanduser(pattern)))[:MAX_FOLDERS]
    unique = list(dict.fromkeys(candidates))[:MAX_FOLDERS]
    return [Path(c) for c in unique if Path(c).is_dir()]


def browser_vulkan() -> tuple[str, str] | None:
    """A browser package's Vulkan loader and SwiftShader ICD, side by side in one folder."""
    for folder in browser_folders():
        icds = sorted(folder.glob(ICD_PATTERN))
        if icds and (folder / LOADER).is_file():
            return str(folder / LOADER), str(icds[0])
    return None


def find_vulkan() -> Vulkan:
    """The loader and ICDs Dawn gets: the environment's ICDs, else the system's if they offer a device,
    else a browser package's SwiftShader."""
    system = ctypes.util.find_library("vulkan")
    browser = browser_vulkan()
    if os.environ.get(ICD_ENV) is not None:
        loader = system or (browser[0] if browser else None)
        found = f"{ICD_ENV} from the environment ({os.environ[ICD_ENV][:200]}), loader {loader}"
        return _with_devices(Vulkan(loader, None, found))
    if system is not None:
        vulkan = _with_devices(Vulkan(system, None, f"the system's Vulkan loader ({system}) and its ICDs"))
        if vulkan.devices or browser is None:
            return vulkan
    if browser is None:
        return Vulkan(None, None, "no Vulkan loader: none on the system, no Chromium package ships one here")
    return _with_devices(Vulkan(browser[0], browser[1], f"the browser package's loader and ICD ({browser[1]})"))


def _with_devices(vulkan: Vulkan) -> Vulkan:
    if vulkan.loader is None:
        return vulkan
    if vulkan.icds is not None:
        os.environ[ICD_ENV] = vulkan.icds  # read by the loader when an instance is made
    try:
        from harness.native.vulkan_devices import physical_devices

        return Vulkan(vulkan.loader, vulkan.icds, vulkan.found, physical_devices(vulkan.loader))
    except Exception as exc:  # a loader that cannot be opened, an instance that cannot be made
        return Vulkan(vulkan.loader, vulkan.icds, vulkan.found, error=f"{type(exc).__name__}: {exc}"[:300])


def adapter_info(device: dict[str, Any]) -> dict[str, Any]:
    """A Vulkan device in the page's adapter-info terms (Chromium's GPUAdapterInfo from Dawn): vendor,
    architecture, device (the PCI device id in hex), description (the device's name), driver."""
    driver = " ".join(filter(None, (device.get("driver_name"), device.get("driver_info"))))
    name = device["device_name"]
    # Dawn names SwiftShader's architecture; its table for GPUs is inside the plugin, not read here
    architecture = "swiftshader" if "swiftshader" in name.lower() else None
    return {"vendor": VENDORS.get(device["vendor_id"], f"0x{device['vendor_id']:04x}"), "architecture": architecture,
            "device": f"0x{device['device_id']:04x}", "description": name, "driver": driver or None,
            "type": device["type"], "vulkan_api": device.get("vulkan_api"),
            "shader_f16": device.get("shader_f16")}  # fmt: skip


def chosen_adapter(devices: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The device Dawn's high-performance preference picks, and how it was chosen."""
    if not devices:
        return None, "no Vulkan physical device"
    ranked = sorted(devices, key=lambda d: PREFERENCE.index(d["type"]) if d["type"] in PREFERENCE else 9)
    ties = [d for d in ranked if d["type"] == ranked[0]["type"]]
    how = "the only Vulkan device" if len(devices) == 1 else f"the first {ranked[0]['type']} of {len(devices)} devices"
    if len(ties) > 1:
        how += f" ({len(ties)} of that type: Dawn may pick another)"
    return adapter_info(ranked[0]), how


@functools.cache
def setup() -> Setup:
    """Make this process ready for the WebGPU EP (once): Vulkan found and loaded, the software flag set
    only for a software adapter, the plugin registered with ORT."""
    import onnxruntime as ort

    library = plugin_library()
    if library is None:
        raise UnsupportedError(f"{PACKAGE} is not installed: {INSTALL}")
    vulkan = find_vulkan()
    adapter, how = chosen_adapter(vulkan.devices)
    verdict = classify_adapter(adapter)
    software = verdict is not None and verdict.software
    if vulkan.loader is not None:
        ctypes.CDLL(vulkan.loader, mode=ctypes.RTLD_GLOBAL)  # Dawn's dlopen(libvulkan.so.1) finds this one
    if software:
        os.environ[SOFTWARE_ENV] = "1"
    ort.register_execution_provider_library("WebGPU", library)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    facts = {
        "vulkan_loader": vulkan.loader,
        "vulkan_found": vulkan.found,
        "vulkan_error": vulkan.error,
        "vulkan_devices": len(vulkan.devices),
        "probed_adapter": adapter,
        "adapter_source": ADAPTER_SOURCE,
        "adapter_chosen": how,
        "adapter_class": verdict.kind if verdict else None,
        "adapter_class_why": verdict.why if verdict else None,
        "adapter_shader_f16": adapter.get("shader_f16") if adapter else None,
        "fallback_adapter": software,
        "ort_webgpu_ep_allow_software_adapter": software,
        "webgpu_ep_version": dict(devices[0].ep_metadata).get("version") if devices else None,
        "dawn_version": None,  # statically linked into the plugin, which does not say which
    }
    return Setup(vulkan, adapter, software, devices, facts)


def unavailable_reason(ready: Setup) -> str | None:
    """Why no WebGPU session can be made here, or None."""
    if ready.adapter is None:
        why = ready.vulkan.error or "it offers no physical device"
        return f"Dawn has no WebGPU adapter: {ready.vulkan.found}; {why}"
    if not ready.devices:
        return f"onnxruntime lists no {EP_NAME} device (adapter '{ready.adapter['description']}')"
    return None


def probe() -> Any:
    """The target's availability (harness.native.base.Availability): the plugin installed, an adapter."""
    from harness.native.base import Availability

    try:
        ready = setup()
    except UnsupportedError as exc:
        return Availability(False, str(exc))
    if (reason := unavailable_reason(ready)) is not None:
        return Availability(False, reason)
    assert ready.adapter is not None
    kind = "software adapter" if ready.software else "adapter"
    version = ready.facts["webgpu_ep_version"]
    return Availability(True, f"{PACKAGE} {version} on the {kind} '{ready.adapter['description']}'")


def facts() -> dict[str, Any]:
    """What a row of this EP records: the adapter, how Vulkan was found, the software flag, versions."""
    return dict(setup().facts)


def add_to(options: Any) -> None:
    """The WebGPU EP on a session's options, through ORT's device discovery (add_provider_for_devices)."""
    ready = setup()
    if (reason := unavailable_reason(ready)) is not None:
        raise UnsupportedError(reason)
    options.add_provider_for_devices(ready.devices, {})


def proved(precision: str) -> dict[str, Any]:
    """The device proved for a precision, or UnsupportedError: an fp16 precision on an adapter without
    shader-f16 (the page's refusal, harness.core.adapters), or the first tiny dispatch under
    FIRST_DISPATCH_S failing or stalling (once per process; its verdict holds for every later call).
    Returns the facts of the shaders the precision runs."""
    adapter = setup().adapter or {}
    refusal = f16_refusal(adapter_name(adapter), adapter.get("shader_f16"), precision, "the WebGPU EP")
    if refusal is not None:
        raise UnsupportedError(refusal)
    verdict = _first_dispatch()
    if verdict is not None:
        raise UnsupportedError(verdict)
    return {"webgpu_shaders": "f16 (shader-f16)" if computes_fp16(precision) else "f32"}


@functools.cache
def _first_dispatch() -> str | None:
    outcome: list[BaseException | None] = []
    worker = threading.Thread(target=lambda: outcome.append(_tiny_run()), daemon=True)
    worker.start()
    worker.join(FIRST_DISPATCH_S)
    name = (setup().adapter or {}).get("description", "unknown")
    if not outcome:  # still waiting: a device that makes no progress (its thread is left behind)
        return f"WebGPU adapter '{name}' made no progress on a trivial dispatch in {FIRST_DISPATCH_S:g} s"
    if outcome[0] is not None:
        first = (str(outcome[0]).strip().splitlines() or [type(outcome[0]).__name__])[0][:300]
        return f"the WebGPU EP could not run a trivial dispatch on '{name}': {first}"
    return None


def _tiny_run() -> BaseException | None:
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper

        graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.log_severity_level = 3
        add_to(options)
        session = ort.InferenceSession(model.SerializeToString(), options)
        session.run(None, {"x": np.ones(4, np.float32)})
    except BaseException as exc:  # reported as the verdict, not raised in this thread
        return exc
    return None
