"""Adapter truth: is a WebGPU adapter a GPU, or software pretending to be one? One rule for the page's
adapter (harness.web.adapter) and the native WebGPU EP's (harness.native.webgpu_ep).

Only the adapter's own words count (its info, isFallbackAdapter, its device type): chrome://gpu has
shown llvmpipe as "hardware accelerated". A software adapter (SwiftShader, llvmpipe, lavapipe, WARP)
runs 100-300x slower than a GPU: its timings say nothing about GPU speed, so such rows are marked (F).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from harness.core.precision import MEANINGS, per_graph

# Names of software rasterizers as they appear in an adapter's info (vendor, architecture, device,
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
    """software or hardware, from the adapter's info (and isFallbackAdapter); None without an adapter."""
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


def computes_fp16(precision: str) -> bool:
    """Whether a precision's activations are fp16 (fp16, and q4f16's), so its WebGPU kernels need shader-f16; a
    per-graph precision's where any graph's are (encoder=fp32,decoder=q4f16)."""
    parts = per_graph(precision)
    return any(MEANINGS.get(one, ("", ""))[1] == "fp16" for one in (parts.values() if parts else [precision]))


def f16_refusal(name: str, has_f16: bool | None, precision: str, engine: str) -> str | None:
    """Why a precision cannot run on an adapter without shader-f16 (its `unsupported` reason), or None.
    has_f16 None (not known) lets it run: the engine then says what it finds."""
    if computes_fp16(precision) and has_f16 is False:
        why = f"adapter lacks shader-f16 ('{name}' offers no fp16 shaders)"
        return f"{why}, so {engine} has no fp16 kernels for {precision}"
    return None
