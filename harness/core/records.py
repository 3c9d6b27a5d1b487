"""The typed records every backend, native or browser, produces and the store maps to rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING, Any

from harness.core.labels import target_label
from harness.core.precision import AUTO, MEANINGS

if TYPE_CHECKING:  # core.profiles imports onnx (via the graph counts); a Result only carries its rows
    from harness.core.profiles import OperatorRow

STATUSES = ("ok", "unsupported", "error", "timeout", "oom", "mismatch")
# Every precision a user may ask for: the one table (harness.core.precision.MEANINGS), then auto (whatever
# the engine picks by default). Every row records the precision that actually ran.
PRECISIONS = (*MEANINGS, AUTO)


@dataclass(frozen=True)
class Target:
    """Where a job runs: a hardware platform, the engine, and its provider/device on it."""

    hardware: str  # cpu, cuda, rocm, mps, openvino, qnn, directml, wasm, webgpu, webnn
    engine: str  # torch, onnxruntime, openvino, onnxruntime-web
    provider: str  # torch device, ORT execution provider, OpenVINO device, ORT-web EP
    device: str | None = None  # a device served by `web --serve` (its id); None: this machine or its browser

    @property
    def label(self) -> str:
        return target_label(vars(self))


MODES = ("inference", "generate", "training")
MEASURED = ("ok", "mismatch")  # statuses whose row holds timings
SAMPLE_FIELDS = ("samples_ms", "ttft_samples_ms", "tpot_samples_ms")
NUMBER_FIELDS = (
    "load_ms", "first_run_ms", "memory_load_mb", "memory_peak_mb", "device_memory_peak_mb", "max_abs_diff",
    "max_rel_diff", "load_avg_1m", "cpu_percent", "compile_ms", "energy_j_per_item",
)  # fmt: skip
# The work a row's graph implies (harness.core.graph_cost.generation_work / inference_work), counted not run:
# generate rows per decode token (bytes read, FLOPs) and per prompt token (FLOPs); inference rows per item.
WORK_FIELDS = ("bytes_per_token", "flops_per_token", "prefill_flops_per_token", "bytes_per_item", "flops_per_item")


class UnsupportedError(RuntimeError):
    """This model, precision or mode cannot run on this target here; recorded as status `unsupported`."""


class ResultError(ValueError):
    """A Result breaks an invariant: it must not be stored as it is."""


def _is_finite(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Case:
    batch_size: int
    seq_len: int | None  # None where the model's inputs have no sequence axis
    precision: str  # as requested
    mode: str = "inference"  # inference | generate (TTFT/TPOT) | training (forward+backward+step)
    new_tokens: int | None = None  # generate mode: exactly this many tokens per sequence
    # generate mode: tokens of KV cache filled (untimed) before the prompt (llama-bench's -d); None: not planned
    depth: int | None = None
    # generate mode, speech: the seconds of audio fed (--audio-seconds); None: the encoder's whole window
    audio_seconds: int | None = None

    @property
    def key(self) -> str:
        key = f"b{self.batch_size}" + (f"_s{self.seq_len}" if self.seq_len else "") + f"_{self.precision}"
        if self.mode == "generate":  # depth 0 and the whole window keep the keys runs made before stored
            audio = f"_a{self.audio_seconds}" if self.audio_seconds is not None else ""
            return f"{key}_gen{self.new_tokens}" + (f"_d{self.depth}" if self.depth else "") + audio
        return key if self.mode == "inference" else f"{key}_{self.mode}"


VARIANTS = ("a", "b")  # the two sides of an `accelharness ab` run


def result_key(model: str, target: Target, case: Case, variant: str | None = None) -> str:
    """What makes a result unique within a run: --resume skips the keys a run already holds."""
    key = f"{model}|{target.hardware}|{target.engine}|{target.provider}|{case.key}"
    key = f"{key}|@{target.device}" if target.device else key
    return f"{key}|~{variant}" if variant else key


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
    # generate mode: each timed generation's decode steps (ms), and the token ids its first generation
    # produced (one list per batch row), for token-level parity (harness.core.generation)
    step_samples_ms: list[list[float]] = field(default_factory=list)
    generated_tokens: list[list[int]] | None = None
    # generate mode: the prompt's ids (one list per batch row), every row's generated tokens as the model's
    # tokenizer decodes them (output_texts; output_text the first's; None: it has none), and whether the
    # generation stopped at EOS (the policy that ran)
    prompt_ids: list[list[int]] | None = None
    output_text: str | None = None
    output_texts: list[str] | None = None
    stop_at_eos: bool | None = None
    compile_ms: float | None = None  # JIT engines: compile time, kept out of the latency samples
    energy_j_per_item: float | None = None  # only from a real sensor (RAPL, NVML)
    bytes_per_token: float | None = None  # WORK_FIELDS: None where the graph was not counted
    flops_per_token: float | None = None
    prefill_flops_per_token: float | None = None
    bytes_per_item: float | None = None
    flops_per_item: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    operators: list[OperatorRow] = field(default_factory=list)  # --profile: where the time went, per operator
    variant: str | None = None  # `ab` runs: which side (a or b) this row measured
    sample_rounds: list[int] = field(default_factory=list)  # `ab` runs: the round each sample was taken in

    @property
    def key(self) -> str:
        return result_key(self.model, self.target, self.case, self.variant)

    def __post_init__(self) -> None:
        if self.precision is None and isinstance(self.case, Case):
            self.precision = self.case.precision
        self.validate()

    def validate(self) -> None:
        """Raise ResultError naming every broken invariant. __post_init__ checks each Result built
        here; one that arrives unpickled (from a Ray node) skipped that and is checked again."""
        if problems := self.problems():
            raise ResultError("; ".join(problems))

    def problems(self) -> list[str]:
        found = [f"{name} must be a non-empty string" for name in ("model", "family", "weights", "precision")
                 if not isinstance(getattr(self, name), str) or not getattr(self, name)]  # fmt: skip
        if not isinstance(self.target, Target) or not isinstance(self.case, Case):
            found.append("target and case must be a Target and a Case")
        if self.status not in STATUSES:
            found.append(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        elif self.status != "ok" and not (isinstance(self.error, str) and self.error.strip()):
            found.append(f"status '{self.status}' needs the reason in error")
        for name in SAMPLE_FIELDS:
            values = getattr(self, name)
            bad = [v for v in values if not _is_finite(v) or v <= 0] if isinstance(values, list) else [values]
            if bad:
                found.append(f"{name} must hold finite numbers > 0 ({len(bad)} do not, e.g. {bad[0]!r})")
        found += self._generation_problems()
        if self.status in MEASURED and not self.samples_ms:
            found.append(f"status '{self.status}' needs latency samples")
        found += [f"{name} must be a finite number or None (got {getattr(self, name)!r})"
                  for name in (*NUMBER_FIELDS, *WORK_FIELDS)
                  if getattr(self, name) is not None and not _is_finite(getattr(self, name))]  # fmt: skip
        if not isinstance(self.details, dict):
            found.append("details must be a dict")
        if self.operators and self.status not in MEASURED:
            found.append(f"status '{self.status}' has no measurement for operator rows to profile")
        if self.variant not in (None, *VARIANTS):
            found.append(f"variant {self.variant!r} is not one of {', '.join(VARIANTS)}")
        if self.sample_rounds and len(self.sample_rounds) != len(self.samples_ms):
            found.append(f"sample_rounds holds {len(self.sample_rounds)} rounds for {len(self.samples_ms)} samples")
        bad = [op for op in self.operators if not (_is_finite(op.total_ms) and op.total_ms >= 0 and op.calls >= 1)]
        if bad:
            found.append(f"operators need finite times >= 0 and calls >= 1 ({len(bad)} do not, e.g. {bad[0].node!r})")
        return found

    def _generation_problems(self) -> list[str]:
        found = []
        if self.step_samples_ms and len(self.step_samples_ms) != len(self.samples_ms):
            found.append(f"step_samples_ms holds {len(self.step_samples_ms)} generations for {len(self.samples_ms)}")
        steps = [s for each in self.step_samples_ms for s in each]
        if any(not _is_finite(s) or s <= 0 for s in steps):
            found.append("step_samples_ms must hold finite numbers > 0")
        for name in ("generated_tokens", "prompt_ids"):
            tokens = getattr(self, name)
            if tokens is not None and not all(isinstance(t, int) and t >= 0 for row in tokens for t in row):
                found.append(f"{name} must hold token ids (integers >= 0)")
        return found


@dataclass
class Control:
    """One measurement of a run's fixed control workload (harness.run.control) on a target: how fast
    the machine itself was at that point of the run, so that compare can tell the machine's drift
    between two runs from a change of the code. error: why it could not be measured (samples empty)."""

    workload: str
    target: Target
    position: str  # start | middle | end of the (model, target) job it was measured beside
    beside: str  # that job's model
    samples_ms: list[float] = field(default_factory=list)
    load_avg_1m: float | None = None
    error: str | None = None


@dataclass
class Ceiling:
    """One measured ceiling of a target (harness.run.ceilings; the figures: harness.core.roofline): a
    calibration graph of known work (`amount`: bytes moved or FLOPs per run) timed through the target's
    engine under a result's timing rules. error: why it could not be measured (samples empty)."""

    target: Target
    kind: str  # harness.core.roofline.CEILING_KINDS
    precision: str  # compute: the precision class (fp32, int4); bandwidth: roofline.BANDWIDTH_CLASS
    workload: str  # the calibration graph's name
    amount: float
    samples_ms: list[float] = field(default_factory=list)
    software_adapter: bool = False  # WebGPU on a software (fallback) adapter: flagged as its results are
    load_avg_1m: float | None = None
    error: str | None = None
    budget_ms: float | None = None  # the time one run's size was chosen to fit (harness.run.ceilings)
    sizing: str | None = None  # how that size was chosen: each probe's size and measured time
    software: str | None = None  # what measured it (engine, browser, adapter): what a later run must match to reuse it
    calibration_s: float | None = None  # the calibration's own wall time, probes and loads included
    reused_from: str | None = None  # the run that measured it, when this run copied it (harness.run.ceiling_reuse)
    measured_at: Any = None  # a copy's: when the original was measured (None: now, as it is stored)
