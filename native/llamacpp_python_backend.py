"""llama.cpp through llama-cpp-python (PyPI's bindings), where a user has it installed: the GGUF the prepare worker
writes of the model's weights (harness.prepare.gguf_export), the file the node llama.cpp engine (native/
llamacpp_backend.py) and llama.cpp in the page (wllama) run, or the user's --model-path x.gguf.

Not a dependency of the harness: no PyPI wheel of it runs on Debian 12 without compiling llama.cpp (about 15-25
minutes on two cores), so CI does not install it. Where `import llama_cpp` fails the engine probes unavailable and
load() refuses, each naming `pip install llama-cpp-python`; nothing crashes.

The session is a `llama_cpp.Llama` in the worker process the harness already isolates: `Llama(model_path,
n_threads, n_threads_batch, n_ctx, logits_all=False, verbose=False)`, its model's weights mmapped. A generation hands
`Llama.eval` the prompt's ids (never tokenized by llama.cpp) on a fresh KV cache, then one eval per chosen token;
each step ends when its logits are on the CPU: `llama_get_logits_ith(ctx, -1)` waits for llama.cpp's graph and the
logits are copied into a NumPy array, then stamp() runs and the argmax is the token (greedy, exactly new_tokens, EOS
ignored unless --stop-at-eos gives ids). llama-cpp-python's own per-step Python (its eval fills a llama_batch in a
loop) is inside every step, as a user of the bindings pays it.

The first generation of each case (untimed) keeps each step's top STEP_TOP_K raw logits, checked against native ONNX
Runtime's teacher-forced logits like the node engine's (harness.run.native.checked_generation). At a depth
(--depths) the KV cache is first filled with the harness's filler (harness.prepare.greedy.filler, ORT's and the
page's), untimed, and kept for the next generation of the same prompt and depth (the positions after it dropped).

Memory: llama.cpp runs in the worker, so the worker's RSS peak (the measure loop's) is the row's memory. Threads:
--native-threads sets both of llama.cpp's counts (decode and batch); else llama-cpp-python's defaults (half the
logical CPUs for decode, all for the prompt); both read back from the context (llama_n_threads,
llama_n_threads_batch). Batch 1 only.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.generation import STEP_TOP_K
from harness.core.records import Target
from harness.native.base import (
    Availability,
    Clock,
    DeviceByHardware,
    HostMemory,
    LoadRequest,
    UnsupportedError,
    thread_facts,
)
from harness.native.llamacpp_backend import CONTEXT_CAP, FILE_TYPE_PRECISIONS, GGUF_ENGINE, STEP_TOP, one_prompt

INSTALL = "pip install llama-cpp-python"
NOT_INSTALLED = (f"llama-cpp-python is not installed here (`{INSTALL}`; it compiles llama.cpp where no wheel fits "
                 "the machine)")  # fmt: skip


def imported() -> Any:
    """The llama_cpp module, or UnsupportedError naming how to install it (its import's own words kept, bounded)."""
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:  # OSError: the package is there but its libllama does not load
        raise UnsupportedError(f"{NOT_INSTALLED}: {type(exc).__name__}: {exc}"[:500]) from exc
    return llama_cpp


def llama_cpp_build(llama_cpp: Any) -> dict[str, str | None]:
    """The bindings' version and the ggml library's own version and commit, where the build exposes them."""
    found: dict[str, str | None] = {"llama_cpp_python_version": getattr(llama_cpp, "__version__", None)}
    try:
        from llama_cpp import _ggml

        for name in ("ggml_version", "ggml_commit"):
            function = getattr(_ggml.libggml, name)
            function.restype = ctypes.c_char_p
            found[name] = function().decode(errors="replace")[:64]
    except Exception:  # an older build without them: not stated
        found |= {"ggml_version": None, "ggml_commit": None}
    return found


def context_size(path: Path) -> int:
    """The context load() makes: the model's own length where shorter than CONTEXT_CAP (its GGUF header, read
    bounded), else CONTEXT_CAP; larger on demand, as the node engine's."""
    from harness.prepare.gguf_file import GgufError, header

    try:
        metadata, _ = header(path)
    except GgufError:
        return CONTEXT_CAP
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, bytes):
        return CONTEXT_CAP
    length = metadata.get(f"{architecture.decode(errors='replace')}.context_length")
    return min(length, CONTEXT_CAP) if type(length) is int and length > 0 else CONTEXT_CAP


class LlamaCppPythonGenerator(HostMemory):
    """One GGUF loaded by llama-cpp-python; each generate() a fresh KV cache on the prompt (after the filler)."""

    def __init__(self, llama_cpp: Any, request: LoadRequest, precision: str, context: int) -> None:
        assert request.gguf_path is not None
        self.llama_cpp, self.request, self.precision = llama_cpp, request, precision
        self.path = request.gguf_path  # the file that ran (harness.run.worker counts a row's work on a session's path)
        self.clock = Clock()
        self.fills_cache = True  # generate() takes a KV-cache depth (--depths), filled before begin()
        self.generated: np.ndarray | None = None  # the last generate()'s token ids [1, n]
        self.step_top: tuple[np.ndarray, np.ndarray] | None = None  # the case's first generation's top logits
        self.step_log_weight: np.ndarray | None = None  # each step's log-sum-exp of (logits - their largest)
        self._top_wanted = False
        self._filled: tuple[int, tuple[int, ...]] | None = None  # (depth, prompt) of the filler in the cache
        self.llm = self._open(context)
        self.facts: dict[str, Any] = self._facts()

    def _open(self, context: int) -> Any:
        threads = self.request.threads
        return self.llama_cpp.Llama(model_path=str(self.request.gguf_path), n_threads=threads, n_threads_batch=threads,
                                    n_ctx=context, n_gpu_layers=0, logits_all=False, verbose=False)  # fmt: skip

    def _facts(self) -> dict[str, Any]:
        llama_cpp, llm, asked = self.llama_cpp, self.llm, self.request.threads
        decode, batch = llama_cpp.llama_n_threads(llm.ctx), llama_cpp.llama_n_threads_batch(llm.ctx)
        if asked:
            source = f"--native-threads {asked}: Llama(n_threads, n_threads_batch), read back: llama_n_threads {decode}"
        else:
            source = ("llama-cpp-python's default (half the logical CPUs decode, all of them the prompt), read back: "
                      f"llama_n_threads {decode}")  # fmt: skip
        spinning = "not set: llama.cpp's CPU threadpool has no such option in llama-cpp-python (its default)"
        metadata = llm.metadata
        file_type = metadata.get("general.file_type")
        system = llama_cpp.llama_print_system_info().decode(errors="replace")[:1000]
        facts = llama_cpp_build(llama_cpp) | {
            "llama_cpp_binary": "llama-cpp-python, cpu",
            "llama_cpp_system_info": system,
            "model_file": Path(str(self.request.gguf_path)).name,
            "gguf_file_type": int(file_type) if file_type and file_type.isdigit() else None,
            "gguf_architecture": str(metadata.get("general.architecture"))[:64],  # the file's text, bounded
            "context_size": llm.n_ctx(),
            "batch_size": llm.n_batch,
            "native_threads_batch": batch,
        }
        return facts | thread_facts(decode, source, None, spinning)

    def prepare(self, feeds: dict[str, np.ndarray]) -> list[int]:
        self._top_wanted = True  # a new case: its first generation (untimed) keeps each step's top logits
        return one_prompt(feeds, "llama-cpp-python", "a Llama holds one sequence")

    def run(self, prepared: Any) -> Any:
        raise UnsupportedError("llama-cpp-python generates only (--mode generate)")

    def to_numpy(self, outputs: Any) -> list[np.ndarray]:
        return []

    def _fill(self, prompt: list[int], depth: int) -> None:
        """The KV cache holding the filler's `depth` positions and nothing after: made once per prompt and depth
        (untimed); Llama.eval drops every position from n_tokens on before it evaluates."""
        from harness.prepare.greedy import filler

        key = (depth, tuple(prompt))
        if depth and self._filled == key:
            self.llm.n_tokens = depth
            return
        self.llm.reset()
        self._filled = None
        if depth:
            self.llm.eval(filler(np.asarray([prompt], dtype=np.int64), depth)[0].tolist())
            self._filled = key

    def _logits(self) -> np.ndarray:
        """The last evaluated position's logits, copied to the host: llama_get_logits_ith waits for llama.cpp."""
        pointer = self.llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.llm.n_vocab(),)).copy()

    def _grow(self, needed: int) -> None:
        """A larger context (a case's first generation, never timed): the Llama reopened with it."""
        self.llm.close()
        self._filled = None
        self.llm = self._open(needed)
        self.facts["context_size"] = self.llm.n_ctx()

    def generate(self, prepared: list[int], new_tokens: int, stamp: Callable[[], None], eos: tuple[int, ...] = (),
                 depth: int = 0, begin: Callable[[], None] = lambda: None) -> int:  # fmt: skip
        """Exactly new_tokens greedy tokens (up to them, ending at an `eos` id, with --stop-at-eos) after a cache
        filled to `depth` (then begin() runs); stamp() as each step's logits are on the CPU."""
        if depth + len(prepared) + new_tokens > self.llm.n_ctx():
            self._grow(depth + len(prepared) + new_tokens)
        self._fill(prepared, depth)
        top = self._top_wanted
        tokens: list[int] = []
        tops: list[np.ndarray] = []
        begin()
        self.llm.eval(prepared)
        for step in range(new_tokens):
            logits = self._logits()
            stamp()
            token = int(np.argmax(logits))
            tokens.append(token)
            if top:
                tops.append(logits)
            if token in eos:
                break
            if step + 1 < new_tokens:
                self.llm.eval([token])
        self.generated = np.asarray([tokens], dtype=np.int64)
        if top:
            self._keep_top(tops)
        return len(tokens)

    def _keep_top(self, steps: list[np.ndarray]) -> None:
        """Each step's top STEP_TOP_K logits (ids and raw values, largest first) and its log-sum-exp weight."""
        self._top_wanted = False
        ids = [np.argsort(-logits, kind="stable")[:STEP_TOP_K] for logits in steps]
        values = [logits[i].astype(np.float64) for logits, i in zip(steps, ids, strict=True)]
        weights = [np.exp(logits.astype(np.float64) - logits.max()).sum() for logits in steps]
        self.step_top = (np.asarray([ids], dtype=np.int64), np.asarray([values], dtype=np.float64))
        self.step_log_weight = np.log(np.asarray(weights, dtype=np.float64))
        self.facts[STEP_TOP] = {"ids": self.step_top[0].tolist(), "values": self.step_top[1].tolist()}

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already closed
            self.llm.close()


class LlamaCppPythonBackend(DeviceByHardware):
    engine = "llama-cpp-python"
    capabilities = GGUF_ENGINE  # opt-in; the node llama.cpp engine's: the same GGUF, checked as its rows are

    def targets(self) -> list[Target]:
        return [Target("cpu", self.engine, "cpu")]

    def probe(self, target: Target) -> Availability:
        try:
            llama_cpp = imported()
        except UnsupportedError as exc:
            return Availability(False, str(exc))
        build = llama_cpp_build(llama_cpp)
        return Availability(True, f"llama-cpp-python {build['llama_cpp_python_version']} (ggml "
                                  f"{build['ggml_version']}, commit {build['ggml_commit']})")  # fmt: skip

    def load(self, request: LoadRequest, target: Target) -> LlamaCppPythonGenerator:
        from harness.prepare.gguf_export import gguf_precision

        if request.gguf_path is None:
            why = request.gguf_error or "none was written"
            raise UnsupportedError(f"llama-cpp-python runs a GGUF of the model's weights; none at "
                                   f"{gguf_precision(request.precision)}: {why}")  # fmt: skip
        llama_cpp = imported()
        session = LlamaCppPythonGenerator(llama_cpp, request, request.precision, context_size(request.gguf_path))
        # a GGUF given as the model runs at its weights' kind (harness.prepare.gguf_file); one the harness wrote, at
        # the precision its file type states, as llama.cpp reads it back
        file_type = session.facts["gguf_file_type"]
        ran = request.precision if request.spec.is_gguf_file else FILE_TYPE_PRECISIONS.get(file_type)
        if ran is None:
            session.close()
            raise UnsupportedError(f"llama.cpp reports file type {file_type} for "
                                   f"{request.gguf_path.name}, which no harness precision names")  # fmt: skip
        session.precision = ran
        return session


BACKEND = LlamaCppPythonBackend()
