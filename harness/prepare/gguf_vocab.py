"""A GGUF's vocabulary as its own metadata gives it (tokenizer.ggml.tokens and token_type, read bounded by
harness.prepare.gguf_file): the text the page spells a prompt's ids as, and a generation's output text.

llama.cpp in the page (wllama 3.x) takes a prompt as text only, so web/page/runtimes/wllama.mjs's promptText spells
the job's ids with the GGUF's vocabulary and llama.cpp tokenizes that text again. `spell` is the same spelling in
Python (the same rules, token by token), so the harness chooses prompt ids that survive that round trip
(harness.prepare.gguf_model checks each with llama.cpp's own tokenizer) and a row's text reads as the page's would:
'llama' (SentencePiece) byte tokens <0xNN> as their byte and '▁' as a space; 'gpt2' (byte-level BPE) every character
of a regular token through GPT-2's byte alphabet; control and user-defined tokens as their text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.prepare.gguf_file import GgufError, header

TOKEN_KEYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"})
CONTROL, USER_DEFINED, BYTE = 3, 4, 6  # gguf.TokenType
SPACE = "\u2581"  # SentencePiece's space


@dataclass(frozen=True)
class Vocabulary:
    model: str  # tokenizer.ggml.model: llama | gpt2
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    bos: int | None
    add_bos: bool  # as the page reads it (add_bos_token, else SentencePiece's default: yes)
    space_prefix: bool  # add_space_prefix, else SentencePiece's default: yes


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is spelled with in a 'gpt2' vocabulary."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = list(kept)
    extra = 0
    for byte in range(256):
        if byte not in kept:
            kept.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for char, byte in zip(chars, kept, strict=True)}


@cache
def vocabulary(path: Path) -> Vocabulary:
    """A GGUF's vocabulary (its tokens' text and types, BOS and its spelling rules)."""
    metadata, _ = header(path, TOKEN_KEYS)
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise GgufError("tokenizer.ggml.tokens is missing or empty")
    types = metadata.get("tokenizer.ggml.token_type")
    types = types if isinstance(types, list) and len(types) == len(tokens) else [1] * len(tokens)
    model = metadata.get("tokenizer.ggml.model", b"").decode("utf-8", errors="replace")
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    prefix = metadata.get("tokenizer.ggml.add_space_prefix")
    return Vocabulary(model, tuple(t.decode("utf-8", errors="replace") if isinstance(t, bytes) else "" for t in tokens),
                      tuple(t if type(t) is int else 1 for t in types), bos if type(bos) is int else None,
                      add_bos if type(add_bos) is bool else model == "llama",
                      prefix if type(prefix) is bool else model == "llama")  # fmt: skip


def token_bytes(ids: list[int], vocab: Vocabulary) -> bytes:
    """The bytes a run of ids spells (module docstring); an id outside the vocabulary is a ValueError."""
    out = bytearray()
    table = _byte_of_char() if vocab.model == "gpt2" else None
    for token in ids:
        if not 0 <= token < len(vocab.tokens):
            raise ValueError(f"token id {token} is outside the GGUF's {len(vocab.tokens):,} tokens")
        piece, kind = vocab.tokens[token], vocab.types[token]
        if table is None and kind == BYTE and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(int(piece[3:5], 16))
        elif table is not None and kind not in (CONTROL, USER_DEFINED):
            out += bytes(table.get(char, 0x3F) for char in piece)
        else:
            out += (piece.replace(SPACE, " ") if table is None else piece).encode()
    return bytes(out)


def spell(ids: list[int], vocab: Vocabulary) -> str:
    """A prompt's ids as the page's text (promptText): a leading BOS left to llama.cpp where it adds one, and
    SentencePiece's added leading space taken off."""
    body = ids[1:] if vocab.add_bos and ids and ids[0] == vocab.bos else ids
    text = token_bytes(body, vocab).decode("utf-8", errors="replace")
    if vocab.model == "llama" and vocab.space_prefix and text.startswith(" "):
        text = text[1:]
    return text


def decode(path: Path, rows: list[list[int]]) -> list[str]:
    """Each batch row's generated ids as text, special tokens as their own text (what the model made)."""
    vocab = vocabulary(path)
    return [token_bytes(row, vocab).decode("utf-8", errors="replace") for row in rows]
