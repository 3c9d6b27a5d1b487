"""Issue 45: torch's rows count and check like the others. torch's greedy loop (native/torch_greedy.py) makes native
ORT's tokens on the same weights, after a KV cache filled to a depth too; each step's top logits are checked against
native ORT teacher-forced on the fp32 export (harness.prepare.quality.module_check, MODULE_SIDE's tolerance), and a
decoder weight planted x1.05 is a mismatch; its ceilings run the calibration graphs as torch ops. In-process, on
llama-tiny: a few seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from harness.core.generation import StepTop
from harness.core.parity import MODULE_SIDE, logit_tolerance
from harness.core.records import Target
from harness.native import get_backend
from harness.native.base import LoadRequest
from harness.prepare.greedy import reference_generation
from harness.prepare.prepared import PreparedModel, PrepareJob, prepare_model
from harness.prepare.quality import module_check
from harness.prepare.specs import load_specs
from harness.run import ceilings as ceilings_module
from harness.run.ceilings import CALIBRATIONS, calibration_feeds, calibration_path, measure_ceilings

TOKENS = 4
TORCH_CPU = Target("cpu", "torch", "cpu")


@pytest.fixture(scope="module")
def llama() -> tuple[PreparedModel, dict[str, np.ndarray]]:
    prepared = next(prepare_model(PrepareJob(load_specs()["llama-tiny"], [(2, 8)], with_past=True)))
    assert prepared.onnx_past_path is not None, prepared.onnx_past_error
    feeds, _ = prepared.load_case((2, 8))
    return prepared, {name: feeds[name] for name in ("input_ids", "attention_mask")}


def generated(session: Any, feeds: dict[str, np.ndarray], depth: int) -> tuple[list[list[int]], StepTop]:
    """One generation of the case (its first: the one that keeps its top logits), timed as measure_generation does."""
    stamps: list[int] = []
    made = session.generate(session.prepare(feeds), TOKENS, lambda: stamps.append(1), depth=depth)
    assert made == len(stamps) == TOKENS
    top = session.facts["step_top"]
    return session.generated.tolist(), StepTop(np.asarray(top["ids"]), np.asarray(top["values"], dtype=np.float64))


@pytest.mark.parametrize("depth", [0, 8])
def test_torch_makes_native_orts_tokens_and_passes_the_check_at_a_depth_too(llama: Any, depth: int) -> None:
    prepared, feeds = llama
    session = get_backend("torch").load(LoadRequest(prepared.spec, None, "fp32"), TORCH_CPU)
    assert session.fills_cache  # measure_generation hands it the depth and starts its clock at begin()
    tokens, top = generated(session, feeds, depth)
    expected = reference_generation(prepared.onnx_past_path, feeds, TOKENS, depth=depth).tokens
    assert tokens == expected.tolist()
    agree, facts = module_check(prepared.onnx_past_path, feeds, tokens, "fp32", top, depth)
    atol, rtol = logit_tolerance("fp32", MODULE_SIDE)
    assert agree and facts["token_parity"] == f"all {TOKENS} tokens of every row equal native ORT's on the same graph"
    assert facts["step_logit_max_diff"] <= atol and facts["step_logit_tolerance"] == [atol, rtol]
    assert facts["tokens_against"]["first_divergence"] is None and "fp32 export" in facts["token_reference"]


def test_a_planted_torch_weight_is_a_mismatch_and_another_precision_is_not_checked(llama: Any) -> None:
    prepared, feeds = llama
    session = get_backend("torch").load(LoadRequest(prepared.spec, None, "fp32"), TORCH_CPU)
    with torch.no_grad():
        session.module.model.model.layers[0].mlp.down_proj.weight.mul_(1.05)
    tokens, top = generated(session, feeds, 0)
    agree, facts = module_check(prepared.onnx_past_path, feeds, tokens, "fp32", top)
    assert agree is False and facts["token_parity"].startswith("mismatch: "), facts["token_parity"]
    assert "differs from native ORT's" in facts["token_parity"]
    agree, facts = module_check(prepared.onnx_past_path, feeds, tokens, "bf16", top)
    assert agree is None and facts["token_parity"].startswith("not checked: bf16 is the engine's own cast")


def test_torch_ceilings_run_the_calibration_graphs_as_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each graph's answer is ORT's on the same file (the second run writes in place); bandwidth and fp32 compute are
    measured through torch, the int4 graph's MatMulNBits holds why torch has no ceiling there."""
    torch_backend = get_backend("torch")
    calibrations = [c for c in CALIBRATIONS if c.kind != "bandwidth_large"]  # its 256 MiB graph: test_roofline.py
    for calibration in calibrations[:2]:
        size = calibration.sizes[0]
        path, feeds = calibration_path(calibration, size), calibration_feeds(calibration, size)
        session = torch_backend.load_calibration(path, TORCH_CPU)
        prepared = session.prepare(feeds)
        answers = [session.to_numpy(session.run(prepared))[0] for _ in range(2)]
        expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        for answer in answers:
            np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(ceilings_module, "CEILING_BUDGET_MS", 0.05)  # the smallest sizes: a quick measurement
    found = {c.precision: c for c in measure_ceilings(torch_backend, TORCH_CPU, calibrations)}
    for cls in ("bytes", "fp32"):
        assert found[cls].error is None and len(found[cls].samples_ms) >= 3 and "torch_version=" in found[cls].software
    assert not found["int4"].samples_ms and "MatMulNBits" in found["int4"].error
