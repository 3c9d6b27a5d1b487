"""JAX (XLA) on cpu / cuda / rocm / tpu, running Flax NNX ports of ResNetModel and ViTModel.

An optional engine: `pip install 'accelharness[jax]'`. This module imports without jax (the
harness probes every engine), and then every target probes unavailable with the install hint.

Weights: load() builds the same torch module the reference outputs come from
(harness.prepare.workload.build_module: the seeded random weights, or pretrained ones when present) and
ports it tensor by tensor (jax_models.port_torch_weights), so the parity check against torch fp32
tests the JAX computation and nothing else.

Compilation: an XLA executable is specialised to its input shapes. prepare() — outside the timed
region — takes the case's executable from a per-shape cache or lowers and compiles it
(jit(...).lower(...).compile(), timed on its own). `compile_ms` is the compile time of the
executable the latest prepare() chose: each result row carries the compile time of its own
shape, and neither first_run_ms nor the samples contain any compilation. run() blocks until the
device has finished, so the wall clock covers the device work on GPU and TPU as well.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
import time
from typing import Any

import numpy as np

from harness.core.records import Target, UnsupportedError
from harness.native.base import (
    Availability,
    Capabilities,
    Clock,
    DeviceByHardware,
    HostMemory,
    LoadRequest,
    thread_facts,
)

INSTALL_HINT = "pip install 'accelharness[jax]'"
# harness hardware name → JAX platform name (the target's provider)
PLATFORMS = {"cpu": "cpu", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu"}
PLUGIN_HINTS = {
    "cuda": " (pip install 'jax[cuda12]' of the same version)",
    "rocm": " (the jax-rocm plugin of the same version)",
    "tpu": " (pip install 'jax[tpu]' of the same version)",
}
# Requested precision → the dtype weights and inputs are cast to (auto: fp32, as torch's reference).
DTYPE_NAMES = {"fp32": "float32", "auto": "float32", "bf16": "bfloat16"}
UNSUPPORTED_PRECISIONS = {
    "fp16": "jax engine: fp16 is not implemented (it runs fp32 and bf16)",
    "int8": "jax engine: int8 needs quantized layers, which its Flax ports do not have (it runs fp32 and bf16)",
    "q4": "jax engine: q4 (int4 weight-only MatMulNBits) is an ONNX Runtime format (it runs fp32 and bf16)",
    "q4f16": "jax engine: q4f16 (int4 weight-only MatMulNBits) is an ONNX Runtime format (it runs fp32 and bf16)",
}


def missing_dependency() -> str | None:
    """Why the extra cannot be used here, or None when jax, jaxlib and flax are installed.

    find_spec looks without importing: every CLI run probes every engine, and importing jax and
    flax costs about two seconds. A broken install shows up at load() as that worker's error.
    """
    for module in ("jax", "jaxlib", "flax"):
        if importlib.util.find_spec(module) is None:
            return f"{module} not installed: {INSTALL_HINT}"
    return None


def _has_plugin(name: str) -> bool:
    """Whether a PJRT plugin (or libtpu) for a JAX platform is installed, found the way jax finds
    them (the jax_plugins namespace and entry points) but without initialising any backend."""
    if name == "tpu":
        return importlib.util.find_spec("libtpu") is not None
    modules = [entry.value for entry in importlib.metadata.entry_points(group="jax_plugins")]
    namespace = importlib.util.find_spec("jax_plugins")
    if namespace is not None and namespace.submodule_search_locations:
        modules += [m.name for m in pkgutil.iter_modules(namespace.submodule_search_locations)]
    return any(name in module for module in modules)


class JaxSession(HostMemory):
    def __init__(self, graphdef: Any, state: Any, device: Any, outputs: tuple[str, ...], precision: str) -> None:
        import flax
        import jax
        import jaxlib
        from flax import nnx

        self.state = state
        self.device = device
        self.outputs = outputs
        self.precision = "fp32" if precision == "auto" else precision
        self.dtype = DTYPE_NAMES[precision]
        # fp32 asks XLA for full-precision matmuls and convolutions: GPUs would use TF32 by default.
        self.matmul_precision = "highest" if self.dtype == "float32" else "default"
        self.clock = Clock()  # run() blocks until the device is done, so the wall clock is the device's
        self._jitted = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
        self._executables: dict[tuple[tuple[int, ...], str], tuple[Any, float]] = {}
        self.compile_ms: float | None = None
        self.facts: dict[str, Any] = {
            "jax_version": jax.__version__,
            "jaxlib_version": jaxlib.__version__,
            "flax_version": flax.__version__,
            "jax_platform": device.platform,
            "jax_device": str(device),
            "device_name": _device_name(device),
            "platform_version": device.client.platform_version,
            "x64_enabled": bool(jax.config.jax_enable_x64),
            "matmul_precision": self.matmul_precision,
            "persistent_compilation_cache": jax.config.jax_compilation_cache_dir,
            "xla_flags": os.environ.get("XLA_FLAGS"),
            "uses_nvidia_gpu": device.platform == "cuda",
        }

    def prepare(self, feeds: dict[str, np.ndarray]) -> tuple[Any, Any]:
        """The input on the device, and the executable compiled for its shape (compiled now if new)."""
        import jax

        x = jax.device_put(np.asarray(feeds["pixel_values"]).astype(self.dtype), self.device)
        key = (tuple(x.shape), self.dtype)
        reused = key in self._executables
        if not reused:
            started = time.perf_counter()
            with jax.default_matmul_precision(self.matmul_precision):
                executable = self._jitted.lower(self.state, x).compile()
            self._executables[key] = (executable, (time.perf_counter() - started) * 1000)
        executable, self.compile_ms = self._executables[key]
        # True when an earlier case of this load compiled the shape: compile_ms repeats its time.
        self.facts["compile_reused"] = reused
        return executable, x

    def run(self, prepared: tuple[Any, Any]) -> dict[str, Any]:
        import jax

        executable, x = prepared
        return jax.block_until_ready(executable(self.state, x))

    def to_numpy(self, outputs: dict[str, Any]) -> list[np.ndarray]:
        return [np.asarray(outputs[name]).astype(np.float32) for name in self.outputs]

    def device_memory_peak_mb(self) -> float | None:
        """The allocator's high-water mark on GPU/TPU. JAX cannot reset it, so it spans the worker
        process (one model and precision); on CPU, RSS covers memory and this is None."""
        if self.device.platform == "cpu":
            return None
        stats = self.device.memory_stats() or {}
        peak = stats.get("peak_bytes_in_use")
        return peak / 2**20 if peak is not None else None


def _device_name(device: Any) -> str:
    if device.platform == "cpu":
        return platform.processor() or platform.machine()
    return device.device_kind


class JaxBackend(DeviceByHardware):
    engine = "jax"
    # ports the torch module's weights (no ONNX file); its worker is spawned: jax and torch in one process
    # only for the port, never the fork server's preloaded torch
    capabilities = Capabilities(needs_onnx=False, runs_onnx_files=False)

    def targets(self) -> list[Target]:
        return [Target(hardware, "jax", name) for hardware, name in PLATFORMS.items()]

    def probe(self, target: Target) -> Availability:
        if (missing := missing_dependency()) is not None:
            return Availability(False, missing)
        version = importlib.metadata.version("jax")
        if target.provider == "cpu":  # XLA:CPU is built into jaxlib
            return Availability(True, f"jax {version} (XLA:CPU)")
        if not _has_plugin(target.provider):
            return Availability(
                False, f"jax {version} has no {target.provider} plugin installed{PLUGIN_HINTS[target.provider]}"
            )
        # Only here does the parent process initialise a JAX backend (a GPU/TPU machine with its plugin).
        import jax

        try:
            devices = jax.devices(target.provider)
        except RuntimeError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return Availability(False, f"jax {version} has no {target.provider} device: {reason}")
        return Availability(True, f"jax {version}: {len(devices)} x {devices[0].device_kind}")

    def load(self, request: LoadRequest, target: Target) -> JaxSession:
        if (missing := missing_dependency()) is not None:
            raise UnsupportedError(missing)
        import jax
        from flax import nnx

        from harness.native import jax_models
        from harness.prepare.workload import build_module, input_names

        spec = request.spec
        if request.threads is not None:  # XLA:CPU sizes its pool at start-up, for the whole process
            raise UnsupportedError("jax takes no --native-threads: XLA:CPU sizes its own thread pool per process")
        if spec.is_onnx_file:
            raise UnsupportedError("jax does not run ONNX files: the model was given as an .onnx file")
        if spec.architecture not in jax_models.ARCHITECTURES:
            raise UnsupportedError(
                f"jax engine implements ResNet and ViT only; {spec.architecture} has no JAX definition here"
            )
        if request.precision not in DTYPE_NAMES:
            raise UnsupportedError(UNSUPPORTED_PRECISIONS.get(request.precision, f"jax: no '{request.precision}'"))
        computed = jax_models.ARCHITECTURES[spec.architecture][1]
        if missing_outputs := [o for o in spec.outputs if o not in computed]:
            raise UnsupportedError(f"jax {spec.architecture} port does not compute {', '.join(missing_outputs)}")
        if input_names(spec) != ["pixel_values"]:
            raise UnsupportedError(f"jax engine takes pixel_values only, not {input_names(spec)}")
        device = jax.devices(target.provider)[0]

        module, weights = build_module(spec)  # the reference's own weights, seeded or pretrained
        model = jax_models.build_abstract(spec.architecture, module.model.config)
        unused = jax_models.port_torch_weights(model, module.model.state_dict())
        del module  # the torch copy is not needed past the port
        graphdef, state = nnx.split(model)
        dtype = DTYPE_NAMES[request.precision]
        state = jax.device_put(jax.tree.map(lambda a: a.astype(dtype), state), device)

        session = JaxSession(graphdef, state, device, spec.outputs, request.precision)
        session.facts |= {
            "weights_ported_from": f"torch {spec.architecture} ({weights.kind}, {weights.source})",
            # BatchNorm's step counters carry no weights; anything else left behind is listed
            "unported_torch_weights": [k for k in unused if not k.endswith("num_batches_tracked")],
        } | thread_facts(None, "not read: XLA:CPU sizes its own pool and says no count", None, "not read")
        return session


BACKEND = JaxBackend()
