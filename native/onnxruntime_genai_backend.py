"""onnxruntime-genai: the runtime on-device LLM deployments use, generating on an onnxruntime-genai model folder
(genai_config.json + its decoder) with its own KV-cache handling and search. Greedy, exactly new_tokens tokens
(min_length = max_length, so an EOS does not end it early, unless --stop-at-eos), as every other engine's
generation. The [genai] extra; without it the engine probes unavailable."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.bounds import MAX_THREADS
from harness.core.records import Target
from harness.native.base import (
    Availability,
    Capabilities,
    Clock,
    DeviceByHardware,
    HostMemory,
    LoadRequest,
    UnsupportedError,
    physical_cores,
    thread_facts,
)
from harness.prepare.folders import GENAI_CONFIG, file_precision


class GenaiGenerator(HostMemory):
    """One og.Model; each generate() a fresh og.Generator on the prompt (its KV cache is the generator's)."""

    def __init__(self, model: Any, precision: str, facts: dict[str, Any]) -> None:
        self.model = model
        self.precision = precision
        self.facts = facts
        self.clock = Clock()
        self.generated: np.ndarray | None = None  # the last generate()'s token ids, for parity checks

    def prepare(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        if not np.all(feeds["attention_mask"] == 1):  # genai builds its own mask from the token ids
            raise UnsupportedError("onnxruntime-genai takes unpadded prompts only (a mask of ones)")
        return feeds["input_ids"].astype(np.int32)

    def run(self, prepared: np.ndarray) -> Any:
        raise UnsupportedError("onnxruntime-genai generates only (--mode generate)")

    def to_numpy(self, outputs: Any) -> list[np.ndarray]:
        return []

    def generate(self, prepared: np.ndarray, new_tokens: int, stamp: Callable[[], None],
                 eos: tuple[int, ...] = ()) -> int:  # fmt: skip
        """Exactly new_tokens greedy tokens, or with `eos` (--stop-at-eos) up to them, ending where genai's
        search ends at its config's EOS id; stamp() runs as each token is chosen (the logits are on the host:
        generate_next_token returns once its search picked the token)."""
        import onnxruntime_genai as og

        batch, prompt = prepared.shape
        params = og.GeneratorParams(self.model)
        length = prompt + new_tokens
        params.set_search_options(max_length=length, min_length=prompt + 1 if eos else length, do_sample=False,
                                  batch_size=batch)  # fmt: skip
        generator = og.Generator(self.model, params)
        generator.append_tokens(prepared)
        tokens = []
        for _ in range(new_tokens):
            if eos and generator.is_done():
                break
            generator.generate_next_token()
            stamp()
            tokens.append(np.asarray(generator.get_next_tokens(), dtype=np.int64).reshape(batch, 1))
        self.generated = np.concatenate(tokens, axis=1)
        return self.generated.shape[1]


class GenaiBackend(DeviceByHardware):
    engine = "onnxruntime-genai"
    # opt-in; loads a genai folder's own files (the spec's graph is only where the folder is found)
    capabilities = Capabilities(modes=("generate",), generate_needs_past_export=True)

    def targets(self) -> list[Target]:
        return [Target("cpu", self.engine, "cpu")]

    def probe(self, target: Target) -> Availability:
        if importlib.util.find_spec("onnxruntime_genai") is None:
            return Availability(False, "onnxruntime-genai is not installed (pip install 'accelharness[genai]')")
        return Availability(True, "onnxruntime-genai CPU")

    def load(self, request: LoadRequest, target: Target) -> GenaiGenerator:
        import onnxruntime_genai as og

        graph = request.spec.local_path
        if graph is None or not (graph.parent / GENAI_CONFIG).is_file():
            raise UnsupportedError(f"onnxruntime-genai runs an onnxruntime-genai model folder ({GENAI_CONFIG} beside "
                                   "the graph) only")  # fmt: skip
        own = file_precision(graph)
        asked = own if request.precision == "auto" else request.precision
        if asked != own:
            raise UnsupportedError(f"onnxruntime-genai runs the folder's {graph.name} as it is, a {own} graph; "
                                   f"--precision {own} runs it")  # fmt: skip
        config = og.Config(str(graph.parent))
        config.clear_providers()  # CPU
        threads = genai_threads(config, graph.parent, request.threads)
        facts = {"onnxruntime_genai_version": og.__version__, "model_file": graph.name,
                 "model_folder": str(Path(graph.parent))} | threads  # fmt: skip
        return GenaiGenerator(og.Model(config), own, facts)


def genai_threads(config: Any, folder: Path, threads: int | None) -> dict[str, Any]:
    """The decoder session's intra-op threads: --native-threads through the config's session_options (an
    overlay, as onnxruntime-genai's docs set them), else the folder's own genai_config.json value, else ORT's
    default (one per physical core). Its session options take no spinning entry: it is ORT's default."""
    if threads:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        source = f"--native-threads: genai_config model.decoder.session_options.intra_op_num_threads {threads}"
    elif own := _folder_threads(folder):
        threads, source = own, f"the folder's genai_config.json: session_options.intra_op_num_threads {own}"
    else:
        threads = physical_cores()
        source = "ONNX Runtime's default (onnxruntime-genai sets none): one thread per physical core (psutil)"
    spinning = "not set: onnxruntime-genai's session_options have no spinning entry (ORT's default: spinning)"
    return thread_facts(threads, source, None, spinning)


def _folder_threads(folder: Path) -> int | None:
    """The folder's own decoder intra_op_num_threads (0 or none: ORT's default), read bounded as data."""
    from harness.prepare.folder_checks import genai_decoder, read_config

    options = genai_decoder(read_config(folder, GENAI_CONFIG)).get("session_options")
    value = options.get("intra_op_num_threads") if isinstance(options, dict) else None
    return value if type(value) is int and 0 < value <= MAX_THREADS else None


BACKEND = GenaiBackend()
