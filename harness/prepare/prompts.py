"""One prompt per model, whatever its layout, and text in and out through the model folder's tokenizer.

A drawn prompt (no --prompt given) depends on the model, never on the folder it came in: its ids are drawn
from the regular tokens (the tokenizer's added and special ids excluded) below the embedding table's rows, with
a seed from that row count, so an HF folder, the harness's export of it, the onnxruntime-genai builder's folder
and a transformers.js folder of one model start from the same ids. A model folder's tokenizer.json (read through
the `tokenizers` library), its chat template (rendered in jinja2's sandbox) and its EOS ids are data from
elsewhere: each file inside the folder, bounded before it is read (harness.core.bounds).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.bounds import (
    MAX_CONFIG_BYTES,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_IDS,
    MAX_TEMPLATE_CHARS,
    MAX_TOKENIZER_BYTES,
    MAX_VOCAB,
)
from harness.core.terminal import terminal_text
from harness.prepare.folder_checks import FolderError, inside

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # transformers 5 saves the template beside tokenizer_config.json
# where a folder says its EOS ids, first found wins: generation's own, the model's, onnxruntime-genai's
EOS_SOURCES = (("generation_config.json", ("eos_token_id",)), ("config.json", ("eos_token_id",)),
               ("genai_config.json", ("model", "eos_token_id")))  # fmt: skip


class PromptError(ValueError):
    """A prompt that cannot be made for this model; the message says what was wrong and what is valid."""


@dataclass(frozen=True)
class Vocabulary:
    """What a model's prompt ids are drawn from: the embedding table's rows (what every layout of the model
    agrees on: config.json's vocab_size, the graph's Gather table) and the tokenizer's size and special ids
    where the folder has one."""

    rows: int
    tokens: int | None = None  # the tokenizer's ids, added ones included
    special: tuple[int, ...] = ()  # the tokenizer's added and special ids: never drawn

    def regular_ids(self) -> np.ndarray:
        top = min(self.rows, self.tokens or self.rows)
        ids = np.setdiff1d(np.arange(top, dtype=np.int64), np.asarray(self.special, dtype=np.int64))
        if ids.size == 0:
            raise PromptError(f"the vocabulary of {self.rows} rows has no regular token to draw a prompt from")
        return ids


def random_prompt(vocabulary: Vocabulary, batch: int, seq: int) -> np.ndarray:
    """[batch, seq] ids from the vocabulary's regular tokens; each row seeded by the table's rows, the length and
    the row's index, so a batch's first row is the prompt of batch 1."""
    ids = vocabulary.regular_ids()
    rows = []
    for row in range(batch):
        seed = int(hashlib.sha256(f"prompt|{vocabulary.rows}|{seq}|{row}".encode()).hexdigest()[:8], 16)
        rows.append(ids[np.random.default_rng(seed).integers(0, ids.size, size=seq)])
    return np.stack(rows).astype(np.int64)


def tokenizer_folder(model_path: Path | None) -> Path | None:
    """The folder whose tokenizer serves a model: an HF folder itself, a graph's model folder (a genai folder,
    transformers.js's onnx/ parent); None for a built-in spec or a lone file."""
    if model_path is None:
        return None
    if model_path.is_dir():
        return model_path
    from harness.prepare.folders import folder_root

    return folder_root(model_path)


def _bounded_text(folder: Path, name: str, limit: int) -> str | None:
    """A folder's file as text, inside the folder and at most `limit` bytes; None where the folder has none."""
    if not ((folder / name).is_file() or (folder / name).is_symlink()):
        return None
    try:
        path = inside(folder, name, f"the tokenizer file {name}")
    except FolderError as exc:  # a link out of the folder
        raise PromptError(str(exc)) from exc
    size = path.stat().st_size
    if size > limit:
        raise PromptError(f"{terminal_text(str(path))} is {size:,} bytes; the harness reads at most {limit:,}")
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"cannot read {terminal_text(str(path))} ({terminal_text(str(exc))[:200]})") from exc


def _json_file(folder: Path, name: str) -> dict[str, Any]:
    text = _bounded_text(folder, name, MAX_CONFIG_BYTES)
    try:
        data = json.loads(text) if text is not None else {}
    except (ValueError, RecursionError) as exc:
        why = terminal_text(str(exc))[:200]
        raise PromptError(f"{name} in {terminal_text(str(folder))} is not JSON ({why})") from None
    return data if isinstance(data, dict) else {}


@cache
def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer.json as a `tokenizers.Tokenizer`, or None where the folder has none."""
    from tokenizers import Tokenizer

    text = _bounded_text(folder, TOKENIZER_FILE, MAX_TOKENIZER_BYTES)
    if text is None:
        return None
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # the library's own words: a file it cannot parse
        raise PromptError(f"{TOKENIZER_FILE} in {terminal_text(str(folder))} cannot be read by the tokenizers "
                          f"library ({terminal_text(str(exc))[:200]})") from exc  # fmt: skip


def vocabulary(folder: Path | None, rows: int) -> Vocabulary:
    """A model's vocabulary: the table's rows, with its folder's tokenizer where there is one."""
    tokenizer = load_tokenizer(folder) if folder is not None else None
    if tokenizer is None:
        return Vocabulary(rows)
    special = tuple(sorted(tokenizer.get_added_tokens_decoder()))
    return Vocabulary(rows, tokenizer.get_vocab_size(with_added_tokens=True), special)


def encode(folder: Path | None, text: str, chat: bool) -> list[int]:
    """--prompt's ids: the text (the folder's chat template applied first with --chat) through tokenizer.json."""
    tokenizer = load_tokenizer(folder) if folder is not None else None
    if tokenizer is None:
        where = "this model has no folder" if folder is None else f"{terminal_text(str(folder))} has none"
        raise PromptError(f"--prompt needs the model folder's {TOKENIZER_FILE} to tokenize the text, and {where}; "
                          "give the ids with --prompt-ids instead")  # fmt: skip
    if chat:
        assert folder is not None
        return tokenizer.encode(chat_text(folder, text), add_special_tokens=False).ids
    return tokenizer.encode(text).ids


def chat_text(folder: Path, text: str) -> str:
    """The prompt as the folder's chat template renders one user message, with the generation prompt."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    config = _json_file(folder, TOKENIZER_CONFIG)
    template = _bounded_text(folder, CHAT_TEMPLATE_FILE, MAX_TEMPLATE_CHARS) or config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)  # fmt: skip
    if not isinstance(template, str) or not template:
        raise PromptError(f"--chat needs a chat template ({CHAT_TEMPLATE_FILE}, or {TOKENIZER_CONFIG}'s "
                          f"chat_template) and {terminal_text(str(folder))} has none; drop --chat")  # fmt: skip
    if len(template) > MAX_TEMPLATE_CHARS:
        raise PromptError(f"the chat template is {len(template):,} characters; the harness renders at most "
                          f"{MAX_TEMPLATE_CHARS:,}")  # fmt: skip
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _template_error
    try:
        chunks = environment.from_string(template).generate(
            messages=[{"role": "user", "content": text}], add_generation_prompt=True,
            bos_token=_token_text(config.get("bos_token")), eos_token=_token_text(config.get("eos_token")),
        )  # fmt: skip
        rendered, size = [], 0
        for chunk in chunks:  # streamed, so a template that writes without end stops at the prompt's bound
            rendered.append(chunk)
            size += len(chunk)
            if size > MAX_PROMPT_CHARS + len(text):
                raise PromptError(f"it wrote over {MAX_PROMPT_CHARS:,} characters around a prompt of {len(text):,}")
        return "".join(rendered)
    except (TemplateError, PromptError, RecursionError) as exc:
        raise PromptError(f"the folder's chat template failed to render: {terminal_text(str(exc))[:200]}") from exc


def _template_error(message: str) -> None:
    raise PromptError(str(message))


def _token_text(token: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an object with its content."""
    content = token.get("content") if isinstance(token, dict) else token
    return content if isinstance(content, str) else ""


def decode(folder: Path | None, rows: list[list[int]]) -> list[str] | None:
    """Each batch row's token ids as the folder's tokenizer writes them (special tokens kept: what the model
    made), the tokenizer read once; None where the model has no tokenizer."""
    tokenizer = load_tokenizer(folder) if folder is not None else None
    return None if tokenizer is None else [tokenizer.decode(ids, skip_special_tokens=False) for ids in rows]


def eos_ids(folder: Path | None) -> tuple[int, ...]:
    """The ids that end a generation, as the folder says (generation_config.json, config.json,
    genai_config.json, then the tokenizer's eos_token); () where it says none."""
    if folder is None:
        return ()
    for name, keys in EOS_SOURCES:
        value: Any = _json_file(folder, name)
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        found = value if isinstance(value, list) else [value]
        ids = tuple(v for v in found if isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        if ids:
            return ids
    tokenizer = load_tokenizer(folder)
    eos = _token_text(_json_file(folder, TOKENIZER_CONFIG).get("eos_token"))
    token = tokenizer.token_to_id(eos) if tokenizer is not None and eos else None
    return (token,) if token is not None else ()


def table_rows(spec: Any) -> int | None:
    """The rows of a model's token table: the graph's (the Gather input_ids index), an HF folder's config.json
    vocab_size, a built-in spec's; None where none says."""
    if spec.is_onnx_file:
        from harness.prepare.graph_tables import index_tables

        return index_tables(spec.local_path).get("input_ids")
    config = spec.config
    if spec.local_path is not None:
        from harness.prepare.folder_checks import read_config

        config = read_config(spec.local_path, "config.json")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    rows = text.get("vocab_size")
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None


def given_prompt(spec: Any, text: str | None, chat: bool, ids: list[Any] | None) -> tuple[int, ...] | None:
    """The prompt a run gives a model (--prompt text, with --chat its chat template; or --prompt-ids), checked:
    bounded, each id inside the model's vocabulary; None when the run gives none (a prompt is drawn)."""
    if text is not None and ids is not None:
        raise PromptError("--prompt and --prompt-ids each give the prompt; give one of them")
    if chat and text is None:
        raise PromptError("--chat applies the folder's chat template to --prompt's text; give --prompt too")
    if text is None and ids is None:
        return None
    if text is not None:
        if not 0 < len(text) <= MAX_PROMPT_CHARS:
            raise PromptError(f"--prompt takes 1 to {MAX_PROMPT_CHARS:,} characters (got {len(text):,})")
        found = encode(tokenizer_folder(spec.local_path), text, chat)
    elif len(ids or []) > MAX_PROMPT_IDS:
        raise PromptError(f"--prompt-ids takes 1 to {MAX_PROMPT_IDS:,} token ids (got {len(ids or []):,})")
    else:
        found = _ids(ids or [])
    if not 0 < len(found) <= MAX_PROMPT_IDS:
        raise PromptError(f"the prompt is {len(found):,} tokens; a prompt takes 1 to {MAX_PROMPT_IDS:,}")
    try:
        rows = table_rows(spec)
    except FolderError as exc:
        raise PromptError(str(exc)) from exc
    folder = tokenizer_folder(spec.local_path)
    tokenizer = load_tokenizer(folder) if folder is not None else None
    size = min(v for v in (rows, tokenizer and tokenizer.get_vocab_size(with_added_tokens=True), MAX_VOCAB) if v)
    if outside := [i for i in found if i >= size]:
        raise PromptError(f"--prompt-ids: {', '.join(map(str, outside[:3]))} is outside {spec.name}'s vocabulary "
                          f"(ids 0 to {size - 1:,})")  # fmt: skip
    return tuple(found)


def _ids(values: list[Any]) -> list[int]:
    """--prompt-ids' values as integers >= 0 (the command line gives strings, the API integers)."""
    try:
        found = [int(v) for v in values]
        if any(isinstance(v, (bool, float)) for v in values):
            raise ValueError
    except (TypeError, ValueError):
        shown = terminal_text(", ".join(map(str, values[:3])))[:80]
        raise PromptError(f"--prompt-ids takes comma-separated token ids (integers >= 0), got {shown}") from None
    if negative := [v for v in found if v < 0]:
        raise PromptError(f"--prompt-ids takes token ids >= 0 (got {negative[0]})")
    return found


def model_eos_ids(spec: Any) -> tuple[int, ...]:
    """The EOS ids of a model: its folder's (eos_ids), else a built-in spec's config."""
    found = eos_ids(tokenizer_folder(spec.local_path))
    if found or spec.local_path is not None:
        return found
    value = spec.config.get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def text_fields(spec: Any, input_ids: np.ndarray, generated: list[list[int]] | None, eos: tuple[int, ...],
                asked: bool, details: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A generate row's prompt ids, its output texts (every batch row's tokens through the model's tokenizer;
    output_text: the first's, as stores before v12 hold it) and its EOS policy (`eos`: the ids it stopped at, ()
    when it ran to --new-tokens; `asked`: --stop-at-eos); why a text is NULL, and a policy asked of a model that
    states no EOS id, go to `details`."""
    try:
        texts = decode(tokenizer_folder(spec.local_path), generated) if generated else None
        why = "no tokens were kept" if not generated else f"the model has no {TOKENIZER_FILE}"
    except PromptError as exc:  # a tokenizer that cannot be read costs the row its text, not its measurement
        texts, why = None, str(exc)
    if texts is None:
        details["output_text"] = f"not decoded: {why}"
    if asked and not eos:
        details["eos_policy"] = "--stop-at-eos asked, but the model states no EOS id: ran to --new-tokens"
    else:
        details["eos_policy"] = f"stop at EOS ({', '.join(map(str, eos))})" if eos else "EOS ignored"
    return {"prompt_ids": np.asarray(input_ids).astype(int).tolist(), "output_text": texts[0] if texts else None,
            "output_texts": texts, "stop_at_eos": bool(eos)}  # fmt: skip
