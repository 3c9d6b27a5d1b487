"""The typed records every backend, native or browser, produces and the store maps to rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "unsupported", "error", "timeout", "oom", "mismatch")
# auto: whatever the engine picks by default. Every row records the precision that actually ran.
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "auto")


@dataclass(frozen=True)
class Target:
    """Where a job runs: a hardware platform, the engine, and its provider/device on it."""

    hardware: str  # cpu, cuda, rocm, mps, openvino, qnn, directml, wasm, webgpu, webnn
    engine: str  # torch, onnxruntime, openvino, onnxruntime-web
    provider: str  # torch device, ORT execution provider, OpenVINO device, ORT-web EP

    @property
    def label(self) -> str:
        return f"{self.hardware}/{self.engine}" + (f":{self.provider}" if self.engine != "torch" else "")


MODES = ("inference", "generate", "training")


@dataclass(frozen=True)
class Case:
    batch_size: int
    seq_len: int | None  # None where the model's inputs have no sequence axis
    precision: str  # as requested
    mode: str = "inference"  # inference | generate (TTFT/TPOT) | training (forward+backward+step)
    new_tokens: int | None = None  # generate mode: exactly this many tokens per sequence

    @property
    def key(self) -> str:
        key = f"b{self.batch_size}" + (f"_s{self.seq_len}" if self.seq_len else "") + f"_{self.precision}"
        if self.mode == "generate":
            return f"{key}_gen{self.new_tokens}"
        return key if self.mode == "inference" else f"{key}_{self.mode}"


def result_key(model: str, target: Target, case: Case) -> str:
    """What makes a result unique within a run: --resume skips the keys a run already holds."""
    return f"{model}|{target.hardware}|{target.engine}|{target.provider}|{case.key}"


@dataclass
class Result:
    """One measured (or failed) case. Statistics are derived from samples_ms by the store."""

    model: str
    family: str
    weights: str
    target: Target
    case: Case
    status: str
    error: str | None = None
    precision: str | None = None  # what actually ran; defaults to the requested precision
    samples_ms: list[float] = field(default_factory=list)
    load_ms: float | None = None
    first_run_ms: float | None = None
    memory_load_mb: float | None = None
    memory_peak_mb: float | None = None
    device_memory_peak_mb: float | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    load_avg_1m: float | None = None
    cpu_percent: float | None = None
    ttft_samples_ms: list[float] = field(default_factory=list)  # generate mode, per iteration
    tpot_samples_ms: list[float] = field(default_factory=list)
    compile_ms: float | None = None  # JIT engines: compile time, kept out of the latency samples
    energy_j_per_item: float | None = None  # only from a real sensor (RAPL, NVML)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return result_key(self.model, self.target, self.case)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status '{self.status}' is not one of {STATUSES}")
        if self.precision is None:
            self.precision = self.case.precision
