"""What each precision means in ONNX terms, and how a row says the engine computed in another one.

A precision names two things: how the weights are stored and what the MatMuls compute in. An engine
may keep the weights asked for and compute in something else (ONNX Runtime's CPU EP casts an fp16
MatMul's weights back to fp32 on x86); the engine's own graph says so, and the row carries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# requested precision → (weights, MatMul compute). q4 / q4f16 are transformers.js's names: int4
# weight-only MatMulNBits with fp32 (q4) or fp16 (q4f16) activations.
MEANINGS: dict[str, tuple[str, str]] = {
    "fp32": ("fp32", "fp32"),
    "fp16": ("fp16", "fp16"),
    "bf16": ("bf16", "bf16"),
    "int8": ("int8", "int8"),
    "q4": ("int4", "fp32"),
    "q4f16": ("int4", "fp16"),
}
AUTO = "auto"  # the engine's default: no conversion asked for
INT4_PRECISIONS = tuple(name for name, (weights, _) in MEANINGS.items() if weights == "int4")


def compute_facts(requested: str, computed: Mapping[str, int], source: str) -> dict[str, Any]:
    """The details a row carries about what its engine computed in: weight MatMul nodes per compute
    precision, read from the engine (`source` says how), and the text of the P mark when some of them
    do not compute in what the requested precision means."""
    facts: dict[str, Any] = {"compute_precision": dict(computed), "compute_precision_source": source}
    weights, wanted = MEANINGS.get(requested, (requested, requested))
    total = sum(computed.values())
    other = {kind: count for kind, count in computed.items() if kind not in (wanted, "unknown")}
    if requested != AUTO and total and other:
        ran = ", ".join(f"{kind} compute: {count} of {total} MatMul" for kind, count in sorted(other.items()))
        facts["compute_precision_differs"] = f"{weights} weights, {ran}"
    return facts
