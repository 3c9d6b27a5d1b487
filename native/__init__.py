"""Native backends: one module per engine behind the protocol in base.py."""

from harness.native.base import Availability, Backend, Session, UnsupportedError


def get_backend(engine: str) -> Backend:
    """The backend module for an engine name; imported lazily so the parent stays light."""
    if engine == "torch":
        from harness.native import torch_backend as module
    elif engine == "onnxruntime":
        from harness.native import onnxruntime_backend as module
    elif engine == "openvino":
        from harness.native import openvino_backend as module
    elif engine == "jax":  # optional extra; the module imports without jax and probes unavailable
        from harness.native import jax_backend as module
    else:
        raise KeyError(f"unknown native engine '{engine}'; valid: {', '.join(ENGINES)}")
    return module.BACKEND


ENGINES = ("torch", "onnxruntime", "openvino", "jax")
# The engines a run uses when none are named. jax is opt-in (--engines jax): an optional extra that
# implements two architectures, so in a default run every other model would gain an `unsupported` row.
DEFAULT_ENGINES = ("torch", "onnxruntime", "openvino")

__all__ = ["DEFAULT_ENGINES", "ENGINES", "Availability", "Backend", "Session", "UnsupportedError", "get_backend"]
