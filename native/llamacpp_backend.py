"""llama.cpp, natively: node-llama-cpp's prebuilt CPU binary (no PyPI build of llama.cpp runs on Debian 12 without
compiling; node-llama-cpp 3.22.1 ships one that does) running the GGUF the prepare worker wrote of the model's own
weights (harness.prepare.gguf_export), the file llama.cpp in the page (wllama) runs too.

The session is a persistent `node native/llamacpp/runner.mjs` child, started by load() inside the worker process
the harness already isolates, speaking JSON lines over its stdin and stdout. A generation hands it the prompt's ids
(never tokenized by llama.cpp), a fresh KV cache (the sequence's history cleared), and it chooses greedily (the
argmax) exactly new_tokens tokens, EOS ignored unless --stop-at-eos gives ids, writing one line per token the moment
llama.cpp chose it; generate() calls stamp() as each line arrives. The pipe hop is inside every step's time: the
runner echoing a line back (its `echo` op) took 0.023 ms median per round trip (p90 0.047 ms, 2,000 round trips after
200 warm ones; 2 cores, node 20.20, Python 3.11), so a token's line reaches Python about 0.01 ms after llama.cpp chose
it, against llama-tiny's ~0.4 ms decode steps and a 135M model's milliseconds.

The first generation of each case (untimed: measure_generation's first run) also returns each step's top
STEP_TOP_K raw logits, which the row's token check compares with native ONNX Runtime's teacher-forced logits
(harness.core.generation.token_check): the tokens alone of a tiny random model rarely move under a wrong weight.

Memory: llama.cpp's weights and KV cache live in the node child, so a row's memory_peak_mb is the worker's RSS peak
plus the runner's (ChildMemory: its kernel high-water mark, reset before the case like the worker's), and its
details say so (memory_covers, runner_memory_peak_mb, runner_rss_after_load_mb).

Threads: --native-threads, else node-llama-cpp's default (the Llama's cpuMathCores, its maxThreads set to 0 so the
context's count is exactly what runs), read back from the context (currentThreads) after a generation. Batch 1 only;
no --depths (its cache is not filled first).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from harness.core.generation import STEP_TOP_K
from harness.core.records import Target
from harness.native.base import (
    Availability,
    Capabilities,
    Clock,
    DeviceByHardware,
    HostMemory,
    LoadRequest,
    UnsupportedError,
    thread_facts,
)

RUNNER_DIR = Path(__file__).resolve().parent / "llamacpp"
RUNNER = RUNNER_DIR / "runner.mjs"
NODE_MODULES = RUNNER_DIR / "node_modules" / "node-llama-cpp"
PROBE_TIMEOUT_S = 60.0
CONTEXT_CAP = 4096  # the context load() makes, at most (its model's own length where shorter); larger on demand
# general.file_type as llama.cpp states it (LLAMA_FTYPE) → the harness precision it means
FILE_TYPE_PRECISIONS = {0: "fp32", 1: "fp16", 2: "q4", 7: "int8"}
STEP_TOP = "step_top"  # the facts' key of the first generation's top logits per step (taken off by the check)


class RunnerError(RuntimeError):
    """The node runner's own failure, in its words."""


class Runner:
    """The node child and its JSON lines: one request at a time."""

    def __init__(self, node: str) -> None:
        self.log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 llama.cpp's log, read back on a failure
        self.process = subprocess.Popen([node, str(RUNNER)], cwd=RUNNER_DIR, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)  # fmt: skip

    def send(self, request: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace")[-1000:]
            raise RunnerError(f"the llama.cpp runner exited ({self.process.poll()}): {tail.strip()}")
        message = json.loads(line)
        if "error" in message:
            raise RunnerError(f"llama.cpp runner: {message['error']}"[:1000])
        return message

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return self.receive()

    def close(self) -> None:
        if self.process.poll() is None:
            if self.process.stdin is not None:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


_MB = 1024 * 1024


class ChildMemory:
    """The runner's RSS high-water mark between reset() and peak_mb(): /proc/<pid>/status's VmHWM, reset by writing 5
    to its clear_refs (as harness.run.memory does for the worker), else its RSS sampled every 5 ms (psutil). Each
    reading is written to `facts`, under the names the row states."""

    def __init__(self, pid: int, facts: dict[str, Any]) -> None:
        self.pid, self.facts = pid, facts
        self._sampled = 0.0
        self._stop: Any = None  # the sampling thread's stop event, while it runs

    def _hwm_mb(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
        except (OSError, ValueError):
            return None
        return None

    def rss_mb(self) -> float:
        import psutil

        return psutil.Process(self.pid).memory_info().rss / _MB

    def reset(self) -> None:
        import threading

        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            if self._hwm_mb() is not None:
                self.facts["runner_memory_method"] = "vmhwm"
                return
        except OSError:
            pass
        self.facts["runner_memory_method"] = "sampling"
        self._sampled, stop = self.rss_mb(), threading.Event()
        self._stop = stop

        def sample() -> None:
            while not stop.wait(0.005):
                with contextlib.suppress(Exception):  # the runner exiting: its last reading stands
                    self._sampled = max(self._sampled, self.rss_mb())

        threading.Thread(target=sample, daemon=True).start()

    def peak_mb(self) -> float:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            peak = max(self._sampled, self.rss_mb())
        else:
            peak = self._hwm_mb() or self.rss_mb()
        self.facts["runner_memory_peak_mb"] = peak
        self.facts["memory_covers"] = (
            "the worker's RSS peak plus the node llama.cpp runner's (runner_memory_peak_mb), each its own since the "
            "case began: the sum of the two processes' peaks, an upper bound of their peak together"
        )
        return peak


class LlamaCppGenerator(HostMemory):
    """One GGUF loaded by the runner; each generate() a fresh KV cache on the prompt."""

    def __init__(self, runner: Runner, precision: str, facts: dict[str, Any]) -> None:
        self.runner = runner
        self.precision = precision
        self.facts = facts
        self.clock = Clock()
        self.generated: np.ndarray | None = None  # the last generate()'s token ids [1, n]
        self.step_top: tuple[np.ndarray, np.ndarray] | None = None  # the case's first generation's top logits
        # each step's log of the sum of exp(logit - its largest) of that generation: its top logits as log-probabilities
        # (logit - largest - this), as llama.cpp in the page gives them
        self.step_log_weight: np.ndarray | None = None
        self._top_wanted = False
        self.tokenizer: dict[str, Any] = {}  # llama.cpp's BOS id and whether its tokenizer puts BOS first
        self.path: Path | None = None  # the GGUF loaded (harness.run.worker counts a row's work on a session's path)
        self.children_memory = ChildMemory(runner.process.pid, facts)  # the measure loop adds its peak to the worker's
        with contextlib.suppress(Exception):  # a runner already gone: its load's memory is not stated
            facts["runner_rss_after_load_mb"] = self.children_memory.rss_mb()
            facts["memory_load_covers"] = "the worker's RSS growth over the load plus the runner's RSS after it"

    def prepare(self, feeds: dict[str, np.ndarray]) -> list[int]:
        why = "node-llama-cpp's sequences are separate generations, not one batched one"
        self._top_wanted = True  # a new case: its first generation (untimed) returns each step's top logits
        return one_prompt(feeds, "llama.cpp", why)

    def run(self, prepared: Any) -> Any:
        raise UnsupportedError("llama.cpp generates only (--mode generate)")

    def to_numpy(self, outputs: Any) -> list[np.ndarray]:
        return []

    def generate(self, prepared: list[int], new_tokens: int, stamp: Callable[[], None],
                 eos: tuple[int, ...] = ()) -> int:  # fmt: skip
        """Exactly new_tokens greedy tokens (up to them, ending at an `eos` id, with --stop-at-eos); stamp() as each
        token's line arrives from the runner (llama.cpp chose it one pipe hop earlier: the module's docstring)."""
        top = STEP_TOP_K if self._top_wanted else 0
        self.runner.send({"op": "generate", "ids": prepared, "newTokens": new_tokens, "eos": list(eos), "top": top})
        tokens, tops, weights = [], [], []
        while True:
            message = self.runner.receive()
            if "t" not in message:
                break
            stamp()
            tokens.append(int(message["t"]))
            tops.append(message.get("top") or [])
            weights.append(message.get("lw"))
        self.generated = np.asarray([tokens], dtype=np.int64)
        self._threads_read(message.get("threads_current"))
        if top:
            self._top_wanted = False
            ids = np.asarray([[[int(i) for i, _ in step] for step in tops]], dtype=np.int64)
            values = np.asarray([[[float(v) for _, v in step] for step in tops]], dtype=np.float64)
            self.step_top = (ids, values)
            self.step_log_weight = np.log(np.asarray([np.nan if w is None else w for w in weights], dtype=np.float64))
            self.facts[STEP_TOP] = {"ids": ids.tolist(), "values": values.tolist()}
        return len(tokens)

    def _threads_read(self, current: Any) -> None:
        """The context's thread count after a generation (currentThreads), where it differs from the load's."""
        if isinstance(current, int) and current != self.facts.get("native_threads"):
            self.facts["native_threads"] = current
            self.facts["native_threads_source"] += f"; after a generation: {current}"

    def close(self) -> None:
        self.runner.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a closing worker: nothing left to tell
            self.runner.close()


def one_prompt(feeds: dict[str, np.ndarray], engine: str, why_one: str) -> list[int]:
    """A llama.cpp engine's prompt: the case's ids of its one sequence, unpadded; else UnsupportedError saying why."""
    ids = feeds["input_ids"]
    if ids.shape[0] != 1:
        raise UnsupportedError(f"{engine} here generates batch 1 only (batch {ids.shape[0]} asked): {why_one}")
    if "attention_mask" in feeds and not np.all(feeds["attention_mask"] == 1):
        raise UnsupportedError(f"{engine} takes unpadded prompts only (a mask of ones)")
    return [int(i) for i in ids[0]]


# A llama.cpp engine's (this one's, llama-cpp-python's): it runs the GGUF the prepare worker writes of the model's
# weights (LoadRequest.gguf_path), checked against native ORT on the export with past (generate_needs_past_export:
# that export is prepared, and every row checked)
GGUF_ENGINE = Capabilities(modes=("generate",), generate_needs_past_export=True, needs_onnx=False,
                           runs_onnx_files=False, runs_gguf=True)  # fmt: skip


class LlamaCppBackend(DeviceByHardware):
    engine = "llama.cpp"
    capabilities = GGUF_ENGINE  # opt-in

    def targets(self) -> list[Target]:
        return [Target("cpu", self.engine, "cpu")]

    def probe(self, target: Target) -> Availability:
        node = shutil.which("node")
        if node is None:
            return Availability(False, "node is not installed (node-llama-cpp runs llama.cpp: Node.js 20 or later)")
        if not NODE_MODULES.is_dir():
            return Availability(False, f"node-llama-cpp is not installed in {RUNNER_DIR}: run `make setup`")
        runner = Runner(node)
        try:
            facts = _ask_within(runner, {"op": "probe"}, PROBE_TIMEOUT_S)["facts"]
        except Exception as exc:  # the binary does not load here: its words are the reason
            return Availability(False, f"node-llama-cpp's prebuilt llama.cpp does not load: {exc}"[:500])
        finally:
            runner.close()
        return Availability(True, f"llama.cpp {facts['llama_cpp_release']} ({facts['llama_cpp_build_type']} CPU "
                                  f"binary, node-llama-cpp {facts['node_llama_cpp_version']})")  # fmt: skip

    def load(self, request: LoadRequest, target: Target) -> LlamaCppGenerator:
        from harness.prepare.gguf_export import gguf_precision

        asked = gguf_precision(request.precision)
        if request.gguf_path is None:
            why = request.gguf_error or "none was written"
            raise UnsupportedError(f"llama.cpp runs a GGUF of the model's weights; none at {asked}: {why}")
        node = shutil.which("node")
        if node is None or not NODE_MODULES.is_dir():
            raise UnsupportedError(f"node-llama-cpp is not installed in {RUNNER_DIR}: run `make setup`")
        runner = Runner(node)
        try:
            loaded = runner.ask({"op": "load", "path": str(request.gguf_path), "threads": request.threads,
                                 "contextCap": CONTEXT_CAP})["facts"]  # fmt: skip
        except Exception:
            runner.close()
            raise
        # a GGUF given as the model runs at the kind of its weights' quantization (harness.prepare.gguf_file, read
        # from its tensors when the run was checked: Q4_1 is q4); one the harness wrote, at its file type's
        ran = request.precision if request.spec.is_gguf_file else FILE_TYPE_PRECISIONS.get(loaded.get("gguf_file_type"))
        if ran is None:
            runner.close()
            raise UnsupportedError(f"llama.cpp reports file type {loaded.get('gguf_file_type')} for "
                                   f"{request.gguf_path.name}, which no harness precision names")  # fmt: skip
        session = LlamaCppGenerator(runner, ran, _facts(loaded, request.threads))
        session.tokenizer = {"bos": loaded.get("bos"), "add_bos": loaded.get("add_bos")}  # its prompt's BOS rule
        session.path = request.gguf_path  # the file that ran: its row's work is counted on it
        return session


def _facts(loaded: dict[str, Any], asked: int | None) -> dict[str, Any]:
    """A row's facts: what the runner read back from node-llama-cpp, llama.cpp and the model."""
    current = loaded.get("threads_current")
    if asked:
        source = f"--native-threads {asked}: createContext({{threads}}), read back: context.currentThreads {current}"
    else:
        source = (f"node-llama-cpp's default (the Llama's cpuMathCores, {loaded.get('llama_cpp_cpu_math_cores')}), "
                  f"read back: context.currentThreads {current}")  # fmt: skip
    spinning = "not set: llama.cpp's CPU threadpool has no such option in node-llama-cpp (its default polling)"
    gpu = loaded.get("llama_cpp_gpu")
    binary = f"{loaded['llama_cpp_build_type']}, {'cpu' if gpu is False else gpu}"
    return {
        "node_llama_cpp_version": loaded["node_llama_cpp_version"],
        "llama_cpp_release": loaded["llama_cpp_release"],
        "llama_cpp_binary": binary,
        "llama_cpp_system_info": loaded.get("llama_cpp_system_info"),
        "node_version": loaded.get("node_version"),
        "model_file": loaded["gguf_file"],
        "gguf_file_type": loaded.get("gguf_file_type"),
        "gguf_architecture": loaded.get("gguf_architecture"),
        "context_size": loaded.get("context_size"),
        "batch_size": loaded.get("batch_size"),
    } | thread_facts(current, source, None, spinning)


def _ask_within(runner: Runner, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """runner.ask under a deadline: a binary that hangs while loading is killed, and says so."""
    import threading

    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(_caught(runner.ask, request)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        runner.process.kill()
        raise RunnerError(f"no answer within {timeout_s:g} s")
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def _caught(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as exc:  # handed to the waiting thread
        return exc


BACKEND = LlamaCppBackend()
