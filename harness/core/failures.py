"""How an exception becomes a row's status and message: one rule for workers, preparation, the drift
control and Ray nodes."""

from __future__ import annotations

import traceback

from harness.core.records import UnsupportedError

# How the engines say a graph holds an operator they have no kernel or conversion for (lower case):
# a fact about the engine, recorded as `unsupported`, not a crash.
UNSUPPORTED_OPERATOR = (
    "is not a registered function/op",  # ONNX Runtime, unknown op or domain
    "could not find an implementation for",  # ONNX Runtime, no kernel for this op/type on the EP
    "no conversion rule found for operations",  # OpenVINO's ONNX frontend
)


def classify(exc: BaseException) -> tuple[str, str]:
    """The status and one-paragraph message a failure is recorded with."""
    message = "".join(traceback.format_exception_only(exc)).strip()[:2000]
    text = message.lower()
    if isinstance(exc, MemoryError) or "outofmemory" in type(exc).__name__.lower() or "out of memory" in text:
        return "oom", message
    if isinstance(exc, UnsupportedError) or type(exc).__name__ == "NotImplemented":
        return "unsupported", message
    if any(pattern in text for pattern in UNSUPPORTED_OPERATOR):
        return "unsupported", message
    return "error", message
