"""ONNX Runtime, one session per execution provider.

ORT silently places nodes that an EP cannot run on the CPU EP. For non-CPU EPs the node
placement is read from a one-off profiled run and recorded, so a fallback is visible.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from harness.core.records import Target
from harness.native.base import Availability, Capabilities, Clock, HostMemory, LoadRequest, UnsupportedError
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
]


class OrtSession(HostMemory):
    def __init__(self, session: ort.InferenceSession, provider: str, placement: dict[str, int]) -> None:
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.precision = "fp32"
        self.clock = Clock()  # run() copies outputs to host numpy, so it returns after the device
        fallback_nodes = sum(n for ep, n in placement.items() if ep != provider)
        self.facts: dict[str, Any] = {
            "onnxruntime_version": ort.__version__,
            "requested_provider": provider,
            "session_providers": session.get_providers(),
            "node_placement": placement,
            "cpu_fallback_nodes": fallback_nodes,
            "cpu_fallback": fallback_nodes > 0,
            "uses_nvidia_gpu": provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"),
        }

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: feeds[name] for name in self.input_names}

    def run(self, prepared: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, prepared)

    def to_numpy(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(outputs)


class OrtGenerator(OrtSession):
    """Greedy decoding on the export with past key/values (harness.prepare.export_past): a prefill run on
    the prompt with an empty past, then one run per new token that feeds back the presents."""

    def __init__(self, session: ort.InferenceSession, provider: str, placement: dict[str, int]) -> None:
        super().__init__(session, provider, placement)
        self.output_names = [o.name for o in session.get_outputs()]
        # present_key_0 → past_key_0: each step's cache is the next step's past
        self.past_names = ["past" + name.removeprefix("present") for name in self.output_names[1:]]
        self.generated: np.ndarray | None = None  # the last generate()'s token ids, for parity checks
        self.facts["onnx_graph"] = "with past key/values (KV-cache decoder loop)"

    def prepare(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: feeds[name] for name in ("input_ids", "attention_mask")}

    def generate(self, prepared: dict[str, np.ndarray], new_tokens: int, stamp: Callable[[], None]) -> int:
        """Exactly new_tokens greedy tokens (no EOS stop, like torch's min = max); stamp() runs as
        each token's logits are ready, since run() returns host arrays."""
        mask = prepared["attention_mask"]
        feeds = prefill_feeds(self.session, prepared)
        tokens = []
        for _ in range(new_tokens):
            logits, *presents = self.session.run(self.output_names, feeds)
            stamp()
            token = logits[:, -1].argmax(axis=-1, keepdims=True).astype(np.int64)
            tokens.append(token)
            mask = np.concatenate([mask, np.ones_like(token)], axis=1)
            feeds = {"input_ids": token, "attention_mask": mask, "position_ids": positions(mask, 1)}
            feeds |= dict(zip(self.past_names, presents, strict=True))
        self.generated = np.concatenate(tokens, axis=1)
        return len(tokens)


PAST_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def positions(mask: np.ndarray, length: int) -> np.ndarray:
    """Position ids of the last `length` tokens, counted over the unpadded ones as transformers'
    generate() does (padding positions get 1)."""
    counted = np.cumsum(mask, axis=1) - 1
    return np.where(mask == 0, 1, counted)[:, -length:].astype(np.int64)


def prefill_feeds(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The prompt with an empty past: [batch, kv_heads, 0, head_dim] for every past input."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions(mask, ids.shape[1])}
    for past in session.get_inputs():
        if past.name.startswith("past_"):
            shape = (ids.shape[0], past.shape[1], 0, past.shape[3])
            feeds[past.name] = np.zeros(shape, dtype=PAST_DTYPES[past.type])
    return feeds


def node_placement(onnx_path: Path, provider: str, feeds_example: dict[str, np.ndarray] | None) -> dict[str, int]:
    """Nodes per execution provider, read from the profile of one run in a throwaway session."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as directory:
        options.profile_file_prefix = os.path.join(directory, "placement")
        session = ort.InferenceSession(str(onnx_path), options, providers=[provider])
        if feeds_example is None:
            return {}
        session.run(None, {i.name: feeds_example[i.name] for i in session.get_inputs()})
        events = json.loads(Path(session.end_profiling()).read_text())
    counts: Counter[str] = Counter()
    seen: set[str] = set()
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args and event["name"] not in seen:
            seen.add(event["name"])
            counts[args["provider"]] += 1
    return dict(counts)


class OnnxRuntimeBackend:
    engine = "onnxruntime"
    # generation is a KV-cache loop on the export with past key/values (decoder-only models)
    capabilities = Capabilities(modes=("inference", "generate"), generate_needs_past_export=True)

    def device(self, target: Target) -> str | None:
        """The OpenVINO EP runs on the CPU by default: host work, like the CPU EP."""
        return None if target.hardware == "cpu" or target.provider == "OpenVINOExecutionProvider" else target.hardware

    def targets(self) -> list[Target]:
        return [Target(hw, "onnxruntime", provider) for hw, provider in PROVIDERS]

    def probe(self, target: Target) -> Availability:
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
        path, precision, conversion = model_for_precision(source, request.precision)
        try:
            session = ort.InferenceSession(str(path), providers=[target.provider])
        except Exception as exc:  # a converted file ORT rejects (e.g. duplicate node names): no such model here
            if not conversion:
                raise
            raise UnsupportedError(f"onnxruntime cannot load the {precision} conversion of the export: {exc}") from exc
        placement: dict[str, int] = {}
        if target.provider != "CPUExecutionProvider":
            example = request.example_feeds
            if generating and example is not None:
                example = prefill_feeds(session, example)
            placement = node_placement(path, target.provider, example)
        ort_session = (OrtGenerator if generating else OrtSession)(session, target.provider, placement)
        ort_session.precision = precision
        ort_session.facts |= conversion
        return ort_session


BACKEND = OnnxRuntimeBackend()
