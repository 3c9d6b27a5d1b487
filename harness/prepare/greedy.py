"""Greedy decoding on an ONNX graph with past key/values, written once: native ONNX Runtime's timed
loop (harness.native.onnxruntime_backend) and the reference tokens the browser's are checked against.

A graph qualifies when it takes input_ids, attention_mask and past_* inputs and returns logits then
present_* outputs (harness.prepare.export_past's names, or Hugging Face Optimum's past_key_values.N.* /
present.N.*); position_ids is fed only when the graph takes it. Exactly new_tokens tokens, EOS ignored, unless
the run stops at EOS (--stop-at-eos).
web/page/generate.mjs runs the same steps in the page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.records import UnsupportedError
from harness.prepare.folder_layouts import seq2seq_decoder
from harness.prepare.folders import past_shape

PAST_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
Step = Callable[[dict[str, Any]], list[Any]]  # one run of the graph: its feeds in, [logits, *presents] out


def past_input(present: str) -> str:
    """The past input a present output is fed back to."""
    if present.startswith("present."):  # Optimum: present.0.key -> past_key_values.0.key
        return "past_key_values." + present.removeprefix("present.")
    return "past" + present.removeprefix("present")  # present_key_0 -> past_key_0


def takes_past(input_names: Sequence[str], output_names: Sequence[str]) -> bool:
    """Whether a graph can run the KV-cache loop: token ids, a mask, and a present for every past."""
    pasts = [n for n in input_names if n.startswith("past")]
    presents = [n for n in output_names if n.startswith("present")]
    return (
        {"input_ids", "attention_mask"} <= set(input_names)
        and bool(pasts)
        and sorted(pasts) == sorted(past_input(p) for p in presents)
    )


@cache
def onnx_takes_past(path: Path) -> bool:
    """Whether an .onnx file's graph runs the KV-cache loop (read from the proto, weights not loaded)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    inputs = [v.name for v in graph.input if v.name not in weights]
    return takes_past(inputs, [v.name for v in graph.output])


@cache
def shares_kv_buffer(path: Path) -> bool:
    """Whether a graph's attention is ONNX Runtime's GroupQueryAttention (onnxruntime-genai's builder writes it),
    which can read its past from, and write its present into, one buffer of the generation's full length
    (past_present_share_buffer): no KV cache copied or reallocated per token (read from the proto)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type == "GroupQueryAttention" for node in graph.node)


def generates_with_past(spec: Any) -> bool:
    """Whether a model generates on ONNX graphs with past key/values: a decoder-only spec (its `-past`
    export), an .onnx file whose graph takes past key/values, or a folder's encoder–decoder layout (its graph
    the encoder, a decoder beside it: harness.prepare.folder_layouts); and a GGUF given as the model, on
    llama.cpp's own KV-cache loop (the engines that need ONNX say so in its rows)."""
    if spec.has_past_export or spec.is_gguf_file:
        return True
    return spec.is_onnx_file and (onnx_takes_past(spec.local_path) or seq2seq_decoder(spec.local_path) is not None)


def positions(mask: np.ndarray, length: int) -> np.ndarray:
    """Position ids of the last `length` tokens, counted over the unpadded ones as transformers'
    generate() does (padding positions get 1)."""
    counted = np.cumsum(mask, axis=1) - 1
    return np.where(mask == 0, 1, counted)[:, -length:].astype(np.int64)


# The inputs the loop fills: the prompt, its positions, optimum's merged-decoder switch and the past.
FILLED = ("input_ids", "attention_mask", "position_ids", "use_cache_branch")


def prefill_feeds(
    session: Any, inputs: dict[str, np.ndarray], shape: tuple[int, int] | None = None
) -> dict[str, np.ndarray]:
    """The prompt with an empty past: [batch, kv_heads, 0, head_dim] for every past input, the heads and
    head size from the graph or, where it leaves them symbolic, `shape` (the folder's config:
    harness.prepare.folders.past_shape). An input the loop cannot fill is refused by name."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions(mask, ids.shape[1]),
             "use_cache_branch": np.array([False])}  # fmt: skip
    for graph_input in session.get_inputs():
        if graph_input.name.startswith("past"):
            feeds[graph_input.name] = np.zeros(_empty_past(graph_input, ids.shape[0], shape),
                                               dtype=PAST_DTYPES[graph_input.type])  # fmt: skip
        elif graph_input.name not in FILLED:
            raise UnsupportedError(f"the graph's input '{graph_input.name}' is not one generation fills "
                                   f"({', '.join(FILLED)}, past key/values)")  # fmt: skip
    return _taken(session, feeds)


def _empty_past(graph_input: Any, batch: int, shape: tuple[int, int] | None) -> tuple[int, int, int, int]:
    heads, size = graph_input.shape[1], graph_input.shape[3]
    if isinstance(heads, int) and isinstance(size, int):
        return batch, heads, 0, size
    if shape is None:
        raise UnsupportedError(f"past input '{graph_input.name}' has symbolic heads or head size {graph_input.shape} "
                               "and no config.json or genai_config.json beside the graph says them")  # fmt: skip
    return batch, shape[0], 0, shape[1]


def _taken(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


@dataclass
class Greedy:
    """What one greedy generation produced; margins and prefill logits only when kept."""

    tokens: np.ndarray  # [batch, new_tokens]
    margins: np.ndarray | None = None  # [batch, new_tokens]: top-1 minus top-2 logit at each step
    prefill_logits: np.ndarray | None = None  # the first step's logits (last prompt position)


def bound_step(session: Any, output_names: list[str], device: str | None) -> Step:
    """One step of the loop: run() with host arrays, or, given an ORT device name (e.g. "webgpu"), an
    I/O binding whose presents stay on that device as OrtValues fed back as the next step's past
    (the KV cache never leaves the device, as in the page); the logits come back to the host."""
    if device is None:
        return lambda feeds: session.run(output_names, feeds)

    def step(feeds: dict[str, Any]) -> list[Any]:
        binding = session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output(output_names[0], "cpu")
        for name in output_names[1:]:
            binding.bind_output(name, device)
        session.run_with_iobinding(binding)
        logits, *presents = binding.get_outputs()
        return [logits.numpy(), *presents]

    return step


def shared_buffers(feeds: dict[str, np.ndarray], pasts: list[str], length: int) -> dict[str, Any]:
    """One host OrtValue per past input, `length` positions long, holding the past fed so far (empty, or a
    filled cache) at its start: GroupQueryAttention reads the valid part by the attention mask."""
    import onnxruntime as ort

    buffers = {}
    for name in pasts:
        past = feeds[name]
        whole = np.zeros((*past.shape[:2], length, past.shape[3]), dtype=past.dtype)
        whole[:, :, : past.shape[2]] = past
        buffers[name] = ort.OrtValue.ortvalue_from_numpy(whole)  # the OrtValue keeps `whole` alive
    return buffers


def shared_step(session: Any, output_names: list[str], buffers: dict[str, Any]) -> Step:
    """One step of the loop with past and present bound to the same buffers (shared_buffers), as
    onnxruntime-genai runs such a graph: the step's feeds bound as host arrays, the logits back on the host."""
    binding = session.io_binding()
    presents = dict(zip(output_names[1:], buffers.values(), strict=True))
    for name, buffer in buffers.items():
        binding.bind_ortvalue_input(name, buffer)

    def step(feeds: dict[str, Any]) -> list[Any]:
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        binding.clear_binding_outputs()  # the logits' shape changes after the prefill
        binding.bind_output(output_names[0], "cpu")
        for name, buffer in presents.items():
            binding.bind_ortvalue_output(name, buffer)
        session.run_with_iobinding(binding)
        return [binding.get_outputs()[0].numpy()]

    return step


def filler(ids: np.ndarray, depth: int) -> np.ndarray:
    """The tokens a KV cache is filled with to a depth: each row's prompt repeated (ids the model takes);
    web/page/generate.mjs fills with the same."""
    return np.stack([np.resize(row, depth) for row in ids]).astype(np.int64)


def fill_cache(session: Any, inputs: dict[str, np.ndarray], depth: int, shape: tuple[int, int] | None) -> tuple[
        dict[str, np.ndarray], np.ndarray]:  # fmt: skip
    """The prompt's feeds after a KV cache filled to `depth` tokens (a prefill of the filler, run here, outside
    any timing): the past is the filler's presents, the mask covers filler and prompt. (feeds, mask)"""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    fill = filler(ids, depth)
    output_names = [o.name for o in session.get_outputs()]
    _, *presents = session.run(output_names, prefill_feeds(session, {"input_ids": fill, "attention_mask":
                                                                     np.ones_like(fill)}, shape))  # fmt: skip
    mask = np.concatenate([np.ones_like(fill), mask], axis=1)
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions(mask, ids.shape[1]),
             "use_cache_branch": np.array([True])}  # fmt: skip
    pasts = [past_input(name) for name in output_names[1:]]
    return _taken(session, feeds | dict(zip(pasts, presents, strict=True))), mask


def greedy(session: Any, inputs: dict[str, np.ndarray], new_tokens: int, stamp: Callable[[], None] = lambda: None,
           keep: bool = False, shape: tuple[int, int] | None = None, eos: tuple[int, ...] = (), depth: int = 0,
           begin: Callable[[], None] = lambda: None, fills: dict[Any, Any] | None = None,
           device: str | None = None, share: bool = False) -> Greedy:  # fmt: skip
    """Exactly new_tokens greedy tokens, or with `eos` (--stop-at-eos) up to new_tokens, ending once every row
    has made one of those ids; stamp() runs as each step's logits are on the host (run() returns host arrays).
    keep: also the reference's margins and prefill logits (outside any timing); shape: the past's heads and
    head size where the graph leaves them symbolic; depth: the KV cache filled to that many tokens first
    (fill_cache), after which begin() runs: what is timed starts there; fills: where a filled cache is kept for
    the next generation of the same prompt and depth (ONNX Runtime never writes to its inputs, so the filled
    past is read again, not filled again; the page does the same); device: keep the presents on that ORT
    device (bound_step); share: past and present in one buffer per layer on the host (shares_kv_buffer,
    shared_step)."""
    output_names = [o.name for o in session.get_outputs()]
    pasts = [past_input(name) for name in output_names[1:]]
    mask = inputs["attention_mask"]
    feeds = prefill_feeds(session, inputs, shape)
    run = bound_step(session, output_names, device)
    if depth:
        key = (depth, inputs["input_ids"].tobytes(), inputs["attention_mask"].tobytes())
        if fills is None or key not in fills:
            filled = fill_cache(session, inputs, depth, shape)
            if fills is not None:  # the latest prompt and depth only: a deep cache is large
                fills.clear()
                fills[key] = filled
        feeds, mask = fills[key] if fills is not None else filled
    if share:  # the buffers are made before begin(): what is timed starts with them in place
        run = shared_step(session, output_names, shared_buffers(feeds, pasts, mask.shape[1] + new_tokens))
        feeds = {name: value for name, value in feeds.items() if name not in pasts}
    begin()
    tokens, margins, prefill = [], [], None
    ended = np.zeros(mask.shape[0], dtype=bool)
    for _ in range(new_tokens):
        logits, *presents = run(feeds)
        stamp()
        last = logits[:, -1]
        token = last.argmax(axis=-1, keepdims=True).astype(np.int64)
        tokens.append(token)
        ended |= np.isin(token[:, 0], eos)
        if keep:
            # the last position: the page reports it alone, and a graph may return every position
            prefill = logits[:, -1:].astype(np.float32) if prefill is None else prefill
            top2 = np.sort(last.astype(np.float64), axis=-1)[:, -2:]
            margins.append(top2[:, 1] - top2[:, 0])
        if eos and ended.all():
            break
        mask = np.concatenate([mask, np.ones_like(token)], axis=1)
        step = {"input_ids": token, "attention_mask": mask, "position_ids": positions(mask, 1),
                "use_cache_branch": np.array([True])}  # fmt: skip
        feeds = _taken(session, step | dict(zip(pasts if not share else [], presents, strict=True)))
    kept = np.stack(margins, axis=1) if keep else None
    return Greedy(np.concatenate(tokens, axis=1), kept, prefill)


def forced_logits(session: Any, inputs: dict[str, np.ndarray], tokens: np.ndarray,
                  shape: tuple[int, int] | None = None, depth: int = 0, device: str | None = None,
                  after: Callable[[int], None] | None = None) -> np.ndarray:  # fmt: skip
    """Teacher forcing: the logits at every position the loop computes when fed the prompt and then `tokens`
    [batch, N] (another side's generation) instead of its own choices, as float32 [batch, L, vocab]: the
    prefill's positions (every prompt position where the graph returns them all, else the last), then one
    per later token; the last N predict `tokens` one by one. The prefix up to a first difference is the
    native loop's own, so its logits there are native greedy's. depth: after a KV cache filled to that many
    tokens (fill_cache), as the generation checked ran; device: the presents kept on that ORT device, as the timed
    loop keeps them (bound_step); after(n): called once n runs are done (a caller's budget may stop it there)."""
    output_names = [o.name for o in session.get_outputs()]
    pasts = [past_input(name) for name in output_names[1:]]
    if depth:
        feeds, mask = fill_cache(session, inputs, depth, shape)
    else:
        mask, feeds = inputs["attention_mask"], prefill_feeds(session, inputs, shape)
    run = bound_step(session, output_names, device)
    kept = []
    for step in range(tokens.shape[1]):
        logits, *presents = run(feeds)
        if after is not None:
            after(step + 1)
        kept.append(np.asarray(logits, dtype=np.float32) if step == 0 else np.asarray(logits[:, -1:], np.float32))
        if step == tokens.shape[1] - 1:
            break
        token = tokens[:, step : step + 1].astype(np.int64)
        mask = np.concatenate([mask, np.ones_like(token)], axis=1)
        feed = {"input_ids": token, "attention_mask": mask, "position_ids": positions(mask, 1),
                "use_cache_branch": np.array([True])}  # fmt: skip
        feeds = _taken(session, feed | dict(zip(pasts, presents, strict=True)))
    return np.concatenate(kept, axis=1)


def cpu_session(graph: Path) -> Any:
    """A native ONNX Runtime CPU session on a graph: the reference every other side is checked against."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def reference_generation(graph: Path, inputs: dict[str, np.ndarray], new_tokens: int,
                         eos: tuple[int, ...] = (), depth: int = 0) -> Greedy:  # fmt: skip
    """Native ONNX Runtime's greedy tokens on the CPU for this graph and prompt (stopping at `eos` where the
    run asked; after a KV cache filled to `depth`): what every browser generation of the same file is checked
    against."""
    return greedy(cpu_session(graph), inputs, new_tokens, keep=True, shape=past_shape(graph), eos=eos, depth=depth)
