"""ONNX export with torch.onnx.export(dynamo=True), cached by content hash.

The cache key covers everything that changes the graph or weights: the spec, the weights'
fingerprint, the exporter stack's versions and the opset. A second run reuses the file.
The TorchScript exporter is used only when dynamo fails, and that is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.specs import ModelSpec
from harness.workload import Weights

OPSET = 18


def cache_root() -> Path:
    """$ACCELHARNESS_CACHE_DIR, else $XDG_CACHE_HOME/accelharness, else ~/.cache/accelharness."""
    explicit = os.environ.get("ACCELHARNESS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "accelharness"


@dataclass(frozen=True)
class ExportOutcome:
    path: Path | None
    exporter: str | None  # "dynamo" | "torchscript" | None when both failed
    cache_hit: bool
    export_s: float | None
    error: str | None  # why there is no ONNX file
    dynamo_error: str | None  # why dynamo failed when the fallback was used


def export_key(spec: ModelSpec, weights: Weights) -> str:
    import onnx
    import onnxscript
    import torch
    import transformers

    material = json.dumps(
        {
            "spec": spec.fingerprint(),
            "weights": weights.fingerprint,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__,
            "opset": OPSET,
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


def export_onnx(spec: ModelSpec, module: Any, weights: Weights, feeds: dict[str, np.ndarray]) -> ExportOutcome:
    """Export `module` (an OutputSelector) to a single-file ONNX model, or reuse the cached one.

    `feeds` are example inputs with batch >= 2 so torch.export does not specialise batch to 1.
    """
    import torch

    target_dir = cache_root() / "onnx" / export_key(spec, weights)
    target = target_dir / "model.onnx"
    if target.exists():
        meta = json.loads((target_dir / "meta.json").read_text())
        return ExportOutcome(target, meta["exporter"], True, None, None, meta.get("dynamo_error"))

    names = list(module.input_names)
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    shapes, axes = _dynamic_shapes(names, feeds)
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target_dir.parent, prefix=".staging-"))
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
                external_data=False,
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
            exporter = "torchscript"
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        error = f"ONNX export failed: dynamo: {dynamo_error}; torchscript: {_short(exc)}"
        return ExportOutcome(None, None, False, None, error, dynamo_error)
    export_s = time.perf_counter() - started
    (staging / "meta.json").write_text(
        json.dumps({"exporter": exporter, "dynamo_error": dynamo_error, "export_s": export_s, "opset": OPSET})
    )
    try:
        os.replace(staging, target_dir)  # atomic: a concurrent or killed export never leaves half a file
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process won the race; use its file
    return ExportOutcome(target, exporter, False, export_s, None, dynamo_error)
