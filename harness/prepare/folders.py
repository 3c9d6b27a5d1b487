"""The model folders people deploy, read as `--model-path` takes them: which ONNX file a run loads for a
precision, and what the graph leaves to the config (the past key/values' heads and head size).

  onnxruntime-genai  genai_config.json + the decoder file it names (model.onnx [+ model.onnx.data])
  transformers.js    config.json + onnx/model.onnx, onnx/model_fp16.onnx, onnx/model_q4.onnx, …: the
                     precision picks the file by its suffix; an encoder–decoder (Whisper, T5):
                     onnx/encoder_model{,_fp16,_int8,_quantized,_q4,_q4f16}.onnx + onnx/decoder_model_merged{…}.onnx
  optimum            config.json + model.onnx or decoder_model_merged.onnx (use_cache_branch); an
                     encoder–decoder: encoder_model.onnx + decoder_model_merged.onnx, or decoder_model.onnx +
                     decoder_with_past_model.onnx

An encoder–decoder folder's graph is its encoder (inference runs it; generation runs its decoder beside it:
harness.prepare.folder_layouts). The file names are harness.prepare.folder_layouts's tables.

A folder with none of these is a Hugging Face checkpoint (harness.prepare.specs). Imports no torch.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from harness.core.precision import graph_label
from harness.core.terminal import terminal_text
from harness.prepare.external import nodes
from harness.prepare.folder_checks import (
    FolderError,
    check_external_data,
    check_sizes,
    genai_decoder,
    genai_files,
    inside,
    read_config,
    refuse_special,
    size_problem,
)
from harness.prepare.folder_layouts import (
    DECODER_MERGED,
    DECODER_SPLIT,
    ENCODER,
    SUFFIXES,
    TRANSFORMERS_JS_SUFFIXES,
    layout_decoder,
    layout_encoder,
    present,
    seq2seq_graphs,
    split_name,
)

GENAI_CONFIG = "genai_config.json"
OPTIMUM_FILES = ("model.onnx", "decoder_model_merged.onnx")


def folder_graph(folder: Path) -> Path | None:
    """The ONNX file a folder's reference outputs come from (its fp32 file where it has one), or None
    when the folder holds no ONNX layout. Every file the layout names, the configs and their sizes are checked
    first (harness.prepare.folder_checks): a folder stays inside itself, and its files are regular files."""
    if (folder / GENAI_CONFIG).exists() or (folder / GENAI_CONFIG).is_symlink():
        return _genai_graph(folder)
    onnx_dir = folder / "onnx"
    if onnx_dir.is_dir():
        found = [onnx_dir / f"model{suffix}.onnx" for suffix in SUFFIXES]
        if kept := [path for path in found if present(path)]:
            return _checked(folder, kept)[0]
        if (encoder := _seq2seq_graph(folder, onnx_dir)) is not None:
            return encoder
        raise FolderError(f"{onnx_dir} holds none of {', '.join(p.name for p in found)}, nor an encoder–decoder's "
                          f"{ENCODER}.onnx + {DECODER_MERGED}.onnx")  # fmt: skip
    if (encoder := _seq2seq_graph(folder, folder)) is not None:
        return encoder
    kept = [folder / name for name in OPTIMUM_FILES if present(folder / name)]
    return _checked(folder, kept)[0] if kept else None


def _seq2seq_graph(folder: Path, where: Path) -> Path | None:
    """An encoder–decoder layout's encoder in `where` (folder/onnx, or the folder itself), every file of the layout
    checked (inside the folder, its external data too) and config.json's sizes bounded; None where `where` holds
    no encoder_model*.onnx. An encoder without a decoder, or without config.json (its decoder_start_token_id
    starts generation), is refused by name."""
    graphs = seq2seq_graphs(where)
    if not any(split_name(graph)[0] == ENCODER for graph in graphs):
        return None
    here = "onnx/" if where != folder else ""
    if layout_decoder(where) is None:
        raise FolderError(
            f"{here}{ENCODER}.onnx has no decoder beside it: an encoder–decoder folder needs "
            f"{here}{DECODER_MERGED}.onnx (or {here}{DECODER_SPLIT[0]}.onnx with {here}{DECODER_SPLIT[1]}.onnx), "
            f"each name with its precision suffix where it has one ({', '.join(s for s in SUFFIXES if s)})"
        )
    if not present(folder / "config.json"):
        raise FolderError("an encoder–decoder folder needs config.json (its decoder_start_token_id starts generation)")
    _checked(folder, graphs)
    return layout_encoder(where)


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
        path = inside(folder, name, f"the layout's model file {name}")
        refuse_special(path)  # a FIFO would block the graph's read (onnx.load, ONNX Runtime) for good
        check_external_data(path, folder)
    return graphs


def _present(path: Path, why: str) -> Path:
    refuse_special(path)
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
    """A folder's own file for a precision: transformers.js's onnx/<stem><suffix>.onnx beside the graph (an
    encoder–decoder's graphs each by its own stem; a _quantized file only where it reads as int8), or the graph
    itself when it already is that precision (an onnxruntime-genai int4 model is q4)."""
    if folder_root(graph) is None:
        return None
    if graph.parent.name == "onnx" and precision in TRANSFORMERS_JS_SUFFIXES:
        stem = split_name(graph)[0]
        for suffix in TRANSFORMERS_JS_SUFFIXES[precision]:
            sibling = graph.parent / f"{stem}{suffix}.onnx"
            if sibling.is_file() and (suffix != "_quantized" or file_precision(sibling) == precision):
                return sibling
    return graph if file_precision(graph) == precision else None


@cache
def file_precision(graph: Path) -> str:
    """What an ONNX file's weights are, from its proto (weights not loaded): int4 MatMulNBits is q4 (q4f16
    with fp16 logits), int8 MatMulInteger is int8, fp16 logits fp16, else fp32."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    ops = {node.op_type for node in nodes(model.graph)}  # a merged decoder's are in its If's branches
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
    refuse it, by name, when the run is validated). What runs when --precision is not given. A GGUF's is the kind
    of its weights' quantization (harness.prepare.gguf_file: Q4_1 is q4)."""
    if path.suffix == ".gguf" and path.is_file():
        from harness.prepare.gguf_file import gguf_precision

        return gguf_precision(path)
    try:
        graph = folder_graph(path) if path.is_dir() else None
        if graph is not None and split_name(graph)[0] == ENCODER:  # an encoder–decoder's: each graph's
            return _seq2seq_precision(graph.parent)
        onnx_files = list((path / "onnx").glob("model*.onnx")) if (path / "onnx").is_dir() else [graph]
        return file_precision(graph) if graph is not None and len(onnx_files) == 1 else None
    except Exception:  # anything unreadable is refused by name where the model path is checked
        return None


def _seq2seq_precision(where: Path) -> str | None:
    """An encoder–decoder folder's one precision per graph (encoder=fp32,decoder=q4, or one name), where it holds
    one file of each graph (a merged or split decoder); None where it holds several."""
    graphs = seq2seq_graphs(where)
    encoders = [g for g in graphs if split_name(g)[0] == ENCODER]
    decoders = {split_name(g)[1]: g for g in graphs if split_name(g)[0] != ENCODER}
    decoder = layout_decoder(where)
    if len(encoders) != 1 or len(decoders) != 1 or decoder is None:
        return None
    return graph_label({"encoder": file_precision(encoders[0]), "decoder": file_precision(decoder)})
