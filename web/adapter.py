"""Adapter truth: is the WebGPU adapter a GPU, or software pretending to be one?

Only the adapter's own words count (adapter.info, isFallbackAdapter): chrome://gpu has shown
llvmpipe as "hardware accelerated". A software adapter (SwiftShader, llvmpipe, lavapipe, WARP)
runs 100-300x slower than a GPU: its timings say nothing about GPU speed, so such rows are marked,
and --require-hardware-gpu refuses them before anything runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from harness.core.precision import MEANINGS

# Names of software rasterizers as they appear in adapter.info (vendor, architecture, device,
# description, driver), with what each is.
SOFTWARE_ADAPTERS = {
    "swiftshader": "SwiftShader, Chromium's CPU Vulkan",
    "llvmpipe": "llvmpipe, Mesa's CPU rasterizer",
    "lavapipe": "lavapipe, Mesa's CPU Vulkan",
    "microsoft basic render driver": "Microsoft Basic Render Driver (WARP), Windows' CPU rasterizer",
    "warp": "WARP, Windows' CPU rasterizer",
}
SOFTWARE_PATTERN = re.compile(r"\b(" + "|".join(re.escape(k) for k in SOFTWARE_ADAPTERS) + r")\b")
INFO_FIELDS = ("vendor", "architecture", "device", "description", "driver")
# The adapter features and limits that decide what can run (fp16 kernels, GPU timestamps, model size).
FEATURES = ("shader-f16", "timestamp-query")
LIMITS = ("maxBufferSize", "maxStorageBufferBindingSize")


@dataclass(frozen=True)
class AdapterClass:
    kind: str  # software | hardware
    why: str
    name: str  # the adapter in its own words, e.g. "google swiftshader: SwiftShader Device (Subzero)"

    @property
    def software(self) -> bool:
        return self.kind == "software"


def adapter_name(info: dict[str, Any]) -> str:
    """vendor architecture: description (or device), as the adapter reports them."""
    head = " ".join(str(info[k]) for k in ("vendor", "architecture") if info.get(k))
    tail = info.get("description") or info.get("device") or ""
    return f"{head}: {tail}" if head and tail else head or str(tail) or "an adapter that gives no name"


def classify_adapter(info: dict[str, Any] | None) -> AdapterClass | None:
    """software or hardware, from adapter.info (and isFallbackAdapter); None without an adapter."""
    if not info:
        return None
    name = adapter_name(info)
    if info.get("isFallbackAdapter") is True:
        return AdapterClass("software", "the browser reports isFallbackAdapter", name)
    if str(info.get("type", "")).lower() == "cpu":
        return AdapterClass("software", "its device type is CPU", name)
    text = " ".join(str(info.get(k, "")) for k in INFO_FIELDS).lower()
    found = SOFTWARE_PATTERN.search(text)
    if found:
        return AdapterClass("software", SOFTWARE_ADAPTERS[found.group(1)], name)
    return AdapterClass("hardware", "not a fallback adapter, not a CPU device, no software rasterizer named", name)


def adapter_details(report: dict[str, Any]) -> dict[str, Any]:
    """The row's adapter facts from the page's adapterReport(): class, features and limits that matter."""
    if not report.get("available"):
        return {"adapter_probe_error": report.get("error")}
    features = report.get("features") or []
    verdict = classify_adapter(report.get("info"))
    details: dict[str, Any] = {
        "probed_adapter": report.get("info"),
        "adapter_features": features,
        "adapter_limits": {k: (report.get("limits") or {}).get(k) for k in LIMITS},
    }
    details |= {f"adapter_{f.replace('-', '_')}": f in features for f in FEATURES}
    if verdict is not None:
        details |= {"adapter_class": verdict.kind, "adapter_class_why": verdict.why}
    return details


def webgpu_refusal(report: dict[str, Any], precision: str, require_hardware: bool) -> str | None:
    """Why a webgpu case must not run on this adapter (an `unsupported` row), or None to run it."""
    verdict = classify_adapter(report.get("info")) if report.get("available") else None
    if verdict is None:
        return None  # no adapter: the page reports that in the browser's own words
    if require_hardware and verdict.software:
        return (
            f"--require-hardware-gpu: the WebGPU adapter is software ({verdict.why}): it reports itself as "
            f"'{verdict.name}'"
        )
    computes_fp16 = MEANINGS.get(precision, ("", ""))[1] == "fp16"  # fp16, and q4f16's activations
    if computes_fp16 and "shader-f16" not in (report.get("features") or []):
        return (
            f"adapter lacks shader-f16 ('{verdict.name}' offers no fp16 shaders), so ORT-web has no fp16 kernels "
            f"for {precision}"
        )
    return None
