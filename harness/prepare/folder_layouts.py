"""The file names of the ONNX layouts people ship, and which file of a folder is which graph at which precision
suffix: transformers.js's suffixes (onnx/model_q4.onnx, onnx/encoder_model_fp16.onnx, …) and an encoder–decoder's
graphs (transformers.js's onnx/encoder_model + onnx/decoder_model_merged; optimum's encoder_model.onnx +
decoder_model_merged.onnx, or decoder_model.onnx + decoder_with_past_model.onnx, at the top level).

Names only: every name here is built from these tables, never read from the folder's listing, so none is a
path a folder chose. harness.prepare.folders checks the files (inside the folder, configs bounded) before a run.
"""

from __future__ import annotations

import os
from pathlib import Path

# transformers.js's file suffixes for the harness's precisions (<stem><suffix>.onnx), fp32 first: int8 is its
# _int8 file, else its _quantized one (q8) where that graph reads as int8; its uint8 and bnb4 files are
# precisions the harness does not name, so never picked
TRANSFORMERS_JS_SUFFIXES: dict[str, tuple[str, ...]] = {
    "fp32": ("",),
    "fp16": ("_fp16",),
    "int8": ("_int8", "_quantized"),
    "q4": ("_q4",),
    "q4f16": ("_q4f16",),
}
SUFFIXES = tuple(suffix for found in TRANSFORMERS_JS_SUFFIXES.values() for suffix in found)
# An encoder–decoder's graphs (harness.prepare.export_seq2seq writes them under these names)
ENCODER = "encoder_model"
DECODER_MERGED = "decoder_model_merged"
DECODER_SPLIT = ("decoder_model", "decoder_with_past_model")
SEQ2SEQ_STEMS = (ENCODER, DECODER_MERGED, *DECODER_SPLIT)


def split_name(path: Path) -> tuple[str, str]:
    """(stem, suffix) of a layout file's name: decoder_model_merged_q4.onnx is (decoder_model_merged, _q4)."""
    stem = path.stem
    suffix = next((s for s in sorted(SUFFIXES, key=len, reverse=True) if s and stem.endswith(s)), "")
    return stem.removesuffix(suffix) if suffix else stem, suffix


def present(path: Path) -> bool:
    """A file the layout names is there: anything by that name, a symlink too, so that what is no regular file (a
    FIFO, a directory) or a dangling or escaping link is then refused by name, not passed over."""
    return os.path.lexists(path)


def seq2seq_graphs(where: Path) -> list[Path]:
    """Every file of an encoder–decoder layout present in `where`, by stem then suffix (fp32 first)."""
    return [where / f"{stem}{suffix}.onnx" for stem in SEQ2SEQ_STEMS for suffix in SUFFIXES
            if present(where / f"{stem}{suffix}.onnx")]  # fmt: skip


def decoder_at(where: Path, suffix: str) -> Path | None:
    """The first decoder step's file at a suffix: the merged decoder, or the split first-step one where the
    later steps' file is there too; None when neither is."""
    merged = where / f"{DECODER_MERGED}{suffix}.onnx"
    if present(merged):
        return merged
    first, later = (where / f"{stem}{suffix}.onnx" for stem in DECODER_SPLIT)
    return first if present(first) and present(later) else None


def layout_decoder(where: Path) -> Path | None:
    """The layout's decoder that stands for it (fp32 first): the first decoder step's file at the first suffix
    that has one, or None."""
    return next((found for suffix in SUFFIXES if (found := decoder_at(where, suffix)) is not None), None)


def layout_encoder(where: Path) -> Path | None:
    """The layout's encoder that stands for it (fp32 first), or None."""
    return next((where / f"{ENCODER}{s}.onnx" for s in SUFFIXES if present(where / f"{ENCODER}{s}.onnx")), None)


def encoder_beside(decoder: Path) -> Path | None:
    """The encoder of the layout a decoder file belongs to: the one at the decoder's suffix, else the layout's."""
    same = decoder.parent / f"{ENCODER}{split_name(decoder)[1]}.onnx"
    return same if same.is_file() else layout_encoder(decoder.parent)


def seq2seq_decoder(encoder: Path) -> Path | None:
    """The decoder that generates with `encoder` when it is an encoder–decoder layout's encoder (a folder's,
    given by --model-path: the spec's graph): at the encoder's suffix, else the layout's; None otherwise."""
    if split_name(encoder)[0] != ENCODER:
        return None
    return decoder_at(encoder.parent, split_name(encoder)[1]) or layout_decoder(encoder.parent)
