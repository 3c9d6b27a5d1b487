"""PyTorch eager sessions on cpu / cuda / rocm / mps, with per-device synchronisation: what a torch
worker runs (native/torch_backend.py says where torch runs without importing it).

CUDA and ROCm (HIP builds expose the cuda API) are timed with CUDA events; MPS synchronises
before the clock stops; CPU runs are synchronous already.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import transformers

from harness.core.profiles import OpTime, Profile, timed_runs
from harness.core.records import Target, UnsupportedError
from harness.native.base import Clock, HostMemory, LoadRequest, thread_facts
from harness.native.torch_greedy import DecoderGreedy, Loop, seq2seq_run
from harness.prepare.workload import build_module, input_names

STEP_TOP = "step_top"  # the facts' key of a case's first generation's top logits per step (taken off by the check)

# Parameter and floating-input dtype per requested precision. int8 is dynamic quantization:
# Linear weights in int8, activations quantized on the fly, everything else stays fp32.
DTYPES = {
    "fp32": torch.float32,
    "auto": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8": torch.float32,
}


class CudaEventClock(Clock):
    """Device time between two CUDA events; stop() waits for the device."""

    def start(self) -> None:
        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._begin.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return float(self._begin.elapsed_time(self._end))


class TorchSession(HostMemory):
    def __init__(self, module: torch.nn.Module, names: list[str], hardware: str, device: str, precision: str) -> None:
        self.module = module
        self.names = names
        self.hardware = hardware
        self.device = torch.device(device)
        self.precision = "fp32" if precision == "auto" else precision
        self.clock = CudaEventClock() if self.device.type == "cuda" else Clock()
        self.generated: np.ndarray | None = None  # the last generate()'s token ids, stored on the row
        self.fills_cache = True  # generate() takes a KV-cache depth (--depths), filled before begin()
        self.encoder_ms: float | None = None  # an encoder–decoder's last encoder run
        self._top_wanted = False  # a case's first generation keeps its top-k logits per step
        self._greedy: DecoderGreedy | None = None
        self.facts: dict[str, Any] = {
            "torch_version": str(torch.__version__),  # a TorchVersion would import torch in the parent
            "transformers_version": transformers.__version__,
            "device_name": _device_name(self.device),
            "torch_threads": torch.get_num_threads(),
            "uses_nvidia_gpu": self.device.type == "cuda" and torch.version.hip is None,
        }

    @property
    def _decoder(self) -> DecoderGreedy:
        if self._greedy is None:
            self._greedy = DecoderGreedy(self.module.model, self.device)
        return self._greedy

    def prepare(self, feeds: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
        self._top_wanted = True  # a new case: its first generation (untimed) keeps each step's top-k logits
        self.facts.pop(STEP_TOP, None)  # an earlier case's, never another row's
        tensors = []
        for name in self.names:
            tensor = torch.from_numpy(feeds[name]).to(self.device)
            if tensor.is_floating_point():
                tensor = tensor.to(DTYPES[self.precision])
            tensors.append(tensor)
        return tuple(tensors)

    def run(self, prepared: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            outputs = self.module(*prepared)
        if self.device.type == "mps":
            torch.mps.synchronize()
        return outputs

    def to_numpy(self, outputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        return [o.detach().float().cpu().numpy() for o in outputs]

    def profile(self, prepared: tuple[torch.Tensor, ...], iterations: int) -> Profile:
        """Self time per aten op under torch.profiler (device time on CUDA): self time, so an op
        that calls others (aten::linear → aten::addmm) is not counted twice."""
        from torch.profiler import ProfilerActivity, profile

        on_gpu = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        self.run(prepared)  # anything lazily set up on a first call stays out of the profile
        with profile(activities=activities) as profiler:
            wall_ms = timed_runs(lambda: (self.run(prepared), self.synchronize()), iterations)
        ops = []
        for event in profiler.key_averages():
            self_us = event.self_device_time_total if on_gpu else event.self_cpu_time_total
            if event.key.startswith("aten::") and self_us > 0:
                ops.append(OpTime(event.key, event.key, self.device.type, event.count, self_us / 1000))
        method = f"torch {torch.__version__} torch.profiler ({'device' if on_gpu else 'CPU'} self time per aten op)"
        return Profile(ops, iterations, wall_ms, method)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def generate(self, prepared: tuple[torch.Tensor, ...], new_tokens: int, stamp: Callable[[], None],
                 eos: tuple[int, ...] = (), depth: int = 0,
                 begin: Callable[[], None] = lambda: None) -> int:  # fmt: skip
        """Exactly new_tokens greedy tokens (up to them, ending once every row made an `eos` id, with --stop-at-eos)
        by the loop native ORT runs (native/torch_greedy.py), after a KV cache filled to `depth` (then begin() runs:
        what is timed starts there); stamp() runs as each token's logits are ready (the device synchronised). The
        case's first generation keeps each step's top-k logits (facts' step_top), checked against native ORT's."""
        model = self.module.model
        if not hasattr(model, "generate") or not model.can_generate():
            raise UnsupportedError(f"{type(model).__name__} is not a generative model")
        # decoder_* inputs are for single-pass inference; the loop feeds the decoder its own tokens
        inputs = {n: t for n, t in zip(self.names, prepared, strict=True) if not n.startswith("decoder_")}
        loop = Loop(stamp, begin, self.synchronize, eos, want_top=self._top_wanted)
        with torch.inference_mode():
            if getattr(model.config, "is_encoder_decoder", False):
                if depth:
                    raise UnsupportedError("encoder–decoder generation starts from an empty decoder cache: no "
                                           "--depths above 0 (as ONNX Runtime's loop)")  # fmt: skip
                seq2seq_run(model, inputs, new_tokens, loop)
            else:
                self._decoder.run(inputs, new_tokens, loop, depth)
        self.encoder_ms = loop.encoder_ms
        self.generated = loop.result()  # the token ids, stored on the row
        if (top := loop.step_top()) is not None:
            self._top_wanted = False
            self.facts[STEP_TOP] = top
        return self.generated.shape[1]

    def forced_logits(self, ids: tuple[int, ...], budget: Any = None) -> np.ndarray:
        """The model's logits [len(ids)-1, vocab] predicting ids[1:], `ids` forced in one forward pass (batch 1), as
        float32: the perplexity passage, run untimed after the timed loop (harness.prepare.perplexity). One pass
        costs about a prefill: no step `budget` applies."""
        model = self.module.model
        if getattr(model.config, "is_encoder_decoder", False):
            raise UnsupportedError("an encoder–decoder's decoder writes from its encoder's input, not a free passage")
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device)).logits
        self.forced_method = "one forward pass"
        return logits[0, :-1].float().cpu().numpy()

    def prepare_training(self, feeds: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
        self.module.train()
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=1e-4)
        return self.prepare(feeds)

    def train_step(self, prepared: tuple[torch.Tensor, ...]) -> None:
        """One optimizer step on a synthetic loss (the mean of every output): what a training step
        costs, not what it learns."""
        outputs = self.module(*prepared)
        loss = sum(o.float().mean() for o in outputs)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def reset_device_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def device_memory_peak_mb(self) -> float | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.device.type == "mps":
            return torch.mps.current_allocated_memory() / 2**20
        return None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    import platform

    return platform.processor() or platform.machine()


def load_session(request: LoadRequest, target: Target) -> TorchSession:
    """The model built in torch at the request's precision (one of DTYPES) on the target's device."""
    device = torch.device(target.provider)
    threads = use_threads(request.threads)
    if request.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UnsupportedError(f"torch: {torch.cuda.get_device_name(device)} does not support bf16")
    module, _ = build_module(request.spec)
    facts: dict[str, Any] = {}
    if request.precision == "int8":
        module, facts = quantize_int8(module, device)
    else:
        module = module.to(device=device, dtype=DTYPES[request.precision])
    session = TorchSession(module, input_names(request.spec), target.hardware, target.provider, request.precision)
    session.facts |= facts | threads
    if request.precision in ("fp16", "bf16", "int8") and request.example_feeds is not None:
        check_runs(session, request.example_feeds, request.precision)
    return session


def load_control_session(weights: list[np.ndarray], target: Target, threads: int | None = None) -> TorchSession:
    """The drift control on this target: the same chain of matmuls, in fp32."""
    facts = use_threads(threads)
    module = MatMulChain(weights).to(torch.device(target.provider))
    session = TorchSession(module, ["x"], target.hardware, target.provider, "fp32")
    session.facts |= facts
    return session


def use_threads(threads: int | None) -> dict[str, Any]:
    """torch.set_num_threads in this worker (its intra-op pool is the process's), read back."""
    if threads is not None:
        torch.set_num_threads(threads)
    asked = f"--native-threads {threads}: torch.set_num_threads" if threads else "torch's default"
    policy = os.environ.get("OMP_WAIT_POLICY", "").upper()  # OpenMP's idle threads: ACTIVE spins, PASSIVE sleeps
    spinning = {"ACTIVE": True, "PASSIVE": False}.get(policy)
    said = f"OMP_WAIT_POLICY={policy}" if spinning is not None else "not set: OpenMP's own wait policy"
    return thread_facts(torch.get_num_threads(), f"{asked}, read back by torch.get_num_threads()", spinning, said)


class MatMulChain(torch.nn.Module):
    """The drift control (harness.run.control) as torch: x @ w0 @ w1 … with the ONNX file's weights."""

    def __init__(self, weights: list[np.ndarray]) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.from_numpy(w) for w in weights)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        for weight in self.weights:
            x = x @ weight
        return (x,)


def quantize_int8(module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Dynamic int8 quantization of every nn.Linear (torch.ao.quantization.quantize_dynamic)."""
    if device.type != "cpu":
        raise UnsupportedError(f"torch int8: dynamic quantization has CPU kernels only, not {device.type}")
    linear = sum(isinstance(m, torch.nn.Linear) for m in module.modules())
    if linear == 0:
        raise UnsupportedError(
            f"torch int8: {type(module.model).__name__} has no nn.Linear layer for dynamic quantization to act on"
        )
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices, once per load
        warnings.simplefilter("ignore")
        # Per-channel weights, as for ORT: on the tiny models they were as close or closer (clap-tiny 0.047
        # against 0.072 per tensor).
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        quantized = torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear: qconfig}, dtype=torch.qint8)
    # Weight layers that are not nn.Linear (convolutions, GPT-2's Conv1D) keep computing in fp32.
    left = sum(
        1
        for m in module.modules()
        if not isinstance(m, torch.nn.Linear | torch.nn.Embedding)
        and isinstance(getattr(m, "weight", None), torch.nn.Parameter)
        and m.weight.ndim >= 2
    )
    facts = {
        "quantization": f"torch.ao.quantization.quantize_dynamic qint8 per channel ({torch.backends.quantized.engine})",
        "quantized_linear_layers": linear,
        "fp32_weight_layers": left,
    }
    return quantized, facts


def check_runs(session: TorchSession, feeds: dict[str, np.ndarray], precision: str) -> None:
    """One untimed forward pass, so a precision torch cannot run here (a kernel without a Half or
    BFloat16 implementation, model code that reads a quantized Linear's weight) is recorded as
    unsupported with torch's own error instead of failing every case."""
    try:
        session.run(session.prepare(feeds))
    except (RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedError(
            f"torch {torch.__version__} cannot run this model in {precision} on {session.device}: "
            f"{type(exc).__name__}: {reason}"
        ) from exc
