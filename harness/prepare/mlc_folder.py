"""A WebLLM model folder (--webllm-model DIR), read as data from elsewhere before a run exists: what WebLLM
(@mlc-ai/web-llm 0.2.86) loads of a model, none of which a package registry ships and which this harness cannot make
(mlc_llm's compiler makes both per model and GPU target):

  mlc-chat-config.json   its chat config: model_type, quantization, vocab_size, context_window_size, and the
                         tokenizer files it names (each inside the folder)
  tensor-cache.json      the weights' manifest (mlc_llm's older name: ndarray-cache.json, served as the new one):
                         records of params shards (dataPath, nbytes), each shard inside the folder, a regular file of
                         exactly the bytes its record states
  <model>-webgpu.wasm    the TVM-compiled model library: the one .wasm file at the folder's top

Every file is read, or stat'ed, by harness.prepare.folder_checks's one reader: inside the folder, a regular file,
its size bounded (harness.core.bounds' MLC_ bounds) before it is read. A folder that lacks one of them, or whose
files lie, is refused naming what to supply; nothing here runs the library (the page's WebLLM does, on WebGPU).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.bounds import (
    MAX_CONTEXT,
    MAX_MLC_ENTRIES,
    MAX_MLC_LIBRARY_BYTES,
    MAX_MLC_SHARDS,
    MAX_TOKENIZER_BYTES,
    MAX_VOCAB,
    MLC_BYTES_BOUND,
)
from harness.core.terminal import terminal_text
from harness.prepare.folder_checks import FolderError, inside, read_config, refuse_special, shown

CHAT_CONFIG = "mlc-chat-config.json"
TENSOR_CACHE = "tensor-cache.json"  # what WebLLM 0.2.86 fetches
OLD_TENSOR_CACHE = "ndarray-cache.json"  # mlc_llm's name before: the same records, served as TENSOR_CACHE
SERVED_BASE = "mlc/"  # the folder the page is served the weights in (the page's server serves one folder level)
NEEDS = (f"a WebLLM model folder holds its TVM-compiled model library (one <model>-webgpu.wasm, built by mlc_llm's "
         f"compiler for the model) and its MLC weights ({CHAT_CONFIG}, {TENSOR_CACHE} or {OLD_TENSOR_CACHE}, the "
         "params_shard_*.bin it names, the tokenizer files the config names)")  # fmt: skip
MAX_TOKENIZER_FILES = 16
# A name the page is served a file by (in the job's folder): one plain part, not . or .., at most 200 characters
SERVED_NAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9._-]+")


def served_name(name: str, key: str) -> str:
    """`name` (what `key` names) where it can be served as it is named, else FolderError asking for a plain name."""
    if len(name) > 200 or not SERVED_NAME.fullmatch(name):
        raise FolderError(
            f"{key} names '{terminal_text(name)[:80]}': WebLLM fetches it by that name, so it must "
            "be a plain file name at the folder's top (letters, digits, '.', '_', '-'): move or rename it"
        )
    return name


@dataclass(frozen=True)
class MlcFolder:
    """A checked WebLLM folder: the files the page is served (their name under the model's URL -> the file), the
    model library's served name, and what every row says of the folder."""

    files: dict[str, Path]
    library: str
    facts: dict[str, Any]


def _fail(folder: Path, why: str) -> FolderError:
    return FolderError(f"--webllm-model {terminal_text(str(folder))}: {why}; {NEEDS}")


def _regular_size(path: Path, limit: int, what: str) -> int:
    """A regular file's size, at most `limit` (a FIFO, device or directory refused by name, not opened)."""
    refuse_special(path)
    try:
        size = os.stat(path).st_size
    except (OSError, ValueError) as exc:
        raise FolderError(
            f"{what} {terminal_text(path.name)} cannot be read ({terminal_text(str(exc))[:200]})"
        ) from exc
    if size > limit:
        raise FolderError(f"{what} {terminal_text(path.name)} is {size:,} bytes; at most {limit:,} are taken")
    return size


def _whole(config: dict[str, Any], key: str, high: int, where: str) -> int:
    value = config.get(key)
    if type(value) is not int or not 0 < value <= high:
        raise FolderError(f"{where}'s {key} must be a whole number from 1 to {high:,}, got {shown(value)}")
    return value


def _chat_config(folder: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """The chat config's facts and the tokenizer files it names (served beside it)."""
    config = read_config(folder, CHAT_CONFIG)
    facts = {"mlc_vocab_size": _whole(config, "vocab_size", MAX_VOCAB, CHAT_CONFIG),
             "mlc_context_window": _whole(config, "context_window_size", MAX_CONTEXT, CHAT_CONFIG)}  # fmt: skip
    for key in ("model_type", "quantization"):
        value = config.get(key)
        if not isinstance(value, str) or not 0 < len(value) <= 64:
            raise FolderError(f"{CHAT_CONFIG}'s {key} must be a name (1 to 64 characters), got {shown(value)}")
        facts[f"mlc_{key}"] = terminal_text(value)
    names = config.get("tokenizer_files", [])
    if not isinstance(names, list) or len(names) > MAX_TOKENIZER_FILES:
        raise FolderError(f"{CHAT_CONFIG}'s tokenizer_files must be a list of at most {MAX_TOKENIZER_FILES} file "
                          f"names, got {shown(names)}")  # fmt: skip
    files = {}
    for name in names:
        path = inside(folder, name, f"{CHAT_CONFIG}'s tokenizer_files")
        served_name(name, f"{CHAT_CONFIG}'s tokenizer_files")
        _regular_size(path, MAX_TOKENIZER_BYTES, "the tokenizer file")
        files[name] = path
    return facts, files


def _shards(folder: Path) -> tuple[str, dict[str, Path], int]:
    """(the manifest's name in the folder, every shard by its dataPath, their bytes): each a regular file of exactly
    the bytes its record states, all of them at most MLC_BYTES_BOUND."""
    manifest = next((n for n in (TENSOR_CACHE, OLD_TENSOR_CACHE) if (folder / n).exists() or (folder / n).is_symlink()),
                    None)  # fmt: skip
    if manifest is None:
        raise _fail(folder, f"no {TENSOR_CACHE} (nor {OLD_TENSOR_CACHE})")
    records = read_config(folder, manifest).get("records")
    if not isinstance(records, list) or not 0 < len(records) <= MAX_MLC_SHARDS:
        raise FolderError(
            f"{manifest}'s records must be a list of 1 to {MAX_MLC_SHARDS:,} shards, got {shown(records)}"
        )
    shards: dict[str, Path] = {}
    total = 0
    for index, record in enumerate(records):
        where = f"{manifest}'s records[{index}]"
        if not isinstance(record, dict):
            raise FolderError(f"{where} must be an object, got {shown(record)}")
        path = inside(folder, record.get("dataPath"), f"{where}.dataPath")
        served_name(record["dataPath"], f"{where}.dataPath")
        stated = record.get("nbytes")
        if type(stated) is not int or not 0 <= stated <= MLC_BYTES_BOUND:
            raise FolderError(f"{where}.nbytes must be a whole number of bytes up to {MLC_BYTES_BOUND:,}, got "
                              f"{shown(stated)}")  # fmt: skip
        size = _regular_size(path, MLC_BYTES_BOUND, "the params shard")
        if size != stated:
            raise FolderError(f"{where} states {stated:,} bytes; {terminal_text(path.name)} holds {size:,}")
        total += 0 if record["dataPath"] in shards else size
        shards[record["dataPath"]] = path
        if total > MLC_BYTES_BOUND:
            raise FolderError(f"{manifest}'s shards exceed {MLC_BYTES_BOUND:,} bytes together")
    return manifest, shards, total


def _library(folder: Path) -> Path:
    """The one .wasm at the folder's top (at most MAX_MLC_ENTRIES entries looked at)."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_MLC_ENTRIES:
                    raise FolderError(f"--webllm-model: more than {MAX_MLC_ENTRIES:,} entries; a model folder holds "
                                      "its library at the top of a few files")  # fmt: skip
                if entry.name.endswith(".wasm"):
                    found.append(folder / entry.name)
    except OSError as exc:
        raise _fail(folder, f"cannot be listed ({terminal_text(str(exc))[:200]})") from exc
    if len(found) != 1:
        listed = ", ".join(sorted(terminal_text(p.name)[:80] for p in found)[:4])
        raise _fail(folder, f"{len(found)} .wasm files at its top ({listed or 'none'}); one model library is taken")
    served_name(found[0].name, "the model library")
    _regular_size(found[0], MAX_MLC_LIBRARY_BYTES, "the model library")
    return found[0]


def read_mlc_folder(folder: Path) -> MlcFolder:
    """The folder checked (module docstring), or FolderError saying what is wrong and what to supply."""
    if not folder.is_dir():
        raise _fail(folder, "not a directory")
    if not (folder / CHAT_CONFIG).exists() and not (folder / CHAT_CONFIG).is_symlink():
        raise _fail(folder, f"no {CHAT_CONFIG}")
    facts, tokenizer = _chat_config(folder)
    manifest, shards, total = _shards(folder)
    library = _library(folder)
    files = {f"{SERVED_BASE}{CHAT_CONFIG}": folder / CHAT_CONFIG, f"{SERVED_BASE}{TENSOR_CACHE}": folder / manifest}
    files |= {f"{SERVED_BASE}{name}": path for name, path in {**tokenizer, **shards}.items()}
    files[library.name] = library
    facts |= {"mlc_tensor_cache": manifest, "mlc_shards": len(shards), "mlc_weight_bytes": total,
              "mlc_library": library.name, "mlc_library_bytes": library.stat().st_size}  # fmt: skip
    return MlcFolder(files, library.name, facts)
