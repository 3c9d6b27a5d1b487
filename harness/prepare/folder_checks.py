"""A model folder from elsewhere read as data, in the parent process before a run exists: its configs are
bounded before they are parsed, every file they name resolves (symlinks followed) inside the folder, every
size they give a model is a whole number within harness.core.bounds, and a wrong type names the key. A
genai_config.json naming `../../elsewhere/model.onnx` once ran that graph as the folder's model, and one with
10^9 layers was only stopped by --timeout. Anything quoted from a config goes through terminal_text.

Every file a folder names is read by one reader (read_file: inside the folder, then read_regular): a regular file,
its size bounded before a byte is read, opened so that it cannot block. A FIFO named config.json once hung the CLI
for good (its size is 0, then the read waits for a writer); a socket, a device or a directory is refused alike, and
check_folder_files refuses them by name before a run exists, so a file read only in a worker cannot hang it."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.core.bounds import (
    MAX_CONFIG_BYTES,
    MAX_CONTEXT,
    MAX_HEAD_SIZE,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_VOCAB,
    out_of_range,
)
from harness.core.terminal import terminal_text


class FolderError(ValueError):
    """A folder that looks like a layout but lacks the file it names, names one outside itself, or holds a
    config that cannot be used; the message says what is wrong and what is valid."""


# The config keys that size a model (config.json's transformers names, genai_config.json's), with their bound
# (pairs, not a dict keyed by bound: layers and heads share one value).
_SIZES = (
    (MAX_LAYERS, ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers",
                 "decoder_layers")),
    (MAX_HEADS, ("num_attention_heads", "num_key_value_heads", "n_head", "num_heads", "encoder_attention_heads",
                "decoder_attention_heads")),
    (MAX_HIDDEN, ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "encoder_ffn_dim",
                 "decoder_ffn_dim")),
    (MAX_HEAD_SIZE, ("head_dim", "head_size", "d_kv")),
    (MAX_VOCAB, ("vocab_size", "type_vocab_size")),
    (MAX_CONTEXT, ("max_position_embeddings", "n_positions", "n_ctx", "context_length", "max_length")),
)  # fmt: skip
SIZE_BOUNDS = {key: bound for bound, keys in _SIZES for key in keys}
# genai_config.json's keys that name a file onnxruntime-genai opens (filename, encoder_filename, tiktoken_file,
# library_path, tokenizer_dir, …): each must name one inside the folder
GENAI_FILE_KEY = re.compile(r"(^|_)(filename|file|path|dir)$", re.IGNORECASE)


def shown(value: Any) -> str:
    """A config's value as an error message quotes it: its JSON type and (at most 80 characters of) its text."""
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value))
    return f"{kind or 'number'} {terminal_text(json.dumps(value)[:80])}"


def inside(folder: Path, name: Any, key: str, base: Path | None = None) -> Path:
    """base/name (base: the folder unless given), where `name` is what `key` (the label of where it was read,
    made safe for a terminal) names: refused unless a non-empty string that resolves, symlinks followed, to a
    path inside the folder."""
    if not isinstance(name, str) or not name:
        raise FolderError(f"{key} must be a file name (a non-empty string), got {shown(name)}")
    root = folder.resolve()
    try:
        target = ((base or folder).resolve() / name).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
        raise FolderError(f"{key} names '{terminal_text(name)}', which cannot be resolved "
                          f"({terminal_text(str(exc))[:200]})") from exc  # fmt: skip
    if target == root or not target.is_relative_to(root):
        raise FolderError(
            f"{key} names '{terminal_text(name)}', which resolves to "
            f"{terminal_text(str(target))}, outside the model folder {root}: a folder's files must be inside it "
            "(a relative name, no '..' out of it, no symlink leading out)"
        )
    return (base or folder) / name


# The files of a model folder the harness or the libraries it calls read by name (harness.prepare.prompts's
# tokenizer, chat template and EOS sources; the configs; a processor's): each must be a regular file where present
FOLDER_FILES = ("config.json", "generation_config.json", "genai_config.json", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "special_tokens_map.json", "preprocessor_config.json")  # fmt: skip
# What a directory entry is when it is no regular file, as a refusal names it
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))  # fmt: skip
# O_NONBLOCK: opening a FIFO waits for a writer, and a regular file swapped for one after its check must not
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _kind(mode: int) -> str | None:
    """What a file of this st_mode is, when it is no regular file; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "no regular file")


def _refuse_kind(mode: int, shown: str) -> None:
    if (kind := _kind(mode)) is not None:
        raise FolderError(f"{shown} is {kind}, not a regular file: the harness reads a model folder's files only "
                          "as regular files (a FIFO or a device would block the read)")  # fmt: skip


def refuse_special(path: Path) -> None:
    """Refuse a path that is there but is no regular file (symlinks followed); one that is not there, or cannot
    be looked at, is left to whoever reads it (they name what is missing)."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return
    _refuse_kind(mode, terminal_text(str(path)))


def check_folder_files(folder: Path) -> None:
    """Refuse a folder whose config, tokenizer or template file (FOLDER_FILES) is a FIFO, a socket, a device or a
    directory: before a run exists, so a file that only a worker reads is refused by name, not waited on."""
    for name in FOLDER_FILES:
        refuse_special(folder / name)


def read_regular(path: Path, limit: int, bound: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (`bound`: the words before "at most N" in the
    refusal). Its kind and size are checked before it is opened and again on what was opened (a race to a FIFO
    is refused, not waited on: opened with O_NONBLOCK); at most limit + 1 bytes are read (a file that grows)."""
    shown = terminal_text(str(path))
    try:
        _refuse_kind(os.stat(path).st_mode, shown)  # before opening: opening a device can act (a tape rewinds)
        with os.fdopen(os.open(path, OPEN_FLAGS), "rb") as handle:
            found = os.fstat(handle.fileno())
            _refuse_kind(found.st_mode, shown)
            if found.st_size > limit:
                raise FolderError(f"{shown} is {found.st_size:,} bytes; {bound} at most {limit:,}")
            data = handle.read(limit + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        if isinstance(exc, FolderError):
            raise
        raise FolderError(f"cannot read {shown} ({terminal_text(str(exc))[:200]})") from exc
    if len(data) > limit:
        raise FolderError(f"{shown} grew past {limit:,} bytes as it was read; {bound} at most {limit:,}")
    return data


def read_file(folder: Path, name: str, limit: int, key: str, bound: str) -> bytes:
    """The one reader of a file a folder names: `name` resolved inside the folder (`key`: where the name was
    read, for the refusal), then read_regular."""
    return read_regular(inside(folder, name, key), limit, bound)


def read_config(folder: Path, name: str) -> dict[str, Any]:
    """A folder's JSON config, inside the folder and at most MAX_CONFIG_BYTES, holding a JSON object."""
    raw = read_file(folder, name, MAX_CONFIG_BYTES, f"the config file {name}", "a model folder's config takes")
    path = terminal_text(str(folder / name))
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8; RecursionError: nesting
        raise FolderError(f"cannot read {path} ({terminal_text(str(exc))[:200]})") from exc
    if not isinstance(data, dict):
        raise FolderError(f"{path} must hold a JSON object, got {shown(data)}")
    return data


def walk(config: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(dotted key, key, value) of every entry in a config, nested objects and arrays of objects included;
    iterative, so a deeply nested config cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        prefix, node = stack.pop()
        items = node.items() if isinstance(node, dict) else ((f"[{i}]", v) for i, v in enumerate(node))
        for key, value in items:
            dotted = f"{prefix}.{key}" if prefix and isinstance(node, dict) else f"{prefix}{key}"
            if isinstance(node, dict):
                yield dotted, key, value
            if isinstance(value, dict | list):
                stack.append((dotted, value))


def size_problem(config: dict[str, Any], name: str) -> str | None:
    """Why a config's model sizes cannot be used (a key's type, or a size past its bound), or None."""
    for dotted, key, value in walk(config):
        bound = SIZE_BOUNDS.get(key)
        if bound is None or value is None:
            continue
        values = value if isinstance(value, list) else [value]  # per-stage sizes (CLAP's audio encoder)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return f"{name} key '{terminal_text(dotted)}' must be an integer, got {shown(value)}"
        past = next((v for v in values if not 0 <= v <= bound), None)
        if past is not None:
            return out_of_range(f"{name} key '{terminal_text(dotted)}'", past, 0, bound)
    return None


def check_sizes(folder: Path, name: str) -> None:
    """Refuse a config whose model sizes are mistyped or past their bounds."""
    if problem := size_problem(read_config(folder, name), name):
        raise FolderError(problem)


def genai_files(folder: Path, config: dict[str, Any]) -> list[Path]:
    """Every file genai_config.json names (a string under a *filename / *_file / *_path / *_dir key), each
    checked to resolve inside the folder."""
    named = []
    for dotted, key, value in walk(config):
        if isinstance(key, str) and GENAI_FILE_KEY.search(key) and value is not None:
            for item in value if isinstance(value, list) else [value]:
                named.append(inside(folder, item, f"genai_config.json key '{terminal_text(dotted)}'"))
    return named


def genai_decoder(config: dict[str, Any]) -> dict[str, Any]:
    """genai_config.json's model.decoder, each level checked to be a JSON object."""
    model = config.get("model", {})
    if not isinstance(model, dict):
        raise FolderError(f"genai_config.json key 'model' must be a JSON object, got {shown(model)}")
    decoder = model.get("decoder", {})
    if not isinstance(decoder, dict):
        raise FolderError(f"genai_config.json key 'model.decoder' must be a JSON object, got {shown(decoder)}")
    return decoder


def check_external_data(graph: Path, folder: Path) -> None:
    """Refuse a graph whose external data locations resolve outside the folder (../x, an absolute path, a
    symlink leading out), or name a FIFO, a socket, a device or a directory: ONNX Runtime would read weights from
    wherever they point, and wait on a FIFO for good."""
    import onnx

    from harness.prepare.external import tensors

    try:
        model = onnx.load(str(graph), load_external_data=False)
    except Exception:  # not an ONNX file: check_onnx_file refuses it with the checker's reason
        return
    for tensor in tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((item.value for item in tensor.external_data if item.key == "location"), None)
            key = f"{graph.name}: tensor '{terminal_text(tensor.name)}': external data location"
            refuse_special(inside(folder, location, key, base=graph.parent))
