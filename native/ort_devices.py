"""ONNX Runtime's own device discovery: what `onnxruntime.get_ep_devices()` offers once the installed
plugin EPs are registered (`hardware` lists it; a plugin target runs on these devices through
add_provider_for_devices).

A plugin EP is a package named onnxruntime-ep-* whose module (onnxruntime_ep_*) says its library
(get_library_path) and EP names (get_ep_names), as onnxruntime-ep-webgpu does. The WebGPU one is
registered through harness.native.webgpu_ep, which first gives Dawn its Vulkan loader and ICD.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from harness.native import webgpu_ep

PLUGIN_MODULE_PREFIX = "onnxruntime_ep_"
MAX_PLUGINS = 16  # plugin packages registered, at most
MAX_DEVICES = 64  # devices listed, at most
TEXT = 200  # characters kept of each value ORT reports


def plugin_packages() -> list[str]:
    """The installed plugin EP packages' module names (onnxruntime_ep_*, top-level on sys.path), bounded:
    found by listing sys.path's folders, not by reading every installed distribution's metadata."""
    found = {m.name for m in pkgutil.iter_modules() if m.name.startswith(PLUGIN_MODULE_PREFIX)}
    return sorted(found)[:MAX_PLUGINS]


def register_plugins() -> dict[str, str]:
    """Every installed plugin EP registered with ORT in this process: module → "registered" or why not."""
    import onnxruntime as ort

    outcome = {}
    for module in plugin_packages():
        try:
            if module == "onnxruntime_ep_webgpu":
                webgpu_ep.setup()  # Vulkan found first: the software flag is read at registration
            else:
                plugin = importlib.import_module(module)
                ort.register_execution_provider_library(module, plugin.get_library_path())
            outcome[module] = "registered"
        except Exception as exc:  # one plugin that cannot load does not hide the others
            outcome[module] = f"not registered: {type(exc).__name__}: {exc}"[:TEXT]
    return outcome


def _text(value: Any) -> str:
    return str(value)[:TEXT]


def ep_devices() -> list[dict[str, Any]]:
    """Each (EP, device) ORT offers after registering the plugins: EP name and vendor, device type,
    vendor, vendor id, device id, and both sides' metadata (bounded text)."""
    import onnxruntime as ort

    plugins = register_plugins()
    devices = []
    for found in ort.get_ep_devices()[:MAX_DEVICES]:
        hardware = found.device
        devices.append({
            "ep": _text(found.ep_name), "ep_vendor": _text(found.ep_vendor),
            "type": _text(hardware.type).rsplit(".", 1)[-1], "vendor": _text(hardware.vendor),
            "vendor_id": int(hardware.vendor_id), "device_id": int(hardware.device_id),
            "ep_metadata": {_text(k): _text(v) for k, v in dict(found.ep_metadata).items()},
            "device_metadata": {_text(k): _text(v) for k, v in dict(hardware.metadata).items()},
        })  # fmt: skip
    not_registered = {m: why for m, why in plugins.items() if why != "registered"}
    return devices + [{"ep": m, "not_registered": why} for m, why in not_registered.items()]
