"""A GGUF given as the model, prepared in the prepare worker (harness.run.worker.prepare_isolated) with native
llama.cpp as its tokenizer and its reference (harness.prepare.gguf_model): node-llama-cpp's prebuilt binary, loaded
through the llama.cpp engine's own backend (harness.native.llamacpp_backend), at its default threads. Prepare
imports no engine, so the run part hands it this one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from harness.prepare.gguf_model import GgufEngine, Reference, prepare_gguf
from harness.prepare.prepared import Phase, PreparedModel, PrepareJob


class LlamaCppEngine:
    """A loaded llama.cpp session (harness.native.llamacpp_backend.LlamaCppGenerator) as gguf_model's engine."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.bos = session.tokenizer.get("bos")
        self.add_bos = bool(session.tokenizer.get("add_bos"))
        facts = session.facts
        self.described = (f"native llama.cpp {facts['llama_cpp_release']} (node-llama-cpp "
                          f"{facts['node_llama_cpp_version']}, {facts['llama_cpp_binary']}), "
                          f"{facts.get('native_threads')} threads, on the same file")  # fmt: skip

    def tokenize(self, text: str) -> list[int]:
        return [int(i) for i in self.session.runner.ask({"op": "tokenize", "text": text})["ids"]]

    def greedy(self, ids: list[int], new_tokens: int, eos: tuple[int, ...]) -> Reference:
        session = self.session
        session.prepare({"input_ids": np.asarray([ids], dtype=np.int64)})  # a case's first generation: its top-k
        session.generate(ids, new_tokens, lambda: None, eos)
        assert session.generated is not None and session.step_top is not None and session.step_log_weight is not None
        top_ids, top_logits = session.step_top
        return Reference(session.generated[0].tolist(), np.asarray(top_ids[0], dtype=np.int64),
                         np.asarray(top_logits[0], dtype=np.float64), session.step_log_weight)  # fmt: skip


class LlamaCppEngines:
    """node-llama-cpp's llama.cpp, opened on a GGUF."""

    @property
    def version(self) -> str:
        from harness.native.llamacpp_backend import NODE_MODULES

        try:
            return "node-llama-cpp " + json.loads((NODE_MODULES / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            return "node-llama-cpp (not installed)"

    @contextmanager
    def open(self, path: Path, job: PrepareJob) -> Iterator[GgufEngine]:
        from harness.native.base import LoadRequest
        from harness.native.llamacpp_backend import BACKEND
        from harness.prepare.gguf_file import read_gguf

        precision = read_gguf(path).precision or "auto"
        session = BACKEND.load(LoadRequest(job.spec, None, precision, gguf_path=path), BACKEND.targets()[0])
        try:
            yield LlamaCppEngine(session)
        finally:
            session.close()


def prepare_gguf_steps(job: PrepareJob) -> Iterator[Phase | PreparedModel]:
    """The prepare worker's entry point for a GGUF (harness.prepare.prepared.prepare_steps' counterpart)."""
    yield from prepare_gguf(job, LlamaCppEngines())
