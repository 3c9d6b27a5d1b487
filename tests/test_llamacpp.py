"""llama.cpp as a native engine, on the GGUF the harness writes itself: real node, real node-llama-cpp prebuilt binary,
real GGUFs of llama-tiny's weights, checked against native ONNX Runtime's greedy generation on the fp32 export.

llama-tiny's random weights make it repeat one token, so equal tokens alone prove little: each generation's top-8
logits per step are compared with native ORT's teacher-forced logits (harness.core.generation.token_check), and
the planted faults (one weight ×1.05; Q/K not permuted) must fail that check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from harness.core.generation import StepTop, token_check
from harness.core.parity import GGML_SIDE
from harness.native.base import LoadRequest, UnsupportedError
from harness.native.llamacpp_backend import BACKEND, NODE_MODULES
from harness.prepare import gguf_export
from harness.prepare.prepared import PreparedModel, PrepareJob, needs_torch, prepare_model
from harness.prepare.specs import load_specs

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not NODE_MODULES.is_dir(),
    reason="node or native/llamacpp/node_modules is missing (`make setup` installs node-llama-cpp)",
)

SHAPE = (1, 16)
NEW_TOKENS = 8
TARGET = BACKEND.targets()[0]


def _job(**fields: object) -> PrepareJob:
    spec = load_specs()["llama-tiny"]
    return PrepareJob(spec, [SHAPE], with_past=True, plain=False, reference_tokens=NEW_TOKENS,
                      gguf_precisions=("fp32",), **fields)  # type: ignore[arg-type]  # fmt: skip


@pytest.fixture(scope="module")
def prepared() -> PreparedModel:
    return next(prepare_model(_job()))


def _generate(prepared: PreparedModel, gguf: Path, threads: int | None = 1) -> tuple[list[int], StepTop, dict]:
    feeds, _ = prepared.load_case(SHAPE)
    session = BACKEND.load(LoadRequest(prepared.spec, None, "fp32", threads=threads, gguf_path=gguf), TARGET)
    try:
        ids = session.prepare(feeds)
        stamps: list[int] = []
        made = session.generate(ids, NEW_TOKENS, lambda: stamps.append(1))
        assert made == NEW_TOKENS == len(stamps)
        assert session.step_top is not None
        return session.generated[0].tolist(), StepTop(*session.step_top), dict(session.facts)
    finally:
        session.close()


def _checked(prepared: PreparedModel, tokens: list[int], top: StepTop) -> tuple[bool, dict]:
    from harness.prepare.quality import forced

    feeds, _ = prepared.load_case(SHAPE)
    prompt = {k: feeds[k] for k in ("input_ids", "attention_mask")}
    assert prepared.onnx_past_path is not None
    logits = forced(prepared.onnx_past_path, prompt, np.asarray([tokens]))[:, -len(tokens) :]
    return token_check([tokens], logits, "fp32", GGML_SIDE, top)


def test_the_gguf_f32_generates_native_orts_tokens(prepared: PreparedModel) -> None:
    assert prepared.gguf_error is None and set(prepared.gguf_files) == {"fp32"}
    assert prepared.gguf_facts["fp32"]["gguf_file_type"] == "F32"
    assert prepared.gguf_facts["fp32"]["gguf_vocab"] == "synthetic"
    tokens, top, facts = _generate(prepared, Path(prepared.gguf_files["fp32"]))
    reference = prepared.load_generation(SHAPE, NEW_TOKENS)
    assert reference is not None
    assert tokens == reference.tokens[0].tolist()  # native ORT's greedy loop on the fp32 export with past
    agree, found = _checked(prepared, tokens, top)
    assert agree, found
    assert found["step_logit_max_diff"] < 1e-4  # every step's top-8 logits: llama.cpp's F32 kernels against ORT's
    assert facts["llama_cpp_binary"] == "prebuilt, cpu" and facts["node_llama_cpp_version"] == "3.22.1"
    assert facts["gguf_file_type"] == 0 and facts["model_file"] == Path(prepared.gguf_files["fp32"]).name


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_are_read_back(prepared: PreparedModel, threads: int) -> None:
    _, _, facts = _generate(prepared, Path(prepared.gguf_files["fp32"]), threads)
    assert facts["native_threads"] == threads
    assert f"--native-threads {threads}" in facts["native_threads_source"]


def test_a_warm_cache_needs_no_torch_and_gives_the_same_gguf(prepared: PreparedModel) -> None:
    assert not needs_torch(_job())
    again = next(prepare_model(_job()))
    assert again.gguf_files == prepared.gguf_files and again.gguf_facts == prepared.gguf_facts


def _planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> Path:
    import torch

    from harness.prepare.workload import build_module

    module, _ = build_module(load_specs()["llama-tiny"])
    model = module.model
    if fault == "scaled":  # the page's planted fault too (harness.browser.runtimes.served_gguf): the largest weight
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.05)
    else:
        monkeypatch.setattr(gguf_export, "permute", lambda weights, n_head, n_head_kv: weights)
    path = tmp_path / f"{fault}.gguf"
    gguf_export.write_gguf(model, model.config, path, "fp32")
    return path


@pytest.mark.parametrize("fault", ["scaled", "unpermuted"])
def test_a_planted_fault_fails_the_check(prepared: PreparedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         fault: str) -> None:  # fmt: skip
    tokens, top, _ = _generate(prepared, _planted(tmp_path, monkeypatch, fault))
    agree, found = _checked(prepared, tokens, top)
    assert not agree and found["token_parity"].startswith("mismatch"), found


def test_each_precision_is_written_and_read_back(prepared: PreparedModel, tmp_path: Path) -> None:
    """q4 is Q4_0 by gguf-py's own quantizer, int8 Q8_0, fp16 F16; norms stay F32; llama.cpp reads each file type
    back as the precision that ran."""
    import torch

    from harness.prepare.workload import build_module

    module, _ = build_module(prepared.spec)
    model = module.model
    for precision, kind, file_type in [("fp16", "F16", 1), ("q4", "Q4_0", 2), ("int8", "Q8_0", 7)]:
        path = tmp_path / f"{precision}.gguf"
        with torch.no_grad():
            facts = gguf_export.write_gguf(model, model.config, path, precision)
        assert facts["gguf_tensor_types"] == {"F32": 6, kind: 15}, facts  # tied: no output; F32 the 5 norms, rope_freqs
        request = LoadRequest(prepared.spec, None, precision, threads=1, gguf_path=path)
        session = BACKEND.load(request, TARGET)
        try:
            assert session.precision == precision and session.facts["gguf_file_type"] == file_type
        finally:
            session.close()


def test_what_it_cannot_run_is_unsupported_with_its_reason(prepared: PreparedModel) -> None:
    assert "llama-family" in (gguf_export.why_not("bert", "fp32") or "")
    assert "bf16" in (gguf_export.why_not("llama", "bf16") or "")
    with pytest.raises(UnsupportedError, match="none at fp32: not written for this test"):
        BACKEND.load(LoadRequest(prepared.spec, None, "fp32", gguf_error="not written for this test"), TARGET)
    session = BACKEND.load(LoadRequest(prepared.spec, None, "fp32", gguf_path=Path(prepared.gguf_files["fp32"])),
                           TARGET)  # fmt: skip
    try:
        feeds, _ = prepared.load_case(SHAPE)
        with pytest.raises(UnsupportedError, match="batch 1 only"):
            session.prepare({k: np.repeat(v, 2, axis=0) for k, v in feeds.items()})
    finally:
        session.close()


def test_probe_proves_the_binary_loads() -> None:
    found = BACKEND.probe(TARGET)
    assert found.ok and "prebuilt" in found.reason, found.reason


def test_a_native_run_stores_both_engines_rows_checked(tmp_path: Path) -> None:
    import duckdb

    db = tmp_path / "r.duckdb"
    done = run_cli("native", "--model", "llama-tiny", "--engines", "onnxruntime,llama.cpp", "--mode", "generate",
                   "--new-tokens", str(NEW_TOKENS), "--native-threads", "1", "--sequence-lengths", str(SHAPE[1]),
                   "--iterations", "3", "--warmup", "1", "--min-duration", "0", "--db", str(db),
                   "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with duckdb.connect(str(db), read_only=True) as store:
        rows = store.execute("select engine, status, details, generated_tokens from results").fetchall()
        memory = dict(store.execute("select engine, [memory_peak_mb, memory_load_mb] from results").fetchall())
    found = {engine: (status, json.loads(details), tokens) for engine, status, details, tokens in rows}
    assert set(found) == {"onnxruntime", "llama.cpp"} and all(s == "ok" for s, _, _ in found.values()), found
    _, details, tokens = found["llama.cpp"]
    assert tokens == found["onnxruntime"][2]
    assert details["token_parity"].startswith(f"all {NEW_TOKENS} tokens"), details["token_parity"]
    assert details["step_logit_max_diff"] < 1e-4 and "step_top" not in details
    assert details["native_threads"] == 1 and details["llama_cpp_binary"] == "prebuilt, cpu"
    # the node runner holds llama.cpp's memory: the row's peak and load include it, and say so
    peak, load = memory["llama.cpp"]
    runner = details["runner_memory_peak_mb"]
    assert runner >= details["runner_rss_after_load_mb"] > 20 and peak > runner, (peak, details)
    assert load >= details["runner_rss_after_load_mb"] and "runner" in details["memory_covers"]


def test_its_rows_are_held_against_ort_cpu_ceilings_at_its_threads(tmp_path: Path) -> None:
    """llama.cpp runs no ONNX calibration graph: at --native-threads N the run measures ONNX Runtime's CPU EP's
    ceilings at N threads for it (ORT is not among --engines here) and its row is held against them; no ceiling
    of llama.cpp's own is attempted (it would fail as if the calibration graph were a model)."""
    import duckdb

    db = tmp_path / "c.duckdb"
    with pytest.MonkeyPatch.context() as patch:  # conftest makes --no-ceilings the suite's default
        patch.delenv("ACCELHARNESS_NO_CEILINGS")
        done = run_cli("native", "--model", "llama-tiny", "--engines", "llama.cpp", "--mode", "generate",
                       "--new-tokens", "4", "--native-threads", "1", "--sequence-lengths", str(SHAPE[1]),
                       "--iterations", "3", "--warmup", "0", "--min-duration", "0", "--db", str(db), "--no-reports",
                       "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with duckdb.connect(str(db), read_only=True) as store:
        ceilings = store.execute("select engine, provider, kind, value from ceilings").fetchall()
        (row,) = store.execute("select status, achieved_gbps, bandwidth_fraction from results").fetchall()
    assert {(e, p) for e, p, _, _ in ceilings} == {("onnxruntime", "CPUExecutionProvider:threads=1")}, ceilings
    bandwidth = next(value for _, _, kind, value in ceilings if kind == "bandwidth")
    status, achieved, fraction = row
    assert status == "ok" and bandwidth > 0 and fraction == pytest.approx(achieved / bandwidth)


def test_child_memory_is_the_childs_own_high_water_mark() -> None:
    """ChildMemory reads the runner's peak, not the worker's and not its RSS now: a child that touches 200 MB and
    frees it again reads at least 200 MB."""
    import subprocess
    import sys

    from harness.native.llamacpp_backend import ChildMemory

    code = (
        "import sys; sys.stdin.readline(); b = b'x' * (200 << 20); del b; print('done', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        facts: dict = {}
        memory = ChildMemory(child.pid, facts)
        memory.reset()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        assert memory.rss_mb() < 100 <= 200 <= memory.peak_mb() == facts["runner_memory_peak_mb"], facts
        assert facts["runner_memory_method"] in ("vmhwm", "sampling")
    finally:
        child.kill()
        child.wait()
