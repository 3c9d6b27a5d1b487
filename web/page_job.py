"""The one job type the page runs (web/page/runner.mjs's runJob): the model and input URLs, the EP setting,
the stop rule and, for a generate case, its generation part. Every builder (a launched or remote
browser, `web --serve`, ab's page) makes a PageJob; `page_json()` is the one place it becomes the
page's JSON, and web/answers.py checks an answer against these fields, never against what the answer
says of itself.

A field added here reaches the page by itself (page_json flattens the dataclasses); the page reads the
flat names (runner.mjs, stop.mjs, generate.mjs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from harness.core.generation import PAGE_MAX_WARMUP_GENERATIONS, STEP_TOP_K


@dataclass(frozen=True)
class StopRule:
    """When the page's timed loop stops (web/page/stop.mjs): `iterations` samples after `warmup` runs and
    at least `min_duration_ms`, never more than `max_iterations`; a budget (`max_time_ms`) may stop it
    early but never below `min_iterations`. `profile_iterations` more runs are profiled after it."""

    warmup: int
    iterations: int
    min_duration_ms: float
    max_iterations: int
    min_iterations: int
    max_time_ms: float | None
    profile_iterations: int = 0

    @property
    def fewest_samples(self) -> int:
        """The fewest timed samples runner.mjs's measure() returns under this rule."""
        if self.max_time_ms is None:
            return self.iterations
        return min(self.min_iterations, self.iterations)


@dataclass(frozen=True)
class PageInput:
    """An input tensor: its graph name, the URL of its raw bytes, dtype and dims."""

    name: str
    url: str
    dtype: str
    dims: list[int]


@dataclass(frozen=True)
class ExternalData:
    """A model's external data file: its location as the .onnx names it, and the URL ORT-web fetches."""

    path: str
    url: str


@dataclass(frozen=True)
class Seq2SeqJob:
    """An encoder–decoder's other graphs (web/page/seq2seq.mjs): the encoder's URL, the later steps' decoder's
    (None: the job's model is a merged decoder that takes both steps) with its own session options (WebGPU:
    its present.* kept on the GPU), and the token the decoder starts from."""

    encoder_url: str
    start_token: int
    decoder_past_url: str | None = None
    decoder_past_options: dict[str, Any] | None = None


@dataclass(frozen=True)
class PassageJob:
    """The perplexity passage (harness.prepare.perplexity), forced untimed after the timed loop: its ids, and the
    URL of the fp32 reference's log-probabilities over them (float32 [len(ids)-1, vocab]; None: none at hand)."""

    ids: list[int]
    reference_url: str | None = None


@dataclass(frozen=True)
class GenerateJob:
    """A generate job's part (web/page/generate.mjs): new tokens per generation; the logits width the
    answer's token ids are checked against (None: the graph leaves it symbolic); a folder's past heads and
    head size (where the graph is symbolic); ORT session options (WebGPU: present.* kept on the GPU); the EOS
    ids the generation stops at (--stop-at-eos; empty: EOS ignored, exactly new_tokens tokens); how many of each
    step's largest logits the warm-up returns (checked against native ORT's on the same graph); the KV-cache
    depth the page fills, untimed, before the prompt (--depths); the perplexity passage it forces after the timed
    loop."""

    new_tokens: int
    vocab_size: int | None = None
    past_shape: list[int] | None = None
    session_options: dict[str, Any] | None = None
    eos_ids: list[int] = field(default_factory=list)
    top_k: int = STEP_TOP_K
    depth: int = 0
    seq2seq: Seq2SeqJob | None = None  # an encoder–decoder's generation
    passage: PassageJob | None = None  # our own loop's perplexity passage, after the timed loop
    max_warmup: int = PAGE_MAX_WARMUP_GENERATIONS  # warm-up generations after the first, at most
    min_warmup_ms: float = 0.0  # the least time it warms up for (harness.core.generation.page_min_warmup_ms)


@dataclass(frozen=True)
class PageJob:
    """One job of the page."""

    model_url: str
    inputs: list[PageInput]
    ep: str
    threads: int
    stop: StopRule
    case: str  # the page names the case whose session load a later case reuses
    device_type: str | None = None  # an EP that takes one (WebNN's deviceType)
    external_data: list[ExternalData] = field(default_factory=list)
    fault: str | None = None  # test-only: the page fails on purpose (runner.mjs)
    generate: GenerateJob | None = None
    # the page runtime that runs the job (web/page/runtimes.json; web/page/runtimes/<module>): onnxruntime-web is
    # runner.mjs's own loop; another's model is laid out as it loads it, under runtime_model_base (transformers.js:
    # config.json and onnx/<file of runtime_dtype>; llama.cpp: model_url is the GGUF)
    runtime: str = "onnxruntime-web"
    runtime_model_base: str | None = None
    runtime_dtype: str | None = None
    # another page runtime's inference: the least time (ms) its warm-up lasts besides the --warmup count
    # (harness.core.generation.page_min_warmup_ms): its own wasm build reaches its steady time after seconds of calls
    runtime_min_warmup_ms: float = 0.0

    @property
    def mode(self) -> str:
        return "generate" if self.generate is not None else "inference"

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        return {each.name: list(each.dims) for each in self.inputs}

    @property
    def batch(self) -> int:
        """The prompt's batch rows (input_ids' first dimension, or an encoder–decoder's log-mel features'; 1
        where the job has neither)."""
        return next((each.dims[0] for each in self.inputs if each.name in ("input_ids", "input_features")), 1)

    def page_json(self) -> dict[str, Any]:
        """The job as the page reads it: the stop rule's and the generation's fields at the top level, a
        generation's unset facts left out."""
        data = asdict(self)
        stop, generate = data.pop("stop"), data.pop("generate")
        data |= stop | {"mode": self.mode}
        if generate is not None:
            data |= {key: value for key, value in generate.items() if value is not None}
        return data
