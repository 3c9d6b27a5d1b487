"""The fp16, int8, q4 and q4f16 versions of an fp32 ONNX file, converted with ONNX Runtime's tools and
cached next to the export: the files native ONNX Runtime, OpenVINO and the browser (onnxruntime-web)
run for those precisions. Imports no torch: an ONNX Runtime worker converts without it. A source
with external data is read with it; a conversion over protobuf's limit is written with it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.precision import per_graph
from harness.core.records import UnsupportedError
from harness.prepare.cache import cache_root
from harness.prepare.external import content_key, external_locations, nodes, save_model
from harness.prepare.folders import file_precision, folder_root, model_file, precision_file

# MatMulNBits as ORT's quantizer writes it: 4-bit weights in blocks of 32 along K, one scale per block
# and no zero point (symmetric); accuracy_level left unset, so the MatMul computes in its activations'
# type (fp32 for q4, fp16 for q4f16).
Q4_BLOCK_SIZE = 32
Q4_SYMMETRIC = True


@dataclass(frozen=True)
class VariantOutcome:
    path: Path
    info: dict[str, Any]  # the converter ("tool") and what it changed
    cache_hit: bool
    convert_s: float | None


def _variant_key(onnx_path: Path) -> str:
    """The fp32 export's cache key (with the file's stem where its folder holds several graphs: an
    encoder–decoder's encoder_model.onnx and decoder_model.onnx each have their own conversion), or the content
    key of an ONNX file given by --model-path."""
    if onnx_path.parent.parent == cache_root() / "onnx":
        stem = "" if onnx_path.name == "model.onnx" else f"-{onnx_path.stem}"
        return f"{onnx_path.parent.name}{stem}"
    return content_key(onnx_path)


def _quantize_int8(source: Path, target: Path) -> dict[str, Any]:
    """ORT dynamic quantization of the MatMuls with constant weights (int8 weights per output
    channel, uint8 activations quantized per run).

    MatMul only: the ONNX form of Linear layers, matching torch's Linear-only dynamic quantization
    (ORT's CPU EP has no ConvInteger kernel for int8 weights either). Per channel: per-tensor weights
    were off by 2.8 on xclip-tiny's logits (max 7.4); per channel, 0.12.
    """
    import onnx
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    large = bool(external_locations(source))  # a large source: its conversion keeps the weights outside too
    quantize_dynamic(source, target, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"], per_channel=True,
                     use_external_data_format=large)  # fmt: skip
    quantized = sum(n.op_type == "MatMulInteger" for n in nodes(onnx.load(str(target), load_external_data=False).graph))
    tool = f"onnxruntime {onnxruntime.__version__} quantization.quantize_dynamic (MatMul, QInt8 per-channel weights)"
    return {"tool": tool, "quantized_matmuls": quantized, "external_data": external_locations(target)}


def _convert_fp16(source: Path, target: Path) -> dict[str, Any]:
    """fp16 weights and compute, fp32 graph inputs and outputs (so the same feeds work), with
    onnxruntime.transformers' converter; its default block list keeps unsafe ops in fp32."""
    import onnx
    import onnxruntime
    from onnxruntime.transformers.float16 import convert_float_to_float16

    saved = save_model(convert_float_to_float16(onnx.load(str(source)), keep_io_types=True), target)
    tool = f"onnxruntime {onnxruntime.__version__} transformers.float16.convert_float_to_float16 (keep_io_types)"
    return {"tool": tool} | saved


def _int4_model(source: Path) -> tuple[Any, dict[str, Any]]:
    """The MatMuls with constant weights as MatMulNBits (int4 weight-only), by ORT's own quantizer."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=4, block_size=Q4_BLOCK_SIZE,
                                     is_symmetric=Q4_SYMMETRIC)  # fmt: skip
    quantizer.process()
    model = quantizer.model.model
    info = {
        "tool": f"onnxruntime {onnxruntime.__version__} quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer",
        "bits": 4,
        "block_size": Q4_BLOCK_SIZE,
        "is_symmetric": Q4_SYMMETRIC,
        "accuracy_level": None,  # unset: the MatMul computes in its activations' type
        "quantized_matmuls": sum(n.op_type == "MatMulNBits" for n in nodes(model.graph)),  # If branches too
    }
    return model, info


def _quantize_q4(source: Path, target: Path) -> dict[str, Any]:
    """int4 weights (MatMulNBits), fp32 activations: transformers.js's q4."""
    model, info = _int4_model(source)
    return info | save_model(model, target)


def _quantize_q4f16(source: Path, target: Path) -> dict[str, Any]:
    """int4 weights (MatMulNBits), fp16 activations and scales: transformers.js's q4f16; the q4 model
    converted to fp16 as the fp16 precision is (fp32 graph inputs and outputs)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model, info = _int4_model(source)
    info["tool"] += " then transformers.float16.convert_float_to_float16 (keep_io_types)"
    return info | save_model(convert_float_to_float16(model, keep_io_types=True), target)


VARIANT_CONVERTERS = {"int8": _quantize_int8, "fp16": _convert_fp16, "q4": _quantize_q4, "q4f16": _quantize_q4f16}


def precision_variant(onnx_path: Path, precision: str) -> VariantOutcome:
    """The int8, fp16, q4 or q4f16 version of an fp32 ONNX file, cached next to it as <key>-<precision>.

    Conversion errors propagate: the caller records them as the reason the precision cannot run.
    """
    target_dir = cache_root() / "onnx" / f"{_variant_key(onnx_path)}-{precision}"
    target = target_dir / "model.onnx"
    if target.exists():
        meta = json.loads((target_dir / "meta.json").read_text())
        return VariantOutcome(target, meta["info"], True, None)
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target_dir.parent, prefix=".staging-"))
    try:
        started = time.perf_counter()
        info = VARIANT_CONVERTERS[precision](onnx_path, staging / "model.onnx")
        convert_s = time.perf_counter() - started
        meta = {"info": info, "source": str(onnx_path), "convert_s": convert_s}
        (staging / "meta.json").write_text(json.dumps(meta))
        with contextlib.suppress(OSError):
            os.replace(staging, target_dir)  # atomic, as for the fp32 export
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return VariantOutcome(target, info, False, convert_s)


def model_for_precision(onnx_path: Path, precision: str) -> tuple[Path, str, dict[str, Any]]:
    """(model file, precision it runs in, conversion facts): the fp32 export, or its int8 / fp16 / q4 /
    q4f16 conversion; a model folder's own file for the precision where it has one
    (harness.prepare.folders). ORT has no bf16 conversion to offer, and a conversion that fails is the reason
    the precision is unsupported; so is a per-graph precision (encoder=fp32,decoder=q4): one graph has one
    (harness.prepare.seq2seq.precision_files gives each graph its own)."""
    if per_graph(precision) is not None:
        raise UnsupportedError(f"--precision {precision} names an encoder–decoder's graphs apart; it runs "
                               "encoder–decoder generation on ONNX Runtime and in the page only")  # fmt: skip
    if (folder_facts := _folder_file(onnx_path, precision)) is not None:
        return folder_facts
    if precision in ("fp32", "auto"):
        return onnx_path, "fp32", {}
    if precision not in VARIANT_CONVERTERS:
        raise UnsupportedError(
            f"onnxruntime: no {precision} model: the harness converts the export to int8 (dynamic "
            "quantization), fp16, q4 and q4f16 (MatMulNBits) only"
        )
    try:
        variant = precision_variant(onnx_path, precision)
    except Exception as exc:  # the converter's own error is the reason
        raise UnsupportedError(f"onnxruntime: {precision} conversion of the export failed: {exc}") from exc
    if variant.info.get("quantized_matmuls") == 0:  # the file would run, but in fp32: not a quantized result
        raise UnsupportedError(f"onnxruntime {precision}: the export has no MatMul with constant weights to quantize")
    facts = {"precision_model": str(variant.path), "conversion_cached": variant.cache_hit} | {
        "conversion" if k == "tool" else k: v for k, v in variant.info.items()
    }
    return variant.path, precision, facts


def _folder_file(graph: Path, precision: str) -> tuple[Path, str, dict[str, Any]] | None:
    """A model folder's file for the precision (details.model_file names it), or None to convert as for
    any file. A folder whose graph is not fp32 (an onnxruntime-genai int4 model) converts nothing: its
    weights are already quantized, so another precision would not be what its name says."""
    if folder_root(graph) is None:
        return None
    asked = file_precision(graph) if precision == "auto" else precision  # auto: the graph as it is
    chosen = precision_file(graph, asked)
    if chosen is not None:
        return chosen, asked, {"model_file": model_file(chosen), "precision_model": str(chosen)}
    own = file_precision(graph)
    if own != "fp32":
        raise UnsupportedError(f"{model_file(graph)} is a {own} graph and the folder has no {asked} file; "
                               f"--precision {own} runs it")  # fmt: skip
    return None
