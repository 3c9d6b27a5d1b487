"""The page's WebGPU adapter: its facts on a row, and the cases it must not run.

Whether an adapter is software is harness.core.adapters' rule, shared with native WebGPU; here a
software adapter's rows are marked, and --require-hardware-gpu refuses them before anything runs.
"""

from __future__ import annotations

from typing import Any

from harness.core.adapters import AdapterClass, adapter_name, classify_adapter, f16_refusal

__all__ = ["AdapterClass", "adapter_details", "adapter_name", "classify_adapter", "webgpu_refusal"]

# The adapter features and limits that decide what can run (fp16 kernels, GPU timestamps, model size).
FEATURES = ("shader-f16", "timestamp-query")
LIMITS = ("maxBufferSize", "maxStorageBufferBindingSize")


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
    return f16_refusal(verdict.name, "shader-f16" in (report.get("features") or []), precision, "ORT-web")
