"""ONNX Runtime, one session per execution provider.

ORT silently places nodes that an EP cannot run on the CPU EP. For non-CPU EPs the node
placement is read from a one-off profiled run and recorded, so a fallback is visible. What the
MatMuls computed in is read from the graph ORT optimized for the EP (harness.core.precision).

Plugin EPs (the WebGPU EP of `onnxruntime-ep-webgpu`: harness.native.webgpu_ep) are registered with ORT
in the worker and put on a session through ORT's device discovery (add_provider_for_devices); every
session of such a target (timed, profiled, placement, optimized graph) is made that way.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from harness.core.precision import compute_facts, graph_compute_facts
from harness.core.profiles import Profile, ort_trace_ops, timed_runs
from harness.core.records import Target
from harness.native import webgpu_ep
from harness.native.base import (
    LOAD_WINDOW_S,
    Availability,
    Capabilities,
    Clock,
    HostMemory,
    LoadRequest,
    UnsupportedError,
    others_busy_cpus,
    physical_cores,
    thread_facts,
)
from harness.prepare.folders import past_shape
from harness.prepare.graph_precision import matmul_compute
from harness.prepare.greedy import greedy, prefill_feeds, shares_kv_buffer
from harness.prepare.seq2seq import Seq2SeqFiles, Seq2SeqGreedy, precision_files, seq2seq_files, start_token
from harness.prepare.variants import model_for_precision

PROVIDERS = [
    ("cpu", "CPUExecutionProvider"),
    ("cuda", "CUDAExecutionProvider"),
    ("cuda", "TensorrtExecutionProvider"),
    ("rocm", "ROCMExecutionProvider"),
    ("rocm", "MIGraphXExecutionProvider"),
    ("openvino", "OpenVINOExecutionProvider"),
    ("qnn", "QNNExecutionProvider"),
    ("mps", "CoreMLExecutionProvider"),
    ("directml", "DmlExecutionProvider"),
    ("webgpu", webgpu_ep.EP_NAME),
]
# provider → the module that registers it as a plugin EP and puts it on a session's options
PLUGINS = {webgpu_ep.EP_NAME: webgpu_ep}
# provider → the ORT device name its I/O binding keeps a generation's KV cache on
DEVICE_KV_CACHE = {webgpu_ep.EP_NAME: "webgpu"}


def new_session(path: Path | bytes, provider: str, options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """A session on one EP: a plugin EP through add_provider_for_devices, any other by its name."""
    options = options or ort.SessionOptions()
    if provider in PLUGINS:
        PLUGINS[provider].add_to(options)
        return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options)
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options, providers=[provider])


class OrtSession(HostMemory):
    def __init__(
        self, session: ort.InferenceSession, provider: str, placement: dict[str, int], path: Path | None = None
    ) -> None:
        self.session = session
        self.provider = provider
        self.path = path  # the model file, for a profiled twin of this session
        self.threads: int | None = None  # --native-threads, for a profiled twin of this session
        self.input_names = [i.name for i in session.get_inputs()]
        self.precision = "fp32"
        self.clock = Clock()  # run() copies outputs to host numpy, so it returns after the device
        fallback_nodes = sum(n for ep, n in placement.items() if ep != provider)
        self.base_facts: dict[str, Any] = {
            "onnxruntime_version": ort.__version__,
            "requested_provider": provider,
            "session_providers": session.get_providers(),
            "node_placement": placement,
            "cpu_fallback_nodes": fallback_nodes,
            "cpu_fallback": fallback_nodes > 0,
            "uses_nvidia_gpu": provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"),
        }

    @functools.cached_property
    def facts(self) -> dict[str, Any]:  # type: ignore[override]
        """The session's facts and what its MatMuls computed in: read on first use, after the load was
        timed (it optimizes the graph once more, in a throwaway session)."""
        if self.path is None:
            return self.base_facts
        try:
            computed = optimized_compute(self.path, self.provider)
        except Exception as exc:  # e.g. an EP that compiles nodes: ORT cannot write that graph out
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return self.base_facts | {"compute_precision": None, "compute_precision_source": f"not read: {reason}"}
        return self.base_facts | compute_facts(self.precision, computed, COMPUTE_SOURCE)

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: feeds[name] for name in self.input_names}

    def run(self, prepared: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, prepared)

    def to_numpy(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(outputs)

    def profile(self, prepared: dict[str, np.ndarray], iterations: int) -> Profile:
        """Per-node times from a twin session with ORT's profiler on: profiling is a session option,
        so the timed session never has it. Its first run (buffer allocation) is run and left out."""
        if self.path is None:
            raise RuntimeError("this session has no model file to profile")
        with profiled_session(self.path, self.provider, self.threads) as session:
            session.run(None, prepared)
            wall_ms = timed_runs(lambda: session.run(None, prepared), iterations)
            events = json.loads(Path(session.end_profiling()).read_text())
        ops = ort_trace_ops(events, skip_runs=1, requested=self.provider)
        return Profile(ops, iterations, wall_ms, f"onnxruntime {ort.__version__} SessionOptions.enable_profiling")


class OrtGenerator(OrtSession):
    """Greedy decoding on the export with past key/values (harness.prepare.export_past): a prefill run on
    the prompt with an empty past, then one run per new token that feeds back the presents
    (harness.prepare.greedy, the loop the browser's reference tokens come from too)."""

    def __init__(
        self, session: ort.InferenceSession, provider: str, placement: dict[str, int], path: Path | None = None
    ) -> None:
        super().__init__(session, provider, placement, path)
        self.generated: np.ndarray | None = None  # the last generate()'s token ids, for parity checks
        self.fills_cache = True  # generate() takes a KV-cache depth (--depths), filled before begin()
        self.fills: dict[Any, Any] = {}  # the filled cache, kept for the next generation (greedy.greedy)
        self.base_facts["onnx_graph"] = "with past key/values (KV-cache decoder loop)"
        if provider in DEVICE_KV_CACHE:
            self.base_facts["kv_cache"] = f"on the {DEVICE_KV_CACHE[provider]} device (I/O binding, device OrtValues)"
        # GroupQueryAttention on the CPU: past and present in one buffer, as onnxruntime-genai runs the graph
        self.shares_kv = provider == "CPUExecutionProvider" and path is not None and shares_kv_buffer(path)
        if self.shares_kv:
            self.base_facts["kv_cache"] = ("one host buffer per past input, the generation's length, bound as past and "
                                           "present (GroupQueryAttention's past_present_share_buffer)")  # fmt: skip

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: feeds[name] for name in ("input_ids", "attention_mask")}

    def generate(self, prepared: dict[str, np.ndarray], new_tokens: int, stamp: Callable[[], None],
                 eos: tuple[int, ...] = (), depth: int = 0,
                 begin: Callable[[], None] = lambda: None) -> int:  # fmt: skip
        """Exactly new_tokens greedy tokens (no EOS stop, like torch's min = max), or up to them stopping at
        `eos`, after a KV cache filled to `depth` (then begin() runs); stamp() runs as each token's logits are
        ready, since run() returns host arrays."""
        shape = past_shape(self.path) if self.path is not None else None  # a folder's config, where the graph says none
        device = DEVICE_KV_CACHE.get(self.provider)  # the KV cache stays on the device where the EP has one
        self.generated = greedy(self.session, prepared, new_tokens, stamp, shape=shape, eos=eos, depth=depth,
                                begin=begin, fills=self.fills, device=device, share=self.shares_kv).tokens  # fmt: skip
        return self.generated.shape[1]

    def forced_logits(self, ids: tuple[int, ...], budget: Any = None) -> np.ndarray:
        """This session's logits [len(ids)-1, vocab] predicting ids[1:], `ids` forced from an empty KV cache (batch
        1): the perplexity passage, run untimed after the timed loop (harness.prepare.perplexity.graph_logits, its
        steps held to `budget`)."""
        from harness.prepare.perplexity import graph_logits

        shape, device = past_shape(self.path) if self.path else None, DEVICE_KV_CACHE.get(self.provider)
        logits, self.forced_method = graph_logits(self.session, ids, shape, budget, device)
        return logits


class OrtSeq2Seq(OrtSession):
    """Greedy encoder–decoder generation (harness.prepare.seq2seq, the loop the browser's reference tokens come
    from too): the encoder once, then decoder steps over both caches. Its own session is the first decoder
    step's, whose file the row names; encoder_ms is the last generation's encoder run (its output on the host)."""

    def __init__(self, loop: Seq2SeqGreedy, provider: str, placement: dict[str, int], files: Seq2SeqFiles) -> None:
        super().__init__(loop.decoder, provider, placement, files.decoder)
        self.loop, self.files = loop, files
        self.generated: np.ndarray | None = None
        self.encoder_ms: float | None = None
        self.base_facts["onnx_graph"] = "encoder once, then decoder steps with self- and cross-attention caches"

    @functools.cached_property
    def facts(self) -> dict[str, Any]:  # type: ignore[override]
        """What each graph's MatMuls computed in (the encoder's and the first decoder step's, read from the graph
        ORT optimizes for the EP), per graph and summed, against each graph's own precision."""
        try:
            computed = {"encoder": optimized_compute(self.files.encoder, self.provider),
                        "decoder": optimized_compute(self.files.decoder, self.provider)}  # fmt: skip
        except Exception as exc:  # e.g. an EP that compiles nodes: ORT cannot write that graph out
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return self.base_facts | {"compute_precision": None, "compute_precision_source": f"not read: {reason}"}
        return self.base_facts | graph_compute_facts(self.precision, computed, COMPUTE_SOURCE)

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {i.name: feeds[i.name] for i in self.loop.encoder.get_inputs()}

    def generate(self, prepared: dict[str, np.ndarray], new_tokens: int, stamp: Callable[[], None],
                 eos: tuple[int, ...] = (), depth: int = 0,
                 begin: Callable[[], None] = lambda: None) -> int:  # fmt: skip
        """Exactly new_tokens greedy tokens; an EOS stop and a filled KV cache are the decoder-only loop's."""
        if eos or depth:
            raise UnsupportedError("encoder–decoder generation makes exactly --new-tokens tokens from an empty "
                                   "decoder cache: no --stop-at-eos, no --depths above 0")  # fmt: skip
        begin()
        started = time.perf_counter_ns()
        marks: list[int] = []
        encoded = lambda: marks.append(time.perf_counter_ns())  # noqa: E731
        self.generated = self.loop.generate(prepared, new_tokens, stamp, encoded).tokens
        self.encoder_ms = (marks[0] - started) / 1e6
        return self.generated.shape[1]


COMPUTE_SOURCE = "onnxruntime SessionOptions.optimized_model_filepath: the activation type of each MatMul node"
SPINNING_ENTRY = "session.intra_op.allow_spinning"  # ORT's default "1": idle pool threads busy-wait for work


def session_options(threads: int | None, others_busy: float | None = None) -> tuple[ort.SessionOptions, dict[str, Any]]:
    """Session options running `threads` intra-op threads (None: ORT's default, intra_op_num_threads 0 = one
    per physical core), spinning by spins() on the machine's load (`others_busy`, the worker's reading before
    the load was timed; None: read now), and the facts a row records."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    count = threads or physical_cores()
    busy = others_busy_cpus() if others_busy is None else others_busy
    spinning, spinning_source = spins(count, busy)
    options.add_session_config_entry(SPINNING_ENTRY, "1" if spinning else "0")
    source = (f"--native-threads: SessionOptions.intra_op_num_threads {threads}" if threads else
              "ONNX Runtime's default: intra_op_num_threads 0 = one thread per physical core (psutil)")  # fmt: skip
    return options, thread_facts(count, source, spinning, spinning_source) | {"others_busy_cpus": round(busy, 2)}


SPARE_CPUS = 0.5  # other work below half a CPU (a shell, a logger) leaves the pool's spinning worth its cost


def spins(threads: int, others_busy: float) -> tuple[bool, str]:
    """Whether the intra-op pool spins: ORT's default (on) while the pool and the machine's other work fit its
    physical cores; off where they do not, since a spinning idle thread then takes the core another process
    needs and the pool waits on a descheduled thread at every operator. Measured both ways in
    docs/measurement.md ("Native threads")."""
    cores = physical_cores()
    load = f"{threads} threads, other processes {others_busy:.1f} CPUs busy over {LOAD_WINDOW_S} s before the load"
    if threads + others_busy > cores + SPARE_CPUS:
        return False, f"{SPINNING_ENTRY}=0: {load}, on {cores} physical cores (docs/measurement.md)"
    return True, f"{SPINNING_ENTRY}=1 (ORT's default): {load}, on {cores} physical cores"


def optimized_compute(onnx_path: Path, provider: str) -> dict[str, int]:
    """MatMul nodes per compute precision in the graph ORT optimizes for this EP, written by a throwaway
    session (its weights to a file beside it, so a model over 2 GB can be written too)."""
    import onnx

    options = ort.SessionOptions()
    with tempfile.TemporaryDirectory() as directory:
        options.optimized_model_filepath = os.path.join(directory, "optimized.onnx")
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        options.log_severity_level = 3  # its warning that the file is for this machine only is meant for deployers
        new_session(onnx_path, provider, options)
        return matmul_compute(onnx.load(options.optimized_model_filepath, load_external_data=False))


@contextlib.contextmanager
def profiled_session(onnx_path: Path, provider: str, threads: int | None = None) -> Iterator[ort.InferenceSession]:
    """A session on the file with ORT's profiler on (and the timed session's threads), writing its trace in
    a directory removed after."""
    options, _ = session_options(threads)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as directory:
        options.profile_file_prefix = os.path.join(directory, "profile")
        yield new_session(onnx_path, provider, options)


def node_placement(onnx_path: Path, provider: str, feeds_example: dict[str, np.ndarray] | None) -> dict[str, int]:
    """Nodes per execution provider, read from the profile of one run in a throwaway session."""
    with profiled_session(onnx_path, provider) as session:
        if feeds_example is None:
            return {}
        session.run(None, {i.name: feeds_example[i.name] for i in session.get_inputs()})
        events = json.loads(Path(session.end_profiling()).read_text())
    return dict(Counter(op.provider for op in ort_trace_ops(events, skip_runs=0) if op.provider))


class OnnxRuntimeBackend:
    engine = "onnxruntime"
    # generation is a KV-cache loop on the export with past key/values (decoder-only models)
    capabilities = Capabilities(modes=("inference", "generate"), generate_needs_past_export=True,
                                reads_machine_load=True)  # fmt: skip

    def device(self, target: Target) -> str | None:
        """The OpenVINO EP runs on the CPU by default: host work, like the CPU EP. The WebGPU EP too, as
        host work: on a machine without a GPU its adapter is SwiftShader on the host's cores, and the parent
        cannot tell which adapter it gets (one after another with the CPU targets is never wrong)."""
        host = ("OpenVINOExecutionProvider", webgpu_ep.EP_NAME)
        return None if target.hardware == "cpu" or target.provider in host else target.hardware

    def targets(self) -> list[Target]:
        return [Target(hw, "onnxruntime", provider) for hw, provider in PROVIDERS]

    def discovered_devices(self) -> list[dict[str, Any]]:
        """What ORT's own device discovery offers once the installed plugin EPs are registered."""
        from harness.native.ort_devices import ep_devices

        return ep_devices()

    def probe(self, target: Target) -> Availability:
        if target.provider in PLUGINS:
            return PLUGINS[target.provider].probe()
        available = ort.get_available_providers()
        if target.provider in available:
            return Availability(True, f"onnxruntime {ort.__version__} provides {target.provider}")
        return Availability(
            False,
            f"onnxruntime {ort.__version__} build has no {target.provider} (it has: {', '.join(available)})",
        )

    def load(self, request: LoadRequest, target: Target) -> OrtSession:
        """An inference session on the export, or a generator when given the export with past."""
        generating = request.onnx_past_path is not None
        source = request.onnx_past_path if generating else request.onnx_path
        if source is None:
            raise UnsupportedError("no ONNX file for this model (see the export error)")
        if generating and seq2seq_files(source) is not None:
            return self._load_seq2seq(source, request, target)
        path, precision, conversion = model_for_precision(source, request.precision)
        options, threads = session_options(request.threads, request.others_busy_cpus)
        # a device that makes no progress fails here, once, quickly; so does a precision it has no kernels for
        shaders = PLUGINS[target.provider].proved(precision) if target.provider in PLUGINS else {}
        try:
            session = new_session(path, target.provider, options)
        except Exception as exc:  # a converted file ORT rejects (e.g. duplicate node names): no such model here
            if not conversion:
                raise
            raise UnsupportedError(f"onnxruntime cannot load the {precision} conversion of the export: {exc}") from exc
        placement: dict[str, int] = {}
        if target.provider != "CPUExecutionProvider":
            example = request.example_feeds
            if generating and example is not None:
                example = prefill_feeds(session, example, past_shape(path))
            placement = node_placement(path, target.provider, example)
        ort_session = (OrtGenerator if generating else OrtSession)(session, target.provider, placement, path)
        ort_session.precision = precision
        ort_session.base_facts |= conversion | threads
        ort_session.threads = request.threads
        if target.provider in PLUGINS:
            ort_session.base_facts |= PLUGINS[target.provider].facts() | shaders
        return ort_session

    def _load_seq2seq(self, source: Path, request: LoadRequest, target: Target) -> OrtSeq2Seq:
        """An encoder–decoder's graphs at the precision; the start token from the layout's config.json."""
        files, precision, conversion = precision_files(source, request.precision)
        opened = {
            path: ort.InferenceSession(str(path), providers=[target.provider])
            for path in dict.fromkeys((files.encoder, files.decoder, files.decoder_past))
        }  # merged: once
        loop = Seq2SeqGreedy((opened[files.encoder], opened[files.decoder], opened[files.decoder_past]),
                             start_token(source))  # fmt: skip
        session = OrtSeq2Seq(loop, target.provider, {}, files)
        session.precision = precision  # per graph where they differ: encoder=fp32,decoder=q4
        graphs = {"encoder_model": str(files.encoder), "decoder_past_model": str(files.decoder_past)}
        session.base_facts |= conversion | graphs
        return session


BACKEND = OnnxRuntimeBackend()
