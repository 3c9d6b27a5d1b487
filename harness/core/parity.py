"""Output parity against the torch fp32 reference, with a tolerance per precision that ran.

A NaN or an infinity never compares as small: an element that is non-finite on one side and
finite on the other is a mismatch however close the rest is, and the row names the output and
counts them. The differences and the tolerance's scale come from the elements finite on both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from harness.core.precision import per_graph

# (absolute, relative-to-the-reference's-largest-magnitude) tolerance per precision actually used.
TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-3, 1e-3),
    "fp16": (1e-2, 1e-2),
    "bf16": (5e-2, 5e-2),
    # Dynamic int8 (per-channel weights) measured at batch 1-4, seq 16-128: the real all-MiniLM-L6-v2
    # weights are off by up to 0.13 of max|ref| on torch (activations in 7 bits on x86) and 0.09 on
    # ORT; the tiny random models by up to 0.08 abs (clip-tiny, on embeddings of magnitude 0.46).
    # (0.1, 0.2) passes those with ~1.5x headroom and still flags a conversion that is wrong, whose
    # error is of the order of the outputs themselves.
    "int8": (1e-1, 2e-1),
    # int4 weight-only (MatMulNBits, blocks of 32, symmetric) measured at batch 1-4, seq 16-128 on ORT
    # CPU: the real all-MiniLM-L6-v2 weights are off by up to 0.73 abs, 0.12 of max|ref| (int8: 0.09);
    # the tiny random bert and llama (ORT and OpenVINO) by 0.066 of max|ref|, a random 3-MatMul MLP (wasm
    # and webgpu too) by 0.16; q4f16 as q4 to 3 digits. The int8 tolerance passes those with 1.3-3x
    # headroom. A 160 M-parameter llama with random weights is off by 0.43 of max|ref| (bench/int4.py,
    # native and wasm alike: what int4 does to those weights): a mismatch at this tolerance, left so, since
    # loosening it to pass would pass a conversion whose error is of the order of the outputs themselves.
    "q4": (1e-1, 2e-1),
    "q4f16": (1e-1, 2e-1),
}


@dataclass(frozen=True)
class NonFinite:
    """One output's elements whose finiteness disagrees with the reference."""

    output: str
    size: int  # elements in the output
    nan: int  # NaN here, finite in the reference
    inf: int  # ±inf here, finite in the reference
    against_non_finite: int  # the reference is NaN/±inf and this output holds something else

    @property
    def text(self) -> str:
        parts = []
        if self.nan or self.inf:
            parts.append(
                f"{self.nan + self.inf} of {self.size} values non-finite ({self.nan} NaN, {self.inf} inf) "
                "where the reference is finite"
            )
        if self.against_non_finite:
            parts.append(f"{self.against_non_finite} of {self.size} values differ where the reference is NaN/inf")
        return f"output '{self.output}': " + "; ".join(parts)


@dataclass(frozen=True)
class Parity:
    # Over the elements finite on both sides; None when non-finite values disagree (the difference is unbounded).
    max_abs_diff: float | None
    max_rel_diff: float | None  # max_abs_diff relative to max |reference|
    tolerance: float
    matches: bool
    non_finite: tuple[NonFinite, ...] = ()

    @property
    def status(self) -> str:
        return "ok" if self.matches else "mismatch"

    @property
    def error(self) -> str | None:
        """Why the outputs do not match, or None when they do."""
        if self.non_finite:
            return "; ".join(item.text for item in self.non_finite)
        if not self.matches:
            return f"max_abs_diff {self.max_abs_diff:.3g} exceeds tolerance {self.tolerance:.3g}"
        return None

    @property
    def fields(self) -> dict[str, float | None]:
        """The Result fields the comparison fills."""
        return {"max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff}

    @property
    def details(self) -> dict[str, Any]:
        found: dict[str, Any] = {"parity_tolerance": self.tolerance}
        if self.non_finite:
            found["non_finite_outputs"] = [asdict(item) for item in self.non_finite]
        return found


def _non_finite(name: str, got: np.ndarray, want: np.ndarray) -> NonFinite | None:
    got_finite, want_finite = np.isfinite(got), np.isfinite(want)
    here = ~got_finite & want_finite
    # equal infinities, or NaN against NaN, agree
    agree = (got == want) | (np.isnan(got) & np.isnan(want))
    there = ~want_finite & ~agree
    if not here.any() and not there.any():
        return None
    nan = int(np.isnan(got[here]).sum())
    return NonFinite(name, int(got.size), nan, int(here.sum()) - nan, int(there.sum()))


def compare(
    outputs: list[np.ndarray], reference: list[np.ndarray], precision: str, names: Sequence[str] = ()
) -> Parity:
    """Compare every output with the reference; shapes must agree. names label the outputs in
    messages (the model's output names, in order); without them the i-th output is '#i'."""
    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs against {len(reference)} reference outputs")
    max_abs, scale, non_finite = 0.0, 0.0, []
    for i, (got, want) in enumerate(zip(outputs, reference, strict=True)):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            raise ValueError(f"output shape {got.shape} differs from the reference's {want.shape}")
        if (problem := _non_finite(names[i] if i < len(names) else f"#{i}", got, want)) is not None:
            non_finite.append(problem)
        both = np.isfinite(got) & np.isfinite(want)
        if both.any():
            max_abs = max(max_abs, float(np.max(np.abs(got[both] - want[both]))))
        finite_want = want[np.isfinite(want)]
        if finite_want.size:
            scale = max(scale, float(np.max(np.abs(finite_want))))
    atol, rtol = loosest(precision, lambda one: TOLERANCES.get(one, TOLERANCES["fp32"]))
    tolerance = atol + rtol * scale
    if non_finite:
        return Parity(None, None, tolerance, False, tuple(non_finite))
    max_rel = max_abs / scale if scale > 0 else max_abs
    return Parity(max_abs, max_rel, tolerance, bool(max_abs <= tolerance))


# (absolute, relative to the step's largest |logit|): how far a generation's logits may be from native ONNX
# Runtime CPU's on the same graph file at every step (harness.core.generation.token_check), per (precision,
# side): "browser" (onnxruntime-web, wasm or WebGPU) or "native" (another native loop on the CPU, e.g.
# onnxruntime-genai, or ORT's own timed loop). Both sides run the same weights in the same precision, so only
# the kernels differ: much tighter than TOLERANCES (against the fp32 model). Where a token differs from
# native's argmax, native's top-1 logit minus its logit of that token must be below twice the tolerance at that
# step: two sides within it can only swap a near tie. Measured by bench/token_gaps.py (docs/measurement.md).
GGML_SIDE = "ggml"  # the side of a check of llama.cpp's kernels (native or in the page) against native ORT's
MODULE_SIDE = "module"  # an engine's own module of the same weights (torch eager) against native ORT on their export
LOGIT_TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {
    ("fp32", "browser"): (1e-4, 1e-4),
    ("fp16", "browser"): (1e-2, 1e-2),
    # SmolLM2-135M's onnxruntime-genai int4 file, whose MatMulNBits quantize activations to int8 on the CPU
    # (accuracy level 4) and not in wasm: 0.57 logits off at a step whose largest is 29 (1.9%)
    ("q4", "browser"): (5e-3, 3e-2),
    ("q4f16", "browser"): (1e-2, 3e-2),
    # llama.cpp's own kernels (ggml) on an F32 GGUF against native ORT on the fp32 graph of the same weights, natively
    # and in the page (whose values are log-probabilities, against ORT's log-softmax): on real SmolLM2-135M, 32 steps,
    # a top-8 logit up to 0.0138 off (native, 1 and 2 threads) and 0.0107 (wasm) at steps whose largest |logit| is
    # ~20, at most 6.4e-4 of the step's largest; llama-tiny's embedding scaled by 1.05 moves them by 0.029 at a
    # scale of 0.5
    ("fp32", GGML_SIDE): (1e-4, 1e-3),
    # torch eager's fp32 module against native ORT CPU on the fp32 export of the same weights (its own kernels, its own
    # op order; harness.prepare.quality.module_check): a top-8 logit up to 7.6e-6 off on the tiny specs, 4.6e-5 on real
    # SmolLM2-135M and 2.7e-5 on real whisper-tiny.en at steps whose largest |logit| is ~32 (1.7e-6 of it); llama-tiny's
    # layer-0 down_proj x1.05 in torch moves one by 5.3e-4, 3.6x this tolerance (docs/measurement.md)
    ("fp32", MODULE_SIDE): (1e-4, 1e-4),
    ("fp32", "native"): (1e-4, 1e-4),
    ("fp16", "native"): (1e-4, 1e-4),
    ("q4", "native"): (1e-4, 1e-4),
    ("q4f16", "native"): (1e-4, 1e-4),
}


def logit_tolerance(precision: str, side: str) -> tuple[float, float]:
    """A precision's same-graph logit tolerance on a side (LOGIT_TOLERANCES); a precision not measured there
    (int8, bf16) takes its output tolerance against the fp32 model, the loosest the harness holds it to."""
    return loosest(precision, lambda one: LOGIT_TOLERANCES.get((one, side)) or TOLERANCES.get(one, TOLERANCES["fp32"]))


def loosest(precision: str, tolerance: Callable[[str], tuple[float, float]]) -> tuple[float, float]:
    """A precision's tolerance; a per-graph one's (encoder=fp32,decoder=q4) the loosest of its graphs': the
    output carries the error of every graph it went through."""
    parts = per_graph(precision)
    found = [tolerance(one) for one in (parts.values() if parts is not None else [precision])]
    return max(atol for atol, _ in found), max(rtol for _, rtol in found)
