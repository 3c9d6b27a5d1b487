"""A GGUF given as the model (--model-path x.gguf): a file from elsewhere, read as data before anything loads it.

Its header is walked here, every count and length bounded (harness.core.bounds) before it is trusted: the magic and
version, the tensor and metadata key counts, each string's and array's length, each tensor's dimensions and type
(gguf-py's GGMLQuantizationType and GGML_QUANT_SIZES), and that every tensor's bytes lie inside the file. gguf-py's
own GGUFReader is not run on it: it loops over whatever item count an array declares (a lying count holds it for
hours) and spends 2.2 s building SmolLM2-135M's 49,152 tokens and merges, which this walk reads in milliseconds.

What a run takes from the header: the architecture (general.architecture, one of ARCHITECTURES: decoders both
node-llama-cpp's and wllama's llama.cpp builds run, tests/test_gguf_model_path.py finds each in both binaries), the
context length, the tokenizer (tokenizer.ggml.model, one the page can spell a prompt in: TOKENIZERS), BOS, EOS and
the vocabulary, and the tensors: their types (the weights' quantization: the type most of their elements are
stored in, e.g. Q4_1), the parameters, and the weight bytes a decode step reads. Text from the file is never shown
raw: a name it gives is quoted through harness.core.terminal.terminal_text, cut short.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from harness.core.bounds import (
    GGUF_BYTES_BOUND,
    MAX_CONTEXT,
    MAX_GGUF_ARRAY,
    MAX_GGUF_HEADER_BYTES,
    MAX_GGUF_KEYS,
    MAX_GGUF_STRING_BYTES,
    MAX_GGUF_TENSORS,
)
from harness.core.terminal import terminal_text

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what llama.cpp reads (version 1 had 32-bit counts and is gone from it)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9  # gguf.GGUFValueType
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DIM = 2**40  # one dimension's length
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT, unless general.alignment says otherwise
# decoders both llama.cpp builds here run (node-llama-cpp 3.22.1's, wllama 3.8.1's), whose vocabularies are of a
# kind the page spells prompts in; another architecture is refused by name before a run exists
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "granite", "olmo2", "smollm3",
                 "starcoder2", "stablelm")  # fmt: skip
TOKENIZERS = ("llama", "gpt2")  # SentencePiece and byte-level BPE: what web/page/runtimes/wllama.mjs spells
# the weights' quantization (the type most of their elements are stored in) → the harness precision it is a kind of
PRECISIONS = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "Q8_0": "int8", "Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4",
              "IQ4_NL": "q4", "IQ4_XS": "q4"}  # fmt: skip
NO_ONNX = "a GGUF file has no ONNX graph: it runs on llama.cpp (natively, and in the page through wllama)"
# a GGUF row's work where it is not counted (an inference case; attention whose K and V weights are fused)
NOT_COUNTED = "not counted on a graph: a GGUF has no ONNX graph (its weights: gguf_weight_bytes_per_token)"
# llama.cpp's KV cache type by default (type_k, type_v: f16), which none of node-llama-cpp (native/llamacpp/runner.mjs),
# llama-cpp-python (native/llamacpp_python_backend.py) or wllama (web/page/runtimes/wllama.mjs) is told otherwise here
KV_CACHE_ITEM_BYTES = 2
GGUF_COUNTED = ("harness.prepare.gguf_file: from the GGUF that ran, the weights a decode step reads by their stored "
                "types and shapes (gguf_weight_bytes_per_token), and llama.cpp's KV cache (f16, its default) at the "
                "steps' mean depth from its attn_k and attn_v widths; no FLOPs: no graph to count them on")  # fmt: skip


class GgufError(ValueError):
    """A GGUF that is refused; the message says why (the file's own text quoted safely)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str  # gguf.GGMLQuantizationType's name
    shape: tuple[int, ...]
    elements: int
    nbytes: int


@dataclass(frozen=True)
class GgufFacts:
    """What a run takes from a GGUF's header (module docstring)."""

    size: int
    version: int
    architecture: str
    context_length: int
    vocab_size: int
    tokenizer: str
    bos: int | None
    eos: int | None
    add_bos: bool
    file_type: str | None  # general.file_type's name (gguf.LlamaFileType), where the file states one
    tensors: tuple[Tensor, ...]

    @property
    def tensor_types(self) -> dict[str, int]:
        return dict(Counter(t.type for t in self.tensors).most_common())

    @property
    def quantization(self) -> str:
        """The type most of the weights' elements are stored in (the 2-D tensors but the token embeddings, which
        quantizers keep apart; the embeddings' own where there is nothing else)."""
        weights = [t for t in self.tensors if len(t.shape) > 1 and t.name != "token_embd.weight"]
        weights = weights or [t for t in self.tensors if len(t.shape) > 1] or list(self.tensors)
        by_type: Counter[str] = Counter()
        for tensor in weights:
            by_type[tensor.type] += tensor.elements
        return by_type.most_common(1)[0][0]

    @property
    def precision(self) -> str | None:
        """The harness precision the quantization is a kind of (PRECISIONS), or None."""
        return PRECISIONS.get(self.quantization)

    @property
    def parameters(self) -> int:
        return sum(t.elements for t in self.tensors)

    @property
    def weight_bytes_per_token(self) -> int:
        """The weight bytes one decode step reads: every tensor but the token embeddings, of which one row is read,
        unless the output projection is tied to them (no output.weight) and reads them whole. No KV cache."""
        total = sum(t.nbytes for t in self.tensors)
        embeddings = next((t for t in self.tensors if t.name == "token_embd.weight"), None)
        if embeddings is None:
            return total
        row = embeddings.nbytes // max(embeddings.shape[-1], 1)
        tied = not any(t.name == "output.weight" for t in self.tensors)
        return total + row if tied else total - embeddings.nbytes + row

    def row_facts(self) -> dict[str, Any]:
        """What every row of the model says of the file (beside its name and SHA-256)."""
        return {"gguf_architecture": self.architecture, "gguf_quantization": self.quantization,
                "gguf_tensor_types": self.tensor_types, "gguf_file_type_name": self.file_type,
                "gguf_version": self.version, "gguf_context_length": self.context_length,
                "gguf_vocab_size": self.vocab_size, "gguf_tokenizer": self.tokenizer,
                "gguf_weight_bytes_per_token": self.weight_bytes_per_token,
                "gguf_weight_bytes_per_token_counted": "from the tensors' types and shapes: every tensor but the "
                "token embeddings, of which one row (all of them where the output projection is tied to them); "
                "no KV cache"}  # fmt: skip


def shown(raw: bytes | str) -> str:
    """Text from the file as a message may quote it: decoded, without control characters, cut short."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return repr(terminal_text(text)[:80])


class _Header:
    """A cursor over a mapped GGUF's header: every read bounded by the file and MAX_GGUF_HEADER_BYTES."""

    def __init__(self, data: Any, size: int) -> None:
        self.data, self.end, self.at = data, min(size, MAX_GGUF_HEADER_BYTES), 0

    def take(self, count: int, what: str) -> bytes:
        self.skip(count, what)
        return bytes(self.data[self.at - count : self.at])

    def skip(self, count: int, what: str) -> None:
        if count < 0 or self.at + count > self.end:
            limit = "the file" if self.end < MAX_GGUF_HEADER_BYTES else f"{MAX_GGUF_HEADER_BYTES:,} bytes of header"
            raise GgufError(f"its header ends inside {what} (byte {self.at:,} + {count:,} is past {limit}): a "
                            "count or length in it is larger than what the file holds")  # fmt: skip
        self.at += count

    def unpack(self, form: str, what: str) -> Any:
        return struct.unpack(form, self.take(struct.calcsize(form), what))[0]

    def string(self, what: str, keep: bool = True) -> bytes:
        length = self.unpack("<Q", what)
        if length > MAX_GGUF_STRING_BYTES:
            raise GgufError(f"{what} is {length:,} bytes long; a string of a GGUF takes at most "
                            f"{MAX_GGUF_STRING_BYTES:,} (MAX_GGUF_STRING_BYTES)")  # fmt: skip
        if keep:
            return self.take(length, what)
        self.skip(length, what)
        return b""


def _value(header: _Header, kind: int, what: str, keep: bool, depth: int = 0) -> Any:
    """One metadata value: a scalar, a string (bytes) or an array (its items where `keep`, else its item type and
    count). Every length bounded before it is read."""
    if kind in SCALARS:
        return header.unpack(SCALARS[kind], what)
    if kind == STRING:
        return header.string(what)
    if kind != ARRAY:
        raise GgufError(f"{what} has value type {kind}, which GGUF does not define")
    item, count = header.unpack("<I", what), header.unpack("<Q", what)
    if count > MAX_GGUF_ARRAY:
        raise GgufError(f"{what} declares {count:,} items; an array of a GGUF takes at most {MAX_GGUF_ARRAY:,} "
                        "(MAX_GGUF_ARRAY)")  # fmt: skip
    if item == ARRAY and depth > 0:
        raise GgufError(f"{what} nests arrays more than two deep, which no llama.cpp key does")
    if item in SCALARS and not keep:  # skipped whole: its bytes must still be in the header
        header.take(struct.calcsize(SCALARS[item]) * count, what)
        return (item, count)
    if not keep:  # walked, each item bounded, nothing kept
        for _ in range(count):
            if item == STRING:
                header.string(what, keep=False)
            else:
                _value(header, item, what, keep, depth + 1)
        return (item, count)
    return [_value(header, item, what, keep, depth + 1) for _ in range(count)]


def _metadata(header: _Header, keep: frozenset[str]) -> dict[str, Any]:
    """The header's key/value pairs: arrays' items for the keys in `keep`, every other array as (type, count)."""
    magic = header.take(4, "the magic")
    if magic != MAGIC:
        raise GgufError("it does not start with the GGUF magic: not a GGUF file")
    version = header.unpack("<I", "the version")
    if version not in VERSIONS:
        raise GgufError(f"GGUF version {version}; llama.cpp reads versions {', '.join(map(str, VERSIONS))}")
    tensors, keys = header.unpack("<Q", "the tensor count"), header.unpack("<Q", "the key count")
    if tensors > MAX_GGUF_TENSORS or keys > MAX_GGUF_KEYS:
        raise GgufError(f"its header declares {tensors:,} tensors and {keys:,} metadata keys; a GGUF here takes "
                        f"at most {MAX_GGUF_TENSORS:,} (MAX_GGUF_TENSORS) and {MAX_GGUF_KEYS:,} "
                        "(MAX_GGUF_KEYS)")  # fmt: skip
    found: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": tensors}
    for index in range(keys):
        raw = header.string(f"metadata key {index}")
        key = raw.decode("utf-8", errors="replace")
        if key in found:
            raise GgufError(f"metadata key {shown(raw)} appears twice")
        found[key] = _value(header, header.unpack("<I", f"key {shown(raw)}'s type"), f"key {shown(raw)}", key in keep)
    return found


def _tensor(header: _Header) -> tuple[Tensor, int]:
    """One tensor info: (the tensor, its data's offset from the data section)."""
    import gguf

    raw = header.string("a tensor's name")
    name = raw.decode("utf-8", errors="replace")
    dims = header.unpack("<I", f"tensor {shown(raw)}'s dimension count")
    if not 1 <= dims <= MAX_DIMS:
        raise GgufError(f"tensor {shown(raw)} has {dims:,} dimensions; ggml's tensors have 1 to {MAX_DIMS}")
    shape = tuple(header.unpack("<Q", f"tensor {shown(raw)}'s shape") for _ in range(dims))
    kind = header.unpack("<I", f"tensor {shown(raw)}'s type")
    offset = header.unpack("<Q", f"tensor {shown(raw)}'s offset")
    if any(not 0 < d <= MAX_DIM for d in shape):
        raise GgufError(f"tensor {shown(raw)} has shape {list(shape)}: each dimension takes 1 to {MAX_DIM:,}")
    try:
        qtype = gguf.GGMLQuantizationType(kind)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise GgufError(f"tensor {shown(raw)} has type {kind}, which gguf-py does not name") from None
    elements = 1
    for d in shape:
        elements *= d
    if shape[0] % block:
        raise GgufError(f"tensor {shown(raw)}'s rows of {shape[0]:,} do not divide into {qtype.name}'s blocks "
                        f"of {block}")  # fmt: skip
    return Tensor(name, qtype.name, shape, elements, elements // block * size), offset


def _tensors(header: _Header, count: int, alignment: int, size: int) -> tuple[Tensor, ...]:
    """Every tensor info, each tensor's bytes checked to lie inside the file (a header naming more tensors or bytes
    than the file holds is refused here, not met by llama.cpp)."""
    infos = [_tensor(header) for _ in range(count)]
    data = -(-header.at // alignment) * alignment
    names: set[str] = set()
    for tensor, offset in infos:
        if tensor.name in names:
            raise GgufError(f"tensor {shown(tensor.name)} appears twice")
        names.add(tensor.name)
        if offset % alignment:
            raise GgufError(f"tensor {shown(tensor.name)}'s data is not aligned to {alignment} bytes")
        if data + offset + tensor.nbytes > size:
            raise GgufError(f"tensor {shown(tensor.name)} ends at byte {data + offset + tensor.nbytes:,}, past the "
                            f"file's {size:,}: the header names more tensors or bytes than the file holds")  # fmt: skip
    return tuple(tensor for tensor, _ in infos)


@cache
def _walk(path: Path, size: int, mtime_ns: int, keep: frozenset[str]) -> tuple[dict[str, Any], tuple[Tensor, ...]]:
    """The header of the file as it is (its size and modification time in the cache key): metadata and tensors."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise GgufError("it is not a regular file")
        with mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ) as data:
            header = _Header(data, size)
            metadata = _metadata(header, keep)
            alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
            if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
                raise GgufError(f"general.alignment {shown(str(alignment))} is not a power of two")
            return metadata, _tensors(header, metadata["GGUF.tensor_count"], alignment, size)
    finally:
        os.close(descriptor)


def header(path: Path, keep: frozenset[str] = frozenset()) -> tuple[dict[str, Any], tuple[Tensor, ...]]:
    """A GGUF's metadata and tensors, bounded (GgufError says what is wrong); `keep`: the array keys read whole."""
    try:
        found = os.stat(path)
    except OSError as exc:
        raise GgufError(f"cannot read it ({terminal_text(str(exc))[:200]})") from exc
    if not stat.S_ISREG(found.st_mode):
        raise GgufError("it is not a regular file (a FIFO or a device would block the read)")
    if found.st_size > GGUF_BYTES_BOUND:
        raise GgufError(f"it is {found.st_size:,} bytes; a GGUF here takes at most {GGUF_BYTES_BOUND:,} "
                        "(GGUF_BYTES_BOUND)")  # fmt: skip
    try:
        return _walk(path.resolve(), found.st_size, found.st_mtime_ns, keep)
    except (OSError, ValueError) as exc:  # mmap of an empty file, a file that changed under the walk
        if isinstance(exc, GgufError):
            raise
        raise GgufError(f"cannot read it ({terminal_text(str(exc))[:200]})") from exc


def read_gguf(path: Path) -> GgufFacts:
    """The facts of a GGUF a run takes (module docstring), or GgufError saying why it is refused."""
    metadata, tensors = header(path)
    architecture = _text(metadata, "general.architecture")
    if architecture not in ARCHITECTURES:
        raise GgufError(f"its architecture {shown(architecture)} is not one this harness runs on llama.cpp natively "
                        f"and in the page: {', '.join(ARCHITECTURES)}")  # fmt: skip
    if isinstance(metadata.get("split.count"), int) and metadata["split.count"] > 1:
        raise GgufError("it is one part of a split GGUF (split.count > 1); give a GGUF in one file")
    tokenizer = _text(metadata, "tokenizer.ggml.model")
    if tokenizer not in TOKENIZERS:
        raise GgufError(f"its tokenizer {shown(tokenizer)} is not one the page spells a prompt in: "
                        f"{', '.join(TOKENIZERS)}")  # fmt: skip
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not (isinstance(tokens, tuple) and tokens[0] == STRING and tokens[1] > 0):
        raise GgufError("tokenizer.ggml.tokens is missing or is no array of strings: its vocabulary is unknown")
    vocab = tokens[1]
    context = metadata.get(f"{architecture}.context_length")
    if type(context) is not int or not 0 < context <= MAX_CONTEXT:
        raise GgufError(f"{architecture}.context_length must be a whole number from 1 to {MAX_CONTEXT:,}")
    if not any(t.name == "token_embd.weight" for t in tensors):
        raise GgufError("it has no token_embd.weight tensor: no decoder llama.cpp runs")
    return GgufFacts(size=os.stat(path).st_size, version=metadata["GGUF.version"], architecture=architecture,
                     context_length=context, vocab_size=vocab, tokenizer=tokenizer,
                     bos=_token(metadata, "tokenizer.ggml.bos_token_id", vocab),
                     eos=_token(metadata, "tokenizer.ggml.eos_token_id", vocab),
                     add_bos=metadata.get("tokenizer.ggml.add_bos_token") is True, file_type=_file_type(metadata),
                     tensors=tensors)  # fmt: skip


def _text(metadata: dict[str, Any], key: str) -> str:
    value = metadata.get(key)
    if not isinstance(value, bytes):
        raise GgufError(f"{key} is missing or is no string")
    return value.decode("utf-8", errors="replace")


def _token(metadata: dict[str, Any], key: str, vocab: int) -> int | None:
    """A token id the file states, inside its vocabulary; None where it states none."""
    value = metadata.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < vocab:
        raise GgufError(f"{key} {shown(str(value))} is not an id of its {vocab:,} tokens")
    return value


def _file_type(metadata: dict[str, Any]) -> str | None:
    import gguf

    value = metadata.get("general.file_type")
    if type(value) is not int:
        return None
    try:
        return gguf.LlamaFileType(value).name
    except ValueError:
        return f"unknown ({value})"


def gguf_precision(path: Path) -> str | None:
    """The harness precision a GGUF's weights are a kind of (PRECISIONS); None where it cannot be read or names
    none (refused by name where the model path is checked)."""
    try:
        return read_gguf(path).precision
    except GgufError:
        return None


def kv_bytes_per_position(tensors: tuple[Tensor, ...]) -> int | None:
    """The bytes llama.cpp's KV cache holds per cached position: each layer's K and V widths (blk.N.attn_k.weight's
    and attn_v.weight's output dimension, ggml's second) at KV_CACHE_ITEM_BYTES; None where K and V are fused."""
    keys = [t for t in tensors if t.name.endswith(".attn_k.weight")]
    values = [t for t in tensors if t.name.endswith(".attn_v.weight")]
    if not keys or len(keys) != len(values) or any(len(t.shape) != 2 for t in keys + values):
        return None
    return sum(t.shape[1] for t in keys + values) * KV_CACHE_ITEM_BYTES


def gguf_generation_work(path: Path, batch: int, prompt: int, depth: int,
                         new_tokens: int) -> tuple[dict[str, float | None], dict[str, Any]]:  # fmt: skip
    """(work fields, facts) of a generation on the GGUF that ran: per decode token its weights' bytes (read once per
    step for the batch) and the KV cache at the steps' mean depth (harness.core.graph_cost.mean_positions), as
    harness.core.graph_cost.generation_work counts an ONNX graph's; FLOPs NULL. GgufError where the file is refused."""
    from harness.core.graph_cost import mean_positions

    facts = read_gguf(path)
    per_position = kv_bytes_per_position(facts.tensors)
    if per_position is None:
        return {}, {"work_counted": f"{NOT_COUNTED}; no separate attn_k and attn_v tensors give its KV cache's width"}
    positions = mean_positions(prompt, depth, new_tokens)
    kv = batch * positions * per_position
    fields = {"bytes_per_token": (facts.weight_bytes_per_token + kv) / batch, "flops_per_token": None,
              "prefill_flops_per_token": None}  # fmt: skip
    return fields, {"kv_bytes_per_step": kv, "kv_mean_positions": positions, "work_counted": GGUF_COUNTED,
                    "gguf_weight_bytes_per_token": facts.weight_bytes_per_token}  # fmt: skip
