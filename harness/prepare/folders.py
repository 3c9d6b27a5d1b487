"""The model folders people deploy, read as `--model-path` takes them: which ONNX file a run loads for a
precision, and what the graph leaves to the config (the past key/values' heads and head size).

  onnxruntime-genai  genai_config.json + the decoder file it names (model.onnx [+ model.onnx.data])
  transformers.js    config.json + onnx/model.onnx, onnx/model_fp16.onnx, onnx/model_q4.onnx, …: the
                     precision picks the file by its suffix
  optimum            config.json + model.onnx or decoder_model_merged.onnx (use_cache_branch)

A folder with none of these is a Hugging Face checkpoint (harness.prepare.specs). Imports no torch.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from harness.core.terminal import terminal_text
from harness.prepare.folder_checks import (
    FolderError,
    check_external_data,
    check_sizes,
    genai_decoder,
    genai_files,
    inside,
    read_config,
    size_problem,
)

GENAI_CONFIG = "genai_config.json"
# transformers.js's file suffixes for the harness's precisions (onnx/model<suffix>.onnx); its uint8 and
# bnb4 files are precisions the harness does not name, so never picked
TRANSFORMERS_JS_SUFFIXES = {"fp32": "", "fp16": "_fp16", "int8": "_int8", "q4": "_q4", "q4f16": "_q4f16"}
OPTIMUM_FILES = ("model.onnx", "decoder_model_merged.onnx")


def folder_graph(folder: Path) -> Path | None:
    """The ONNX file a folder's reference outputs come from (its fp32 file where it has one), or None
    when the folder holds no ONNX layout. Every file the layout names, the configs and their sizes are checked
    first (harness.prepare.folder_checks): a folder stays inside itself."""
    if (folder / GENAI_CONFIG).exists() or (folder / GENAI_CONFIG).is_symlink():
        return _genai_graph(folder)
    onnx_dir = folder / "onnx"
    if onnx_dir.is_dir():
        found = [onnx_dir / f"model{suffix}.onnx" for suffix in TRANSFORMERS_JS_SUFFIXES.values()]
        present = [path for path in found if path.is_file() or path.is_symlink()]
        if not present:
            raise FolderError(f"{onnx_dir} holds none of {', '.join(p.name for p in found)}")
        return _checked(folder, present)[0]
    present = [folder / name for name in OPTIMUM_FILES if (folder / name).is_file() or (folder / name).is_symlink()]
    return _checked(folder, present)[0] if present else None


def _genai_graph(folder: Path) -> Path:
    """genai_config.json's decoder file, with every file the config names inside the folder."""
    config = read_config(folder, GENAI_CONFIG)
    if problem := size_problem(config, GENAI_CONFIG):
        raise FolderError(problem)
    name = genai_decoder(config).get("filename", "model.onnx")
    named = genai_files(folder, config)  # the decoder's filename among them, each inside the folder
    graph = _present(inside(folder, name, "genai_config.json key 'model.decoder.filename'"),
                     f"{GENAI_CONFIG} names decoder file '{terminal_text(name)}'")  # fmt: skip
    for path in named:
        if path.suffix == ".onnx" and path.is_file():
            check_external_data(path, folder)
    return graph


def _checked(folder: Path, graphs: list[Path]) -> list[Path]:
    """A transformers.js or optimum folder's graphs, each inside the folder with its external data, and its
    config.json's sizes within their bounds."""
    if (folder / "config.json").exists() or (folder / "config.json").is_symlink():
        check_sizes(folder, "config.json")
    for graph in graphs:
        name = str(graph.relative_to(folder))
        check_external_data(inside(folder, name, f"the layout's model file {name}"), folder)
    return graphs


def _present(path: Path, why: str) -> Path:
    if not path.is_file():
        raise FolderError(f"{why}, which is not in {terminal_text(str(path.parent))}")  # the name is a config's
    return path


def folder_root(graph: Path) -> Path | None:
    """The model folder a graph file belongs to (onnx/'s parent for transformers.js), or None."""
    for root in (graph.parent, graph.parent.parent):
        if (root / GENAI_CONFIG).is_file() or (root / "config.json").is_file():
            return root
    return None


def precision_file(graph: Path, precision: str) -> Path | None:
    """A folder's own file for a precision: transformers.js's onnx/model_<suffix>.onnx beside the graph,
    or the graph itself when it already is that precision (an onnxruntime-genai int4 model is q4)."""
    if folder_root(graph) is None:
        return None
    if graph.parent.name == "onnx" and precision in TRANSFORMERS_JS_SUFFIXES:
        sibling = graph.parent / f"model{TRANSFORMERS_JS_SUFFIXES[precision]}.onnx"
        if sibling.is_file():
            return sibling
    return graph if file_precision(graph) == precision else None


@cache
def file_precision(graph: Path) -> str:
    """What an ONNX file's weights are, from its proto (weights not loaded): int4 MatMulNBits is q4 (q4f16
    with fp16 logits), int8 MatMulInteger is int8, fp16 logits fp16, else fp32."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    ops = {node.op_type for node in model.graph.node}
    half = model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    if "MatMulNBits" in ops:
        return "q4f16" if half else "q4"
    if "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops:
        return "int8"
    return "fp16" if half else "fp32"


def model_file(graph: Path) -> str | None:
    """A folder's file as the row names it ("onnx/model_q4.onnx"), or None for a file outside a folder."""
    root = folder_root(graph)
    return str(graph.relative_to(root)) if root is not None else None


@cache
def past_shape(graph: Path) -> tuple[int, int] | None:
    """(key/value heads, head size) of a folder's past key/values from its config, for graphs that leave
    them symbolic (onnxruntime-genai's kv_cache_dim); None when no config beside the graph says."""
    root = folder_root(graph)
    if root is None:
        return None
    if (root / GENAI_CONFIG).is_file():
        decoder = _genai_decoder(root)
        heads, size = decoder.get("num_key_value_heads"), decoder.get("head_size")
    else:
        config = read_config(root, "config.json")
        attention = config.get("num_attention_heads")
        heads = config.get("num_key_value_heads", attention)
        hidden = config.get("hidden_size")
        size = config.get("head_dim") or (hidden // attention if _ints(hidden, attention) else None)
    return (heads, size) if _ints(heads, size) else None


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def _genai_decoder(folder: Path) -> dict[str, Any]:
    return genai_decoder(read_config(folder, GENAI_CONFIG))


@cache
def own_precision(path: Path) -> str | None:
    """The one precision a model folder holds, as read from its graph (an onnxruntime-genai int4 folder: q4), or
    None: not an ONNX folder, a transformers.js folder of several files, or one that cannot be read (its checks
    refuse it, by name, when the run is validated). What runs when --precision is not given."""
    try:
        graph = folder_graph(path) if path.is_dir() else None
        onnx_files = list((path / "onnx").glob("model*.onnx")) if (path / "onnx").is_dir() else [graph]
        return file_precision(graph) if graph is not None and len(onnx_files) == 1 else None
    except Exception:  # anything unreadable is refused by name where the model path is checked
        return None
