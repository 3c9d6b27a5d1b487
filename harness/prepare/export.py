"""ONNX export with torch.onnx.export(dynamo=True), cached by content hash.

The cache key covers everything that changes the graph or weights: the spec, the weights'
fingerprint, the exporter stack's versions and the opset. A second run reuses the file.
The TorchScript exporter is used only when dynamo fails, and that is recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.faults import injected_faults
from harness.prepare.cache import exports_dir, staging_dir
from harness.prepare.external import EXTERNAL_ABOVE_BYTES
from harness.prepare.specs import ModelSpec
from harness.prepare.weights import Weights

OPSET = 18


@dataclass(frozen=True)
class ExportOutcome:
    path: Path | None
    exporter: str | None  # "dynamo" | "torchscript" | None when both failed
    cache_hit: bool
    export_s: float | None
    error: str | None  # why there is no ONNX file
    dynamo_error: str | None  # why dynamo failed when the fallback was used


# The modules whose code decides what an export and its cached inputs contain. Their source is part
# of the cache key, so changing how the harness exports (or makes inputs) never reuses a file an
# older harness wrote: a cache that outlived a bug fix once served TorchScript exports as current.
EXPORT_CODE = (
    "export.py",
    "export_past.py",
    "export_seq2seq.py",
    "merged_decoder.py",
    "workload.py",
    "weights.py",
    "inputs.py",
)


def _export_code_digest() -> str:
    digest = hashlib.sha256()
    for name in EXPORT_CODE:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:16]


def export_key(spec: ModelSpec, weights: Weights) -> str:
    # The exporter stack's installed versions (the strings their __version__ reads), not their imports:
    # torch, transformers and onnx took 2 s to import, and a run whose export is cached needs none of them
    # (harness.prepare.prepared.needs_torch asks this key from a process that never imports torch).
    material = json.dumps(
        {
            "spec": spec.fingerprint(),
            "weights": weights.fingerprint,
            "torch": metadata.version("torch"),
            "transformers": metadata.version("transformers"),
            "onnx": metadata.version("onnx"),
            "onnxscript": metadata.version("onnxscript"),
            "opset": OPSET,
            "harness_export_code": _export_code_digest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def _dynamic_shapes(names: list[str], feeds: dict[str, np.ndarray]) -> tuple[dict[str, tuple], dict]:
    """Batch is dynamic on every input, sequence on 2-D integer (token) inputs.

    OutputSelector.forward takes *args, so torch.export sees one input named `args`.
    """
    import torch

    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=2, max=8192)
    shapes, axes = [], {}
    for name in names:
        is_tokens = feeds[name].ndim == 2 and np.issubdtype(feeds[name].dtype, np.integer)
        shapes.append({0: batch, 1: sequence} if is_tokens else {0: batch})
        axes[name] = {0: "batch", 1: "sequence"} if is_tokens else {0: "batch"}
    return {"args": tuple(shapes)}, axes


ANSI_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


def _short(exc: BaseException) -> str:
    text = ANSI_ESCAPES.sub("", "".join(traceback.format_exception_only(exc)))
    return text.strip()[:2000]


def check_runs_at_batch_1(path: Path, feeds: dict[str, np.ndarray]) -> None:
    """The TorchScript exporter can bake the example batch into a graph that declares batch
    dynamic (seen with LLaVA: fine at 2, broken at 1 and 3). Such a file is an export failure."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    one = {i.name: feeds[i.name][:1] for i in session.get_inputs()}
    try:
        session.run(None, one)
    except Exception as exc:
        raise RuntimeError(f"the exported graph does not run at batch 1: {_short(exc)}") from exc


def export_onnx(spec: ModelSpec, module: Any, weights: Weights, feeds: dict[str, np.ndarray]) -> ExportOutcome:
    """Export `module` (an OutputSelector) to a single-file ONNX model, or reuse the cached one.

    `feeds` are example inputs with batch >= 2 so torch.export does not specialise batch to 1.
    """
    shapes, axes = _dynamic_shapes(list(module.input_names), feeds)
    return export_cached(export_dir(export_key(spec, weights)), module, feeds, shapes, axes)


def export_dir(key: str) -> Path:
    """Where the export with cache key `key` lives (`<key>-past` holds the graph with past key/values)."""
    return exports_dir() / key


def cached_export(target_dir: Path) -> ExportOutcome | None:
    """What an earlier run exported to target_dir, or None when it holds no model."""
    target = target_dir / "model.onnx"
    if not target.exists():
        return None
    meta = json.loads((target_dir / "meta.json").read_text())
    return ExportOutcome(target, meta["exporter"], True, None, None, meta.get("dynamo_error"))


def export_cached(
    target_dir: Path, module: Any, feeds: dict[str, np.ndarray], shapes: dict[str, tuple], axes: dict
) -> ExportOutcome:
    """Export `module` (forward(*args) over module.input_names, returning module.output_names) to
    target_dir/model.onnx with dynamo, else TorchScript, or reuse what an earlier run left there.

    `shapes` are torch.export dynamic shapes ({"args": ...}), `axes` the TorchScript dynamic axes.
    """
    import torch

    if (hit := cached_export(target_dir)) is not None:
        return hit
    args = tuple(torch.from_numpy(feeds[n]) for n in module.input_names)
    staging = staging_dir(target_dir.parent)  # a killed export's stale folder is removed first
    try:
        _injected_export_fault()
        return _export_staged(staging, target_dir, module, args, feeds, shapes, axes)
    finally:  # renamed into place, failed or interrupted: no staging directory is left behind
        shutil.rmtree(staging, ignore_errors=True)


def _injected_export_fault() -> None:
    """Testing hook: an export killed (export-kill: SIGKILL, no cleanup runs) or hanging (export-hang) with
    its staging folder written."""
    faults = injected_faults()
    if "export-kill" in faults:
        os.kill(os.getpid(), signal.SIGKILL)
    while "export-hang" in faults:
        time.sleep(3600)


def _parameter_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _export_staged(
    staging: Path, target_dir: Path, module: Any, args: tuple, feeds: dict[str, np.ndarray], shapes: dict, axes: dict
) -> ExportOutcome:
    import torch

    names = list(module.input_names)
    started = time.perf_counter()
    dynamo_error = None
    try:
        try:
            torch.onnx.export(
                module,
                args,
                str(staging / "model.onnx"),
                dynamo=True,
                input_names=names,
                output_names=list(module.output_names),
                dynamic_shapes=shapes,
                # protobuf cannot hold 2 GB: a larger model's weights go to model.onnx.data beside it
                external_data=_parameter_bytes(module) >= EXTERNAL_ABOVE_BYTES,
                opset_version=OPSET,
                verbose=False,
            )
            exporter = "dynamo"
        except Exception as exc:  # any exporter failure: record it, then try the fallback
            dynamo_error = _short(exc)
            torch.onnx.export(
                module,
                args,
                str(staging / "model.onnx"),
                dynamo=False,
                input_names=names,
                output_names=list(module.output_names),
                dynamic_axes=axes,
                opset_version=OPSET,
            )
            check_runs_at_batch_1(staging / "model.onnx", feeds)
            exporter = "torchscript"
    except Exception as exc:
        error = f"ONNX export failed: dynamo: {dynamo_error}; torchscript: {_short(exc)}"
        return ExportOutcome(None, None, False, None, error, dynamo_error)
    export_s = time.perf_counter() - started
    (staging / "meta.json").write_text(
        json.dumps({"exporter": exporter, "dynamo_error": dynamo_error, "export_s": export_s, "opset": OPSET})
    )
    with contextlib.suppress(OSError):  # another process won the race: use its file
        os.replace(staging, target_dir)  # atomic: a concurrent or killed export never leaves half a file
    return ExportOutcome(target_dir / "model.onnx", exporter, False, export_s, None, dynamo_error)
