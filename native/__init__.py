"""Native backends: one module per engine behind the protocol in base.py, and this registry.

A new engine is its module (a `BACKEND` with its capabilities, targets, probe and load) and one line
in REGISTRY; nothing outside native/ names it.
"""

import importlib

from harness.native.base import Availability, Backend, Capabilities, Session, UnsupportedError

# engine → (its module here, whether a run uses it when no engine is named)
REGISTRY = {
    "torch": ("torch_backend", True),
    "onnxruntime": ("onnxruntime_backend", True),
    "openvino": ("openvino_backend", True),
    # opt-in (--engines jax): an optional extra that implements two architectures, so in a default run
    # every other model would gain an `unsupported` row. Its module imports without jax and probes unavailable.
    "jax": ("jax_backend", False),
    # opt-in (--engines onnxruntime-genai): it generates on onnxruntime-genai model folders only
    "onnxruntime-genai": ("onnxruntime_genai_backend", False),
    # opt-in (--engines llama.cpp): generates on the GGUF the prepare worker writes of a llama-family decoder, through
    # node-llama-cpp's prebuilt binary (`make setup`); every other model would gain an `unsupported` row
    "llama.cpp": ("llamacpp_backend", False),
    # opt-in (--engines llama-cpp-python): the same GGUF through PyPI's bindings, where a user has them installed
    # (no wheel runs here without compiling llama.cpp); unavailable, saying how to install them, elsewhere
    "llama-cpp-python": ("llamacpp_python_backend", False),
}
ENGINES = tuple(REGISTRY)
DEFAULT_ENGINES = tuple(engine for engine, (_, default) in REGISTRY.items() if default)


def get_backend(engine: str) -> Backend:
    """The backend module for an engine name; imported lazily so the parent stays light."""
    if engine not in REGISTRY:
        raise KeyError(f"unknown native engine '{engine}'; valid: {', '.join(ENGINES)}")
    return importlib.import_module(f"harness.native.{REGISTRY[engine][0]}").BACKEND


def capabilities(engine: str) -> Capabilities:
    return get_backend(engine).capabilities


__all__ = [
    "DEFAULT_ENGINES",
    "ENGINES",
    "Availability",
    "Backend",
    "Capabilities",
    "Session",
    "UnsupportedError",
    "capabilities",
    "get_backend",
]
