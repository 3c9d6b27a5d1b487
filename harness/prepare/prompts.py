"""One prompt per model, whatever its layout, and text in and out through the model folder's tokenizer.

A drawn prompt (no --prompt given) depends on the model, never on the folder it came in: its ids are drawn
from the regular tokens (the tokenizer's added and special ids excluded) below the embedding table's rows, with
a seed from that row count, so an HF folder, the harness's export of it, the onnxruntime-genai builder's folder
and a transformers.js folder of one model start from the same ids. A model folder's tokenizer.json (read through
the `tokenizers` library), its chat template and its EOS ids are data from elsewhere: each file inside the folder,
bounded before it is read (harness.core.bounds). The template is a program too: rendered in jinja2's sandbox, in
a process of its own held to a deadline and an address space, its output bounded, so a template that loops, divides
by zero or asks for gigabytes is a PromptError, not a hang, a traceback or a machine's memory. Every call into the
tokenizers library is guarded (_tokenizer_call): a tokenizer.json it cannot run (a regex that exhausts Oniguruma's
retry limit panics the library, and pyo3's PanicException is a BaseException) is a PromptError naming the folder's
tokenizer. EOS ids outside the model's vocabulary are left out, and the row's EOS policy says which.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from harness.core.bounds import (
    MAX_CONFIG_BYTES,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_IDS,
    MAX_TEMPLATE_CHARS,
    MAX_TEMPLATE_MEMORY,
    MAX_TEMPLATE_SECONDS,
    MAX_TOKEN_TEXT_CHARS,
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
    if model_path is None or model_path.suffix == ".gguf":  # a GGUF's vocabulary: its own (harness.prepare.gguf_vocab)
        return None
    if model_path.is_dir():
        return model_path
    from harness.prepare.folders import folder_root

    return folder_root(model_path)


def _bounded_text(folder: Path, name: str, limit: int) -> str | None:
    """A folder's file as text, inside the folder and read by the one reader of a folder's files (a regular file
    of at most `limit` bytes, never waited on: harness.prepare.folder_checks.read_regular); None where the folder
    has none. Anything else by the name (a FIFO, a directory, a dangling link) is refused, not passed over."""
    from harness.prepare.folder_checks import read_regular

    if not ((folder / name).exists() or (folder / name).is_symlink()):
        return None
    try:
        path = inside(folder, name, f"the tokenizer file {name}")
        return read_regular(path, limit, "the harness reads").decode("utf-8")
    except FolderError as exc:  # a link out of the folder, no regular file, too big, unreadable
        raise PromptError(str(exc)) from exc
    except UnicodeDecodeError as exc:
        shown = terminal_text(str(folder / name))
        raise PromptError(f"cannot read {shown} ({terminal_text(str(exc))[:200]})") from exc


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
    return _tokenizer_call(folder, "be read by the tokenizers library", Tokenizer.from_str, text)


_Answer = TypeVar("_Answer")


def _tokenizer_call(folder: Path, what: str, call: Callable[..., _Answer], *args: Any, **kwargs: Any) -> _Answer:
    """One call into the tokenizers library with a folder's tokenizer.json: whatever the library raises, a panic
    included (pyo3's PanicException derives from BaseException, so `except Exception` misses it), is a PromptError
    in the library's own words; an interrupt or an exit still ends the process."""
    try:
        with _panic_lines_held():
            return call(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:
        words = terminal_text(str(exc)[:1000])[:200] or type(exc).__name__
        shown = terminal_text(str(folder))
        raise PromptError(f"the folder's tokenizer cannot {what}: {words} ({TOKENIZER_FILE} in {shown})") from None


# fd 2 is the process's: one call holds it at a time, or two threads' holds, ending in the wrong order, would leave
# fd 2 on one's temporary file
_STDERR_HOLD = threading.Lock()


@contextmanager
def _panic_lines_held() -> Iterator[None]:
    """File descriptor 2 sent to a temporary file for the call: a Rust panic's hook writes its lines (and, under
    RUST_BACKTRACE, its stack) straight to fd 2, over the one line a refusal prints. What the call wrote is passed
    on after it returns, and dropped when it raised (the exception carries the panic's words)."""
    with _STDERR_HOLD:
        try:
            if sys.stderr is not None:  # what Python wrote before the call goes out first
                sys.stderr.flush()
            kept = os.dup(2)
        except (OSError, ValueError):  # no stderr to hold (a closed fd 2): the call runs as it is
            yield
            return
        try:
            with tempfile.TemporaryFile() as held:
                os.dup2(held.fileno(), 2)
                try:
                    yield
                finally:
                    os.dup2(kept, 2)
                held.seek(0)  # reached only when the call returned: another thread's line written meanwhile is kept
                written = held.read()
        finally:
            os.close(kept)
        while written:
            written = written[os.write(2, written) :]


def _vocabulary_size(spec: Any, graph: bool = True) -> int:
    """The ids a model can take and make: below its table's rows and its tokenizer's size where each is known,
    and MAX_VOCAB. `graph`: a lone .onnx file's rows read from its graph (parsed whole: a cost the caller chooses)."""
    try:
        rows = table_rows(spec) if graph or not spec.is_onnx_file else None
    except FolderError as exc:
        raise PromptError(str(exc)) from exc
    folder = tokenizer_folder(spec.local_path)
    tokenizer = load_tokenizer(folder) if folder is not None else None
    tokens = None
    if tokenizer is not None:
        assert folder is not None
        tokens = _tokenizer_call(folder, "say its size", tokenizer.get_vocab_size, with_added_tokens=True)
    return min(v for v in (rows, tokens, MAX_VOCAB) if v)


def vocabulary(folder: Path | None, rows: int) -> Vocabulary:
    """A model's vocabulary: the table's rows, with its folder's tokenizer where there is one."""
    tokenizer = load_tokenizer(folder) if folder is not None else None
    if tokenizer is None:
        return Vocabulary(rows)
    assert folder is not None
    special = tuple(sorted(_tokenizer_call(folder, "list its added tokens", tokenizer.get_added_tokens_decoder)))
    size = _tokenizer_call(folder, "say its size", tokenizer.get_vocab_size, with_added_tokens=True)
    return Vocabulary(rows, size, special)


def encode(folder: Path | None, text: str, chat: bool) -> list[int]:
    """--prompt's ids: the text (the folder's chat template applied first with --chat) through tokenizer.json."""
    tokenizer = load_tokenizer(folder) if folder is not None else None
    if tokenizer is None:
        where = "this model has no folder" if folder is None else f"{terminal_text(str(folder))} has none"
        raise PromptError(f"--prompt needs the model folder's {TOKENIZER_FILE} to tokenize the text, and {where}; "
                          "give the ids with --prompt-ids instead")  # fmt: skip
    assert folder is not None
    if chat:  # the template writes the special tokens itself
        rendered = chat_text(folder, text)
        return _tokenizer_call(folder, "encode this prompt", tokenizer.encode, rendered, add_special_tokens=False).ids
    return _tokenizer_call(folder, "encode this prompt", tokenizer.encode, text).ids


def chat_text(folder: Path, text: str) -> str:
    """The prompt as the folder's chat template renders one user message, with the generation prompt: rendered in
    a process of its own (_render_apart), as the template is a program from elsewhere."""
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
    request = {"template": template, "text": text, "bos": _token_text(config.get("bos_token")),
               "eos": _token_text(config.get("eos_token")), "limit": MAX_PROMPT_CHARS + len(text)}  # fmt: skip
    try:
        return _render_apart(request)
    except PromptError as exc:
        words = terminal_text(str(exc)[:1000])[:200]
        raise PromptError(f"the folder's chat template failed to render: {words}") from None


# The render process's program: the parent's import path (given as its arguments: -I lets no PYTHON* variable, user
# site or current directory in), then this module's entry point.
_RENDER_PROCESS = (
    "import sys; sys.path[:] = sys.argv[1:]; from harness.prepare.prompts import _render_process; _render_process()"
)


def _render_apart(request: dict[str, Any]) -> str:
    """The template rendered by _render_process in a child: a loop that writes nothing, or a template that asks for
    gigabytes, is stopped at MAX_TEMPLATE_SECONDS (the child killed) or MAX_TEMPLATE_MEMORY and costs only the child.
    A render of a real template costs ~0.13 s, nearly all of it the child's start (Python, numpy and jinja2
    imported); it is paid once per --chat prompt, when the run is checked."""
    command = [sys.executable, "-I", "-c", _RENDER_PROCESS, *sys.path]
    environment = os.environ | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # numpy's import: no pool
    try:
        done = subprocess.run(command, input=json.dumps(request).encode(), capture_output=True, check=False,
                              timeout=MAX_TEMPLATE_SECONDS, env=environment)  # fmt: skip
    except subprocess.TimeoutExpired:  # run() has killed it
        raise PromptError(f"it ran past {MAX_TEMPLATE_SECONDS} s and was stopped") from None
    except OSError as exc:
        raise PromptError(f"its render process could not start ({exc})") from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:  # killed, or crashed before it could answer: its last words say why
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no words"])[-1]
        raise PromptError(f"its render process ended with exit code {done.returncode} ({last[:200]})") from None
    if isinstance(answer, dict) and isinstance(answer.get("text"), str):
        return answer["text"]
    raise PromptError(str(answer.get("error") if isinstance(answer, dict) else answer))


def _render_process() -> None:
    """The render process's entry point (_render_apart starts it): the request as JSON on stdin, the rendered text
    or what went wrong as JSON on stdout. Every error the template can cause is an answer, none a traceback."""
    import jinja2.sandbox  # noqa: F401 (before the limit: the import is not the template's memory)

    request = json.loads(sys.stdin.buffer.read())
    _limit_address_space(MAX_TEMPLATE_MEMORY)
    try:
        answer = {"text": _render(**request)}
    except MemoryError:
        answer = {"error": f"it needed more than {MAX_TEMPLATE_MEMORY // 2**20:,} MiB of memory"}
    except PromptError as exc:  # the template's own raise_exception, its output past the bound, a refused size
        answer = {"error": str(exc)[:1000]}
    except Exception as exc:  # the template's own: ZeroDivisionError, OverflowError, jinja2's SecurityError, ...
        answer = {"error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
    sys.stdout.buffer.write(json.dumps(answer).encode())


def _limit_address_space(headroom: int) -> None:
    """This process may map `headroom` bytes more than it maps now (RLIMIT_AS), where the platform says both (Linux);
    elsewhere the deadline and the sandbox's size checks bound the render."""
    try:
        import resource

        mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = min(v for v in (mapped + headroom, soft, hard) if v != resource.RLIM_INFINITY)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):
        pass


def _render(template: str, text: str, bos: str, eos: str, limit: int) -> str:
    """The template rendered for one user message in the bounded sandbox, its output streamed, so a template that
    writes without end stops once it passes `limit` characters."""
    environment = _sandbox(limit)
    environment.globals["raise_exception"] = _template_error
    chunks = environment.from_string(template).generate(
        messages=[{"role": "user", "content": text}], add_generation_prompt=True, bos_token=bos, eos_token=eos
    )
    rendered, size = [], 0
    for chunk in chunks:
        rendered.append(chunk)
        size += len(chunk)
        if size > limit:
            raise PromptError(f"it wrote over {limit - len(text):,} characters around a prompt of {len(text):,}")
    return "".join(rendered)


# Methods and filters whose integer arguments size what they build: `'x'.ljust(10**9)`, `'x'|center(10**9)`.
# Belt and braces (a `'%*s' % (10**9, 'x')` or a format spec's width passes them): the child's limits bound all.
_WIDTHS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "indent"})


def _sandbox(limit: int) -> Any:
    """jinja2's immutable sandbox (HF's options), refusing before Python builds it a repeat, a power or a width past
    `limit`: `'a' * 10**10` asked for 10 GB at once. jinja2 routes '*' and '**' through call_binop for this."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right, limit)
            return super().call_binop(context, operator, left, right)

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            if getattr(obj, "__name__", None) in _WIDTHS:
                _check_widths([*args, *kwargs.values()], limit)
            return super().call(context, obj, *args, **kwargs)

    environment = Bounded(trim_blocks=True, lstrip_blocks=True)
    for name in _WIDTHS & environment.filters.keys():
        environment.filters[name] = _width_checked(environment.filters[name], limit)
    return environment


def _check_binop(operator: str, left: Any, right: Any, limit: int) -> None:
    """A repeat (`'a' * n`, `[0] * n`) of more than `limit` items, or an integer power of more than 4 × `limit`
    bits, refused before it is built."""
    if operator == "*":
        for sequence, times in ((left, right), (right, left)):
            if isinstance(sequence, (str, bytes, list, tuple)) and _whole(times) and len(sequence) * times > limit:
                items = _count(len(sequence) * times)
                raise PromptError(f"a repeat of {items} items is past the render's bound of {limit:,}")
    elif operator == "**" and _whole(left) and _whole(right) and right > 0 and right * left.bit_length() > 4 * limit:
        raise PromptError(f"a power of {_count(left)} to {_count(right)} is past the render's bound")


def _check_widths(values: list[Any], limit: int) -> None:
    if any(_whole(v) and v > limit for v in values):
        shown = ", ".join(_count(v) for v in values if _whole(v) and v > limit)
        raise PromptError(f"a width of {shown} is past the render's bound of {limit:,}")


def _width_checked(filter_: Callable[..., Any], limit: int) -> Callable[..., Any]:
    """A filter whose arguments after the filtered value are checked by _check_widths first."""

    @functools.wraps(filter_)  # keeps jinja2's pass_context / pass_environment mark, if one is set
    def checked(value: Any, *args: Any, **kwargs: Any) -> Any:
        _check_widths([*args, *kwargs.values()], limit)
        return filter_(value, *args, **kwargs)

    return checked


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: int) -> str:
    """An integer as a message shows it: with separators, or its size where it is too long to print (Python refuses
    to write an integer of over 4,300 digits)."""
    return f"{value:,}" if abs(value) < 10**18 else f"an integer of {value.bit_length():,} bits"


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
    if tokenizer is None:
        return None
    assert folder is not None
    what = "decode the model's tokens"
    return [_tokenizer_call(folder, what, tokenizer.decode, ids, skip_special_tokens=False) for ids in rows]


def eos_ids(folder: Path | None) -> tuple[int, ...]:
    """The ids that end a generation, as the folder states them (stated_eos_ids), below MAX_VOCAB: no model makes
    an id past it (model_eos_ids holds them to the model's own vocabulary)."""
    return tuple(i for i in stated_eos_ids(folder) if i < MAX_VOCAB)


def stated_eos_ids(folder: Path | None) -> tuple[int, ...]:
    """The ids that end a generation, as the folder says (generation_config.json, config.json,
    genai_config.json, then the tokenizer's eos_token), each once; () where it says none."""
    if folder is None:
        return ()
    for name, keys in EOS_SOURCES:
        value: Any = _json_file(folder, name)
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        ids = _id_values(value)
        if ids:
            return ids
    tokenizer = load_tokenizer(folder)
    eos = _token_text(_json_file(folder, TOKENIZER_CONFIG).get("eos_token"))
    token = _tokenizer_call(folder, "find its eos_token", tokenizer.token_to_id, eos) if tokenizer and eos else None
    return (token,) if token is not None else ()


def _id_values(value: Any) -> tuple[int, ...]:
    """A config's token id or list of them: the integers >= 0 in it, each once, in its order."""
    found = value if isinstance(value, list) else [value]
    return tuple(dict.fromkeys(v for v in found if isinstance(v, int) and not isinstance(v, bool) and v >= 0))


def table_rows(spec: Any) -> int | None:
    """The rows of a model's token table: the graph's (the Gather input_ids index), an HF folder's config.json
    vocab_size, a built-in spec's; None where none says."""
    if spec.is_onnx_file:
        from harness.prepare.graph_tables import index_tables

        return index_tables(spec.local_path).get("input_ids")
    config = spec.config
    if spec.local_path is not None and not getattr(spec, "is_gguf_file", False):  # a GGUF's: its header's, in its spec
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
    size = _vocabulary_size(spec)
    if outside := [i for i in found if i >= size]:
        raise PromptError(f"--prompt-ids: {', '.join(map(str, outside[:3]))} is outside {spec.name}'s vocabulary "
                          f"(ids 0 to {size - 1:,})")  # fmt: skip
    return tuple(found)


def _ids(values: list[Any] | str) -> list[int]:
    """--prompt-ids' values as integers >= 0 (the command line gives integers, the API either; text of ASCII
    digits only: int() takes '１２' and '1_0', and a bool, a float or an empty item is no id)."""
    from harness.core.options import whole_number

    if isinstance(values, str):  # the API's comma-separated text: each item an id, an empty one refused below
        values = values.split(",")
    try:
        found = [whole_number(v.strip() if isinstance(v, str) else v) for v in values]
    except ValueError:
        shown = terminal_text(", ".join(map(str, values[:3])))[:80]
        raise PromptError(f"--prompt-ids takes comma-separated token ids (integers >= 0), got {shown}") from None
    if negative := [v for v in found if v < 0]:
        raise PromptError(f"--prompt-ids takes token ids >= 0 (got {negative[0]})")
    return found


def model_eos_ids(spec: Any) -> tuple[int, ...]:
    """The EOS ids a model can make: those it states (_stated_model_eos) inside its vocabulary (a lone .onnx
    file's graph not parsed for it: its tokenizer's size and MAX_VOCAB hold it). An id past it would never end a
    generation, and a row would claim to stop at it; text_fields says which were left out."""
    stated = _stated_model_eos(spec)
    if not stated:
        return ()
    size = _vocabulary_size(spec, graph=False)
    return tuple(i for i in stated if i < size)


def _stated_model_eos(spec: Any) -> tuple[int, ...]:
    """The EOS ids a model states: its folder's (stated_eos_ids), else a built-in spec's config."""
    found = stated_eos_ids(tokenizer_folder(spec.local_path))
    if found or (spec.local_path is not None and not getattr(spec, "is_gguf_file", False)):  # a GGUF's: its config
        return found
    return _id_values(spec.config.get("eos_token_id"))


def _eos_policy(spec: Any, eos: tuple[int, ...], asked: bool) -> str:
    """A row's EOS policy in words: the ids it stopped at, and those the model states that were left out (outside
    its vocabulary: model_eos_ids), so a row never claims an id it could not make."""
    kept, note = set(eos), ""
    try:
        left_out = [i for i in _stated_model_eos(spec) if i not in kept] if asked else []
        if left_out:
            size = _vocabulary_size(spec, graph=False)
            note = f"; {_ids_text(left_out)} left out: outside the model's vocabulary (ids 0 to {size - 1:,})"
    except PromptError:  # the folder's files were read when the run was checked: one changed since says nothing
        left_out = []
    if asked and not eos:
        inside = " inside its vocabulary" if left_out else ""
        return f"--stop-at-eos asked, but the model states no EOS id{inside}: ran to --new-tokens{note}"
    return f"stop at EOS ({_ids_text(eos)}){note}" if eos else "EOS ignored"


def _ids_text(ids: Iterable[int], shown: int = 8) -> str:
    """Token ids as a policy lists them: the first `shown`, then how many in all (a config may list millions)."""
    ids = list(ids)
    more = f", … ({len(ids):,} in all)" if len(ids) > shown else ""
    return ", ".join(map(str, ids[:shown])) + more


def _decoded(spec: Any, generated: list[list[int]]) -> list[str] | None:
    """The generated ids as text: a GGUF's by its own vocabulary (harness.prepare.gguf_vocab), a built-in spec's by
    the tokenizer its toml names, else the folder's tokenizer's."""
    if getattr(spec, "is_gguf_file", False):
        from harness.prepare.gguf_file import GgufError
        from harness.prepare.gguf_vocab import decode as gguf_decode

        try:
            return gguf_decode(spec.local_path, generated)
        except (GgufError, ValueError) as exc:
            raise PromptError(f"the GGUF's vocabulary cannot decode them: {exc}") from exc
    if getattr(spec, "tokenizer", None) is not None:  # a built-in spec's own (harness.prepare.spec_tokenizer)
        from harness.prepare.spec_tokenizer import spec_tokenizer

        return decode(spec_tokenizer(spec), generated)
    return decode(tokenizer_folder(spec.local_path), generated)


def _bounded_texts(texts: list[str], generated: list[list[int]], details: dict[str, Any]) -> list[str]:
    """Each text cut to MAX_TOKEN_TEXT_CHARS per token it decodes, the bound import holds a bundle's texts to (a
    folder's tokenizer may spell one token as a megabyte), and the row says so."""
    bounded = [text[: MAX_TOKEN_TEXT_CHARS * len(ids)] for text, ids in zip(texts, generated, strict=True)]
    if bounded != texts:
        details["output_text_cut"] = (f"cut to {MAX_TOKEN_TEXT_CHARS:,} characters per generated token: the folder's "
                                      "tokenizer spelled its tokens longer")  # fmt: skip
    return bounded


def text_fields(spec: Any, input_ids: np.ndarray, generated: list[list[int]] | None, eos: tuple[int, ...],
                asked: bool, details: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A generate row's prompt ids, its output texts (every batch row's tokens through the model's tokenizer;
    output_text: the first's, as stores before v12 hold it) and its EOS policy (`eos`: the ids it stopped at, ()
    when it ran to --new-tokens; `asked`: --stop-at-eos); why a text is NULL (a tokenizer that cannot decode the
    tokens included), and the policy (_eos_policy), go to `details`."""
    try:
        texts = _decoded(spec, generated) if generated else None
        why = "no tokens were kept" if not generated else f"the model has no {TOKENIZER_FILE}"
    except PromptError as exc:  # a tokenizer that cannot be read costs the row its text, not its measurement
        texts, why = None, str(exc)
    if texts is None:
        details["output_text"] = f"not decoded: {why}"
    elif generated:
        texts = _bounded_texts(texts, generated, details)
        if getattr(spec, "tokenizer", None) is not None:  # the row says whose words these are
            from harness.prepare.spec_tokenizer import DESCRIBED

            details["tokenizer"] = DESCRIBED
    details["eos_policy"] = _eos_policy(spec, eos, asked)
    return {"prompt_ids": np.asarray(input_ids).astype(int).tolist(), "output_text": texts[0] if texts else None,
            "output_texts": texts, "stop_at_eos": bool(eos)}  # fmt: skip
