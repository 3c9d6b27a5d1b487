"""llama.cpp through llama-cpp-python as a native engine, where it is installed (CI has it not: those tests skip),
on the GGUF the harness writes of llama-tiny's weights, checked against native ONNX Runtime's teacher-forced logits
as the node llama.cpp engine's rows are (tests/test_llamacpp.py); a planted fault (one weight ×1.05) must fail that
check. Not installed, the engine is `unsupported` naming `pip install llama-cpp-python`: checked everywhere."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli, run_cli_process

from harness.core.generation import StepTop, token_check
from harness.core.parity import GGML_SIDE
from harness.core.records import Target
from harness.native.base import Availability, LoadRequest, UnsupportedError
from harness.native.llamacpp_python_backend import BACKEND, INSTALL, LlamaCppPythonGenerator
from harness.prepare import gguf_export
from harness.prepare.prepared import PreparedModel, PrepareJob, prepare_model
from harness.prepare.specs import load_specs

INSTALLED = importlib.util.find_spec("llama_cpp") is not None
needs_it = pytest.mark.skipif(not INSTALLED, reason=f"llama-cpp-python is not installed (`{INSTALL}`)")

SHAPE = (1, 16)
NEW_TOKENS = 8
TARGET = BACKEND.targets()[0]


def test_not_installed_is_unsupported_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now fails, installed or not
    found = BACKEND.probe(TARGET)
    assert not found.ok and INSTALL in found.reason, found.reason
    spec = load_specs()["llama-tiny"]
    with pytest.raises(UnsupportedError, match=INSTALL):
        BACKEND.load(LoadRequest(spec, None, "fp32", gguf_path=Path("model.gguf")), TARGET)


def test_an_engine_named_beside_an_available_one_keeps_its_unsupported_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """--engines onnxruntime,llama-cpp-python without the package: the run plans its target (an `unsupported` row
    saying how to install it) instead of dropping it because onnxruntime serves the CPU; unnamed (the defaults),
    an unavailable engine stays out."""
    from harness.run import plan

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    probed = [(t, BACKEND.probe(t)) for t in BACKEND.targets()]

    def targets(hardware: list[str], _: list[str]) -> list[tuple[Target, Availability]]:
        return plan_probe_ort(hardware) + [p for p in probed if p[0].hardware in hardware]

    monkeypatch.setattr(plan, "native_targets", targets)
    for hardware in (None, ["cpu"]):
        named = plan.choose_targets(hardware, ["onnxruntime", "llama-cpp-python"], named=True)
        assert [(t.engine, a.ok) for t, a in named] == [("onnxruntime", True), ("llama-cpp-python", False)], named
        unnamed = plan.choose_targets(hardware, ["onnxruntime", "llama-cpp-python"])
        assert [t.engine for t, _ in unnamed] == ["onnxruntime"]


def plan_probe_ort(hardware: list[str]) -> list[tuple[Target, Availability]]:
    return [(Target("cpu", "onnxruntime", "CPUExecutionProvider"), Availability(True, ""))] if "cpu" in hardware else []


@pytest.mark.slow
def test_a_run_without_it_stores_an_unsupported_row(tmp_path: Path) -> None:
    """A package that fails to import (planted on PYTHONPATH: a CLI process's sys.path, which its workers take):
    the row says why."""
    import duckdb

    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("planted: not installed")\n')
    db = tmp_path / "r.duckdb"
    done = run_cli_process("native", "--model", "llama-tiny", "--engines", "llama-cpp-python", "--hardware", "cpu",
                   "--mode", "generate", "--new-tokens", "4", "--iterations", "1", "--warmup", "0", "--min-duration",
                   "0", "--db", str(db), "--output-dir", str(tmp_path / "out"),
                   env={"PYTHONPATH": str(fake.parent)})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with duckdb.connect(str(db), read_only=True) as store:
        rows = store.execute("select engine, status, error from results").fetchall()
    assert [(e, s) for e, s, _ in rows] == [("llama-cpp-python", "unsupported")] and INSTALL in rows[0][2], rows


@pytest.fixture(scope="module")
def prepared() -> PreparedModel:
    spec = load_specs()["llama-tiny"]  # tests/test_llamacpp.py's job: one cache entry serves both
    job = PrepareJob(spec, [SHAPE], with_past=True, plain=False, reference_tokens=NEW_TOKENS, gguf_precisions=("fp32",))
    return next(prepare_model(job))


def _load(prepared: PreparedModel, gguf: Path, threads: int | None = 1) -> LlamaCppPythonGenerator:
    return BACKEND.load(LoadRequest(prepared.spec, None, "fp32", threads=threads, gguf_path=gguf), TARGET)


def _generate(session: LlamaCppPythonGenerator, prepared: PreparedModel, depth: int = 0) -> tuple[list[int], StepTop]:
    feeds, _ = prepared.load_case(SHAPE)
    ids = session.prepare(feeds)  # a new case: its first generation keeps each step's top logits
    stamps: list[int] = []
    made = session.generate(ids, NEW_TOKENS, lambda: stamps.append(1), depth=depth)
    assert made == NEW_TOKENS == len(stamps) and session.generated is not None and session.step_top is not None
    return session.generated[0].tolist(), StepTop(*session.step_top)


def _checked(prepared: PreparedModel, tokens: list[int], top: StepTop, depth: int = 0) -> tuple[bool, dict]:
    from harness.prepare.quality import forced

    feeds, _ = prepared.load_case(SHAPE)
    prompt = {k: feeds[k] for k in ("input_ids", "attention_mask")}
    assert prepared.onnx_past_path is not None
    logits = forced(prepared.onnx_past_path, prompt, np.asarray([tokens]), depth)[:, -len(tokens) :]
    return token_check([tokens], logits, "fp32", GGML_SIDE, top)


@needs_it
def test_the_gguf_f32_generates_native_orts_tokens_at_each_depth(prepared: PreparedModel) -> None:
    session = _load(prepared, Path(prepared.gguf_files["fp32"]))
    try:
        tokens, top = _generate(session, prepared)
        reference = prepared.load_generation(SHAPE, NEW_TOKENS)
        assert reference is not None and tokens == reference.tokens[0].tolist()  # native ORT's greedy loop
        agree, found = _checked(prepared, tokens, top)
        assert agree and found["step_logit_max_diff"] < 1e-4, found  # llama.cpp's F32 kernels against ORT's
        for depth in (40, 40):  # the filled cache made once, then kept: both generations checked at the depth
            tokens, top = _generate(session, prepared, depth)
            agree, found = _checked(prepared, tokens, top, depth)
            assert agree and found["step_logit_max_diff"] < 1e-4, found
        facts = session.facts
        assert facts["llama_cpp_python_version"] and facts["gguf_file_type"] == 0 and session.precision == "fp32"
        assert facts["model_file"] == Path(prepared.gguf_files["fp32"]).name and facts["context_size"] <= 4096
    finally:
        session.close()


@needs_it
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_are_read_back(prepared: PreparedModel, threads: int) -> None:
    session = _load(prepared, Path(prepared.gguf_files["fp32"]), threads)
    try:
        facts = session.facts
        assert facts["native_threads"] == facts["native_threads_batch"] == threads
        assert f"--native-threads {threads}" in facts["native_threads_source"]
    finally:
        session.close()


@needs_it
def test_a_planted_fault_fails_the_check(prepared: PreparedModel, tmp_path: Path) -> None:
    """The node engine's and the page's planted fault: the largest weight (the embeddings) ×1.05."""
    import torch

    from harness.prepare.workload import build_module

    module, _ = build_module(prepared.spec)
    model = module.model
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.05)
    path = tmp_path / "scaled.gguf"
    gguf_export.write_gguf(model, model.config, path, "fp32")
    session = _load(prepared, path)
    try:
        tokens, top = _generate(session, prepared)
    finally:
        session.close()
    agree, found = _checked(prepared, tokens, top)
    assert not agree and found["token_parity"].startswith("mismatch"), found


@needs_it
def test_a_longer_generation_grows_the_context(prepared: PreparedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.native.llamacpp_python_backend.CONTEXT_CAP", SHAPE[1])  # llama.cpp pads it to 256
    session = _load(prepared, Path(prepared.gguf_files["fp32"]))
    try:
        made = session.facts["context_size"]
        tokens, top = _generate(session, prepared, depth=made)  # a filler as long as the whole context
        assert session.facts["context_size"] >= made + SHAPE[1] + NEW_TOKENS, session.facts
        assert _checked(prepared, tokens, top, made)[0]
    finally:
        session.close()


@needs_it
def test_batch_above_one_is_unsupported(prepared: PreparedModel) -> None:
    session = _load(prepared, Path(prepared.gguf_files["fp32"]))
    try:
        feeds, _ = prepared.load_case(SHAPE)
        with pytest.raises(UnsupportedError, match="batch 1 only"):
            session.prepare({k: np.repeat(v, 2, axis=0) for k, v in feeds.items()})
    finally:
        session.close()


@needs_it
@pytest.mark.slow
def test_a_native_run_stores_its_rows_checked(tmp_path: Path) -> None:
    import duckdb

    db = tmp_path / "r.duckdb"
    done = run_cli("native", "--model", "llama-tiny", "--engines", "onnxruntime,llama-cpp-python", "--mode",
                   "generate", "--new-tokens", str(NEW_TOKENS), "--native-threads", "1", "--sequence-lengths",
                   str(SHAPE[1]), "--depths", "0,32", "--iterations", "3", "--warmup", "1", "--min-duration", "0",
                   "--db", str(db), "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with duckdb.connect(str(db), read_only=True) as store:
        rows = store.execute("select engine, depth, status, details, generated_tokens, memory_peak_mb, "
                             "decode_tokens_per_s from results").fetchall()  # fmt: skip
    found = {(engine, depth): (status, json.loads(details), tokens, memory, decode)
             for engine, depth, status, details, tokens, memory, decode in rows}  # fmt: skip
    assert all(status == "ok" for status, *_ in found.values()) and len(found) == 4, found
    for depth in (0, 32):
        _, details, tokens, memory, decode = found[("llama-cpp-python", depth)]
        assert tokens == found[("onnxruntime", depth)][2] and memory > 0 and decode > 0
        assert details["token_parity"].startswith(f"all {NEW_TOKENS} tokens"), details["token_parity"]
        assert details["step_logit_max_diff"] < 1e-4 and "step_top" not in details and details["native_threads"] == 1
