"""What a page sends back (a launched browser's, a served device's), checked against the job it
answers before anything of it reaches the store: its shape, its statuses, timings the page's clock
can have measured, a generation's steps, TTFT and token ids; and its outputs decoded into arrays.
The answer is data from elsewhere: a failed check is a PageResultError naming the field."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.bounds import MAX_THREADS, MAX_VOCAB
from harness.web.page_job import PageJob
from harness.web.runtimes import OWN_RUNTIME

RESULT_STATUSES = ("ok", "error", "unsupported")
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}
NUMPY_DTYPES |= {"float64": np.float64, "int16": np.int16, "int8": np.int8, "uint64": np.uint64, "uint32": np.uint32}
NUMPY_DTYPES |= {"uint16": np.uint16, "uint8": np.uint8, "bool": np.bool_}
OUTPUT_DTYPES = tuple(NUMPY_DTYPES)


class PageResultError(ValueError):
    """The page's answer does not have the expected shape; nothing of it is stored."""


def _require(obj: dict[str, Any], key: str, kinds: tuple[type, ...], where: str = "result") -> Any:
    if key not in obj:
        raise PageResultError(f"{where} lacks '{key}'")
    value = obj[key]
    if isinstance(value, bool) and bool not in kinds:
        raise PageResultError(f"{where}.{key} must be {kinds}, got a boolean")
    if not isinstance(value, kinds):
        raise PageResultError(f"{where}.{key} must be {' or '.join(k.__name__ for k in kinds)}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# performance.now() is coarsened by every browser: 5 µs when cross-origin isolated, 100 µs (or more)
# otherwise (the HR-Time spec). No browser gives a finer step, whatever a page says its step is.
MIN_TIMER_STEP_MS = 0.005
# Two readings one step apart are doubles: their difference may come out a rounding error under the step.
STEP_ROUNDING = 1e-6


@dataclass(frozen=True)
class Clock:
    """What a duration the page measured can be: at least one step of its timer (a shorter positive
    duration cannot be read off performance.now()), at most the job's --timeout (a job that ran longer
    would have been stopped)."""

    step_ms: float
    limit_ms: float

    @classmethod
    def of(cls, facts: dict[str, Any], timeout_s: float) -> Clock:
        reported = facts.get("timer_resolution_ms")  # the page's own smallest observed step
        step = max(MIN_TIMER_STEP_MS, reported if _is_number(reported) else 0.0)
        return cls(step, timeout_s * 1000)

    def duration(self, value: Any, name: str) -> float:
        """A duration from performance.now(). Every run takes time, so 0 ms means the clock did not
        advance across it: a timer fault (too coarse for the work, or frozen), not a figure."""
        if not _is_number(value) or value < 0:
            raise PageResultError(f"{name} must be a finite number > 0 (got {value!r})")
        if value == 0:
            raise PageResultError(
                f"{name} is 0 ms: a timer fault, performance.now() did not advance across the run (its step: "
                f"{self.step_ms:g} ms); nothing was measured"
            )
        if value < self.step_ms * (1 - STEP_ROUNDING):
            raise PageResultError(
                f"{name} is {value:g} ms, less than one step of the page's timer ({self.step_ms:g} ms): "
                "performance.now() cannot measure it; not a measurement"
            )
        return self.at_most_limit(float(value), name)

    def at_most_limit(self, value: float, name: str) -> float:
        if value > self.limit_ms:
            raise PageResultError(
                f"{name} is {value:g} ms, longer than the job's --timeout ({self.limit_ms / 1000:g} s), "
                "past which the job is stopped; not a measurement"
            )
        return value


# The facts the page reports (web/page/runner.mjs), checked like the rest of its answer: reports and
# the matrix compute with them. (what a valid value is, in words; the check). Keys not listed pass as
# they are (plain JSON values).
FactCheck = tuple[str, Callable[[Any], bool]]
_BOOLEAN: FactCheck = ("a boolean", lambda v: isinstance(v, bool))
_COUNT: FactCheck = ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
_MS: FactCheck = ("a finite number >= 0", lambda v: _is_number(v) and v >= 0)
_TEXT: FactCheck = ("a string", lambda v: isinstance(v, str))
_OPTIONAL_TEXT: FactCheck = ("a string or null", lambda v: v is None or isinstance(v, str))
_TEXTS: FactCheck = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
_OBJECT: FactCheck = ("an object or null", lambda v: v is None or isinstance(v, dict))
PAGE_MEMORY_MAX_BYTES = 2**40  # far above what a page's heaps and wasm memories can hold (a few GiB)


def _page_memory(value: Any) -> bool:
    """runner.mjs's pageMemory(): {bytes, by_type} (measureUserAgentSpecificMemory) or {error}."""
    if value is None:
        return True
    if not isinstance(value, dict) or not isinstance(value.get("by_type", {}), dict):
        return False
    sizes = [value.get("bytes"), *value.get("by_type", {}).values()]
    return all(s is None or (_is_number(s) and 0 <= s <= PAGE_MEMORY_MAX_BYTES) for s in sizes)


_PAGE_MEMORY: FactCheck = (
    f"null or an object whose sizes (bytes, by_type) are numbers 0..{PAGE_MEMORY_MAX_BYTES}",
    _page_memory,
)
_COUNTS: FactCheck = (
    "an object of node counts (integers >= 0)",
    lambda v: isinstance(v, dict) and all(_COUNT[1](n) for n in v.values()),
)
# web/page/tier.mjs's wasmTierProbe(): how much faster warm wasm ran than first-call (baseline) wasm, or null when the
# probe failed (wasm_tier_error says why, in at most WASM_TIER_ERROR_CHARS characters).
WASM_TIER_NUMBERS = ("cold_ms", "warm_ms", "ratio", "calls", "iterations", "budget_ms")
WASM_TIER_OPTIONAL = ("elapsed_ms", "rounds")
WASM_TIER_ERROR_CHARS = 500


def _wasm_tier(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict) or set(value) - {*WASM_TIER_NUMBERS, *WASM_TIER_OPTIONAL, "tiered"}:
        return False
    numbers = [value.get(k) for k in WASM_TIER_NUMBERS] + [value[k] for k in WASM_TIER_OPTIONAL if k in value]
    return isinstance(value.get("tiered"), bool) and all(_is_number(v) and v >= 0 for v in numbers)


_WASM_TIER: FactCheck = (
    f"null or an object of {', '.join(WASM_TIER_NUMBERS)} (finite numbers >= 0) and tiered (a boolean)",
    _wasm_tier,
)
_WASM_TIER_ERROR: FactCheck = (
    f"a string of at most {WASM_TIER_ERROR_CHARS} characters",
    lambda v: isinstance(v, str) and len(v) <= WASM_TIER_ERROR_CHARS,
)
FACT_CHECKS: dict[str, FactCheck] = {
    **dict.fromkeys(
        (
            "cross_origin_isolated",
            "secure_context",
            "shared_array_buffer",
            "webassembly",
            "webgpu_api",
            "webnn_api",
            "threads_dropped",
            "budget_stopped",
        ),
        _BOOLEAN,
    ),
    **dict.fromkeys(("hardware_concurrency", "threads_requested", "threads_effective", "warmup_run"), _COUNT),
    "max_time_s": ("a finite number > 0 or null", lambda v: v is None or (_is_number(v) and v > 0)),
    **dict.fromkeys(("runtime_init_ms", "fetch_ms"), _MS),
    **dict.fromkeys(("min_warmup_ms", "warmup_ms"), _MS),  # another runtime's inference warm-up (runner.mjs measure)
    # runner.mjs's timerResolutionMs(): a step it saw the clock take (a coarse browser's is 1 ms or 16.7 ms)
    "timer_resolution_ms": ("a number > 0 and <= 1000", lambda v: _is_number(v) and 0 < v <= 1000),
    **dict.fromkeys(("user_agent", "bundle", "placement_method", "load_measured_with"), _TEXT),
    **dict.fromkeys(("ort_web_version", "ort_common_version", "ep_check", "wasm_binary"), _OPTIONAL_TEXT),
    **dict.fromkeys(("wasm_files", "input_names", "output_names", "console_warnings"), _TEXTS),
    **dict.fromkeys(("probed_adapter", "adapter", "device_probe"), _OBJECT),
    "page_memory": _PAGE_MEMORY,
    "device_features": ("a list of strings or null", lambda v: v is None or _TEXTS[1](v)),
    "node_placement": _COUNTS,
    "wasm_tier": _WASM_TIER,
    "wasm_tier_error": _WASM_TIER_ERROR,
}


def check_facts(facts: dict[str, Any]) -> None:
    for key, (valid, check) in FACT_CHECKS.items():
        if key in facts and not check(facts[key]):
            raise PageResultError(f"result.facts.{key} must be {valid} (got {facts[key]!r:.200})")
    if "wasm_tier" in facts and (facts["wasm_tier"] is None) != ("wasm_tier_error" in facts):
        raise PageResultError("result.facts.wasm_tier is null exactly when result.facts.wasm_tier_error says why")


def _check_outputs(outputs: Any) -> None:
    if not isinstance(outputs, list) or not outputs:
        raise PageResultError("result.outputs must be a non-empty list")
    for i, out in enumerate(outputs):
        where = f"outputs[{i}]"
        if not isinstance(out, dict):
            raise PageResultError(f"{where} must be an object")
        _require(out, "name", (str,), where)
        if _require(out, "dtype", (str,), where) not in OUTPUT_DTYPES:
            raise PageResultError(f"{where}.dtype '{out['dtype']}' is not one of {OUTPUT_DTYPES}")
        dims = _require(out, "dims", (list,), where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise PageResultError(f"{where}.dims must be non-negative integers")
        _require(out, "data_b64", (str,), where)


# What the harness adds to an answer itself (the launched browser's memory): never the page's to send.
HARNESS_KEYS = ("browser_memory",)


def validate_page_result(result: Any, job: PageJob, timeout_s: float) -> dict[str, Any]:
    """Check the page's answer to `job` (run under --timeout `timeout_s`): required keys, types (facts
    included), every duration one the page's clock could have measured (Clock), as
    many samples as the job's stop rule gives. A failure makes that job's row an `error` naming what was
    wrong (a served device's answer: a 422, nothing stored)."""
    if not isinstance(result, dict):
        raise PageResultError(f"the page returned {type(result).__name__}, not an object")
    status = _require(result, "status", (str,))
    if status not in RESULT_STATUSES:
        raise PageResultError(f"result.status '{status}' is not one of {RESULT_STATUSES}")
    facts = _require(result, "facts", (dict,))
    check_facts(facts)
    clock = Clock.of(facts, timeout_s)
    for key in ("runtime_init_ms", "fetch_ms", "warmup_ms"):  # measured by the page (the first two maybe earlier)
        if key in facts:
            clock.at_most_limit(facts[key], f"facts.{key}")
    for key in HARNESS_KEYS:
        if key in result:
            raise PageResultError(f"result.{key} is measured by the harness, never sent by a page")
    if "profile" in result and not job.stop.profile_iterations:
        raise PageResultError("result.profile: this job asked for no profile")
    if status != "ok":
        if not _require(result, "error", (str,)).strip():
            raise PageResultError(f"a '{status}' result must say why (result.error is empty)")
        return result
    _check_samples(result, job, clock)
    if job.runtime != OWN_RUNTIME:
        _check_runtime(result.get("facts"), job)
    for key in ("first_run_ms", "load_ms"):
        result[key] = clock.duration(_require(result, key, (int, float)), key)
    if job.generate is not None:  # a generate job (web/page/generate.mjs) answers with tokens, not outputs
        _check_generation(_require(result, "generation", (dict,)), result["samples_ms"], job, clock)
    elif "generation" in result:
        raise PageResultError("result.generation: this job is not a generate job (it answers with outputs)")
    else:
        _check_outputs(result.get("outputs"))
    return result


def _check_runtime(facts: Any, job: PageJob) -> None:
    """Another page runtime's ok answer says what ran (facts.runtime): the job's runtime by name, its version, and
    for a runtime that takes a thread count the count it runs, read back from it (1..the job's request is not
    assumed: the harness compares them)."""
    where = "result.facts.runtime"
    runtime = _require(facts if isinstance(facts, dict) else {}, "runtime", (dict,), "result.facts")
    if _require(runtime, "name", (str,), where) != job.runtime:
        raise PageResultError(f"{where}.name is {runtime['name']!r:.40}; this job ran {job.runtime}")
    _require(runtime, "version", (str,), where)
    effective = runtime.get("threads_effective")
    if effective is not None and not (_COUNT[1](effective) and 1 <= effective <= MAX_THREADS):
        raise PageResultError(f"{where}.threads_effective must be a whole number 1..{MAX_THREADS} or null")


def _check_samples(result: dict[str, Any], job: PageJob, clock: Clock) -> None:
    samples = _require(result, "samples_ms", (list,))
    fewest, most = job.stop.fewest_samples, job.stop.max_iterations
    if not fewest <= len(samples) <= most:
        raise PageResultError(f"result has {len(samples)} samples; this job's stop rule gives {fewest}..{most}")
    result["samples_ms"] = [clock.duration(s, f"samples_ms[{i}]") for i, s in enumerate(samples)]
    timed = sum(result["samples_ms"]) + clock.duration(_require(result, "first_run_ms", (int, float)), "first_run_ms")
    clock.at_most_limit(timed, "the first run and the timed samples together")


def _check_generation(generation: dict[str, Any], samples: list[float], job: PageJob, clock: Clock) -> None:
    """A generate answer: per timed generation its TTFT and decode steps, the warm-up's token ids (a list
    per batch row), prefill logits (null where JSON could not carry a NaN/inf) and top-k logits per step,
    memory facts. Counts come from the job: new_tokens - 1 decode steps per generation, new_tokens ids per
    row, each inside the vocabulary (fewer only where the job stops at EOS and the tokens show that stop); a
    generation's TTFT and steps fit inside its whole (samples_ms)."""
    where = "result.generation"
    assert job.generate is not None
    # the vocabulary: the logits width of the job's graph (harness.browser.generate.generate_job), None where
    # the graph leaves it symbolic
    batch, new_tokens, vocab = job.batch, job.generate.new_tokens, job.generate.vocab_size
    eos = set(job.generate.eos_ids)  # the harness's: --stop-at-eos, else none
    _check_phases(generation, samples, new_tokens, clock, bool(eos), job.generate.seq2seq is not None)
    # our own loop returns both always; another page runtime returns them where its API gives its logits (null
    # where it does not: its tokens are then checked without them, and its row says so)
    optional = job.runtime != OWN_RUNTIME
    logits = generation.get("prefill_logits") if optional else _require(generation, "prefill_logits", (dict,), where)
    width = vocab if logits is None else _check_prefill_logits(logits, batch, vocab)
    tokens = _require(generation, "tokens", (list,), where)
    _check_tokens(tokens, batch, new_tokens, width, eos)
    made = len(tokens[0]) if tokens else new_tokens  # fewer than new_tokens only where the job stops at EOS
    top = generation.get("step_top") if optional else _require(generation, "step_top", (dict,), where)
    if top is not None:
        _check_step_top(_require(generation, "step_top", (dict,), where), batch, made, job.generate.top_k, width)
    for key in ("memory_before", "memory_after"):
        if not _OBJECT[1](generation.get(key)):
            raise PageResultError(f"{where}.{key} must be {_OBJECT[0]}")
    if not isinstance(generation.get("tokens_stable"), bool):
        raise PageResultError(f"{where}.tokens_stable must be a boolean")
    _check_warmup(generation, job.generate.max_warmup, clock)
    _check_passage(generation.get("passage"), job, width)


def _check_warmup(generation: dict[str, Any], most: int, clock: Clock) -> None:
    """The warm-up generations after the first (web/page/generate.mjs warmedUp), where the answer gives them: the
    last ones, at most the job's bound, each a duration its clock can have measured; their count, the first
    included, and the warm-up's time: a count no warm-up within that time can exceed, a time the samples fit in."""
    warm = generation.get("warmup_samples_ms")
    if warm is None:
        return
    if not isinstance(warm, list) or len(warm) > most:
        raise PageResultError(f"result.generation.warmup_samples_ms must be a list of at most {most} durations")
    generation["warmup_samples_ms"] = [clock.duration(t, f"warmup_samples_ms[{i}]") for i, t in enumerate(warm)]
    spent = generation.get("warmup_ms")
    if spent is None:  # an answer of before the warm-up floor: its samples are every warm-up generation
        generation["warmup_generations"] = 1 + len(warm)
        return
    spent = clock.duration(spent, "warmup_ms")
    count = generation.get("warmup_generations")
    if spent < sum(generation["warmup_samples_ms"]) or not _counted(count, len(warm), spent):
        raise PageResultError(f"result.generation.warmup_generations ({count}) and warmup_ms ({spent}) must count "
                              f"the {len(warm)} warm-up samples given and the first generation, at most "
                              f"{MAX_WARMUP_RATE_PER_MS} per ms")  # fmt: skip
    generation["warmup_ms"] = spent


# Warm-up generations per ms of warm-up a page may claim: a generation is at least a session call (~0.05 ms here)
MAX_WARMUP_RATE_PER_MS = 100


def _counted(count: Any, given: int, spent_ms: float) -> bool:
    """A warm-up count is an int covering the samples given (and the first generation), within a believable rate."""
    ok_type = isinstance(count, int) and not isinstance(count, bool)
    return ok_type and 1 + given <= count <= 1 + given + MAX_WARMUP_RATE_PER_MS * max(spent_ms, 1.0)


def _check_skipped(skipped: dict[str, Any], positions: int, job: PageJob) -> None:
    """A passage the page skipped: the job's steps and budget, a measured step and an estimate over the budget."""
    where = "result.generation.passage.skipped"
    if skipped.get("steps") != positions or skipped.get("limit_ms") != job.stop.max_time_ms:
        raise PageResultError(f"{where} must name this job's {positions} steps and its budget ({job.stop.max_time_ms})")
    if not all(_MS[1](skipped.get(key)) for key in ("step_ms", "estimate_ms")):
        raise PageResultError(f"{where}.step_ms and estimate_ms must be {_MS[0]}")
    if not skipped["estimate_ms"] > skipped["limit_ms"]:
        raise PageResultError(f"{where}: an estimate within the budget is no reason to skip")


PASSAGE_METHODS = ("prefill", "steps")  # web/page/generate.mjs's passageScores: how the passage's ids were forced


def _check_passage(passage: Any, job: PageJob, width: int | None) -> None:
    """The perplexity passage's scores where the job forced one (PassageJob): an error's text, or per predicted
    position (the job's ids but the first) an NLL, an argmax inside the vocabulary and, where the job served the fp32
    reference, a KL (null for a non-finite number: the harness then says the figure is not measured)."""
    where = "result.generation.passage"
    assert job.generate is not None
    asked = job.generate.passage
    if asked is None or passage is None:
        if passage is not None:
            raise PageResultError(f"{where}: this job forced no passage")
        if asked is not None:
            raise PageResultError(f"{where} is missing: this job forced the passage")
        return
    if not isinstance(passage, dict):
        raise PageResultError(f"{where} must be an object")
    if "error" in passage:
        _require(passage, "error", (str,), where)
        return
    positions = len(asked.ids) - 1
    if "skipped" in passage:  # its steps would pass the case's budget (web/page/generate.mjs passageScores)
        _check_skipped(_require(passage, "skipped", (dict,), where), positions, job)
        return
    top = width if width is not None else MAX_VOCAB
    columns = {"nll": _is_number, "argmax": lambda v: _COUNT[1](v) and v < top}
    if asked.reference_url is not None:
        columns["kl"] = _is_number
    elif passage.get("kl") is not None:
        raise PageResultError(f"{where}.kl: this job served no fp32 reference")
    for key, valid in columns.items():
        values = _require(passage, key, (list,), where)
        nullable = key != "argmax"
        if len(values) != positions or not all((v is None and nullable) or valid(v) for v in values):
            raise PageResultError(f"{where}.{key} needs {positions} values, each "
                                  + ("an id below the vocabulary" if not nullable else "a number or null"))  # fmt: skip
    if passage.get("method") not in PASSAGE_METHODS:
        raise PageResultError(f"{where}.method must be one of {', '.join(PASSAGE_METHODS)}")
    if "ms" in passage and not _MS[1](passage["ms"]):
        raise PageResultError(f"{where}.ms must be {_MS[0]}")


def _check_prefill_logits(logits: Any, batch: int, vocab: int | None) -> int | None:
    """The prefill's last-position logits: [batch, 1, the vocabulary] numbers (null for a non-finite one); returns
    the vocabulary's width (the graph's, else the answer's own)."""
    where = "result.generation"
    if not isinstance(logits, dict):
        raise PageResultError(f"{where}.prefill_logits must be an object (dims, values) or null")
    dims, values = _require(logits, "dims", (list,), where), _require(logits, "values", (list,), where)
    if not all(_COUNT[1](d) for d in dims) or len(values) != math.prod(dims):
        raise PageResultError(f"{where}.prefill_logits needs integer dims and as many values as they hold")
    width = vocab if vocab is not None else (dims[-1] if len(dims) == 3 else None)
    if dims != [batch, 1, width]:
        raise PageResultError(
            f"{where}.prefill_logits.dims are {dims!r:.80}; this job's are [{batch}, 1, the vocabulary "
            f"({'not fixed by the graph' if vocab is None else vocab})]"
        )
    if not all(v is None or _is_number(v) for v in values):
        raise PageResultError(f"{where}.prefill_logits.values must be numbers (null for a non-finite one)")
    return width


def _check_phases(generation: dict[str, Any], samples: list[float], new_tokens: int, clock: Clock,
                  stops_at_eos: bool = False, encoder_decoder: bool = False) -> None:  # fmt: skip
    """Each timed generation's TTFT and decode steps: durations the page's clock can measure, as many steps
    as the job's tokens give (at most that many where the job stops at EOS), and together no longer than the
    whole generation (its sample: the page's clock runs from the same start past the last step), within one
    step of the clock for rounding."""
    where = "result.generation"
    ttft = _require(generation, "ttft_samples_ms", (list,), where)
    steps = _require(generation, "step_samples_ms", (list,), where)
    if len(ttft) != len(samples) or len(steps) != len(samples) or not all(isinstance(s, list) for s in steps):
        raise PageResultError(
            f"{where} needs a TTFT and a list of decode steps for each of the {len(samples)} generations"
        )
    for i, each in enumerate(steps):
        if len(each) != new_tokens - 1 and not (stops_at_eos and len(each) < new_tokens - 1):
            policy = "up to " if stops_at_eos else ""
            raise PageResultError(
                f"{where}.step_samples_ms[{i}] holds {len(each)} decode steps; a generation of this job's "
                f"{new_tokens} new tokens takes {policy}{new_tokens - 1} (the first token is the TTFT's"
                f"{'' if stops_at_eos else '; the job ignores EOS'})"
            )
    generation["ttft_samples_ms"] = [clock.duration(t, f"ttft_samples_ms[{i}]") for i, t in enumerate(ttft)]
    generation["step_samples_ms"] = [
        [clock.duration(s, f"step_samples_ms[{i}][{j}]") for j, s in enumerate(each)] for i, each in enumerate(steps)
    ]
    if encoder_decoder:  # the encoder's run begins each generation's TTFT: never longer than it
        encoder = _require(generation, "encoder_samples_ms", (list,), where)
        if len(encoder) != len(samples):
            raise PageResultError(f"{where}.encoder_samples_ms needs the encoder's run of each of the "
                                  f"{len(samples)} generations")  # fmt: skip
        generation["encoder_samples_ms"] = [
            clock.duration(e, f"encoder_samples_ms[{i}]") for i, e in enumerate(encoder)
        ]
        for i, (run, first) in enumerate(
            zip(generation["encoder_samples_ms"], generation["ttft_samples_ms"], strict=True)
        ):
            if run > first:
                raise PageResultError(f"encoder_samples_ms[{i}] is {run:g} ms, longer than the TTFT it begins "
                                      f"({first:g} ms); not a measurement")  # fmt: skip
    elif "encoder_samples_ms" in generation:
        raise PageResultError(f"{where}.encoder_samples_ms: this job runs no encoder")
    phases = zip(generation["ttft_samples_ms"], generation["step_samples_ms"], samples, strict=True)
    for i, (first, each, whole) in enumerate(phases):
        if first > whole:
            raise PageResultError(
                f"ttft_samples_ms[{i}] is {first:g} ms, longer than the whole generation it begins "
                f"(samples_ms[{i}] = {whole:g} ms); not a measurement"
            )
        if first + sum(each) > whole + clock.step_ms:
            raise PageResultError(
                f"generation {i}: its TTFT and decode steps add up to {first + sum(each):g} ms, longer than the "
                f"whole generation (samples_ms[{i}] = {whole:g} ms); not a measurement"
            )


def _check_tokens(tokens: list[Any], batch: int, new_tokens: int, vocab: int | None, eos: set[int]) -> None:
    """The warm-up's token ids: a row per batch row, integers inside the vocabulary, new_tokens each, or where
    the job stops at EOS (`eos`) as many as end at the first step where every row has made an EOS id."""
    where = "result.generation.tokens"
    rows = all(isinstance(row, list) for row in tokens)
    expected = _eos_length(tokens, new_tokens, eos) if rows else new_tokens
    if len(tokens) != batch or not rows or not all(len(row) == expected for row in tokens):
        why = "" if expected == new_tokens else f" (the rows have all made an EOS id {sorted(eos)} by then)"
        raise PageResultError(f"{where} must hold {batch} rows (the job's batch) of {expected} token ids each{why}")
    # a graph that leaves its vocabulary symbolic, answered without logits (another page runtime): ids are only
    # bounded by the largest vocabulary any model may have
    top = vocab if vocab is not None else MAX_VOCAB
    for row, ids in enumerate(tokens):
        for column, token in enumerate(ids):
            if not (_COUNT[1](token) and token < top):
                raise PageResultError(
                    f"{where}[{row}][{column}] is {token!r:.40}; token ids are integers 0..{top - 1} (the vocabulary)"
                )


def _eos_length(tokens: list[list[Any]], new_tokens: int, eos: set[int]) -> int:
    """How many tokens each row holds: new_tokens, or with `eos` the step where the last row made its first
    EOS id, if that comes before."""
    if not eos:
        return new_tokens
    ends = [next((i + 1 for i, t in enumerate(row[:new_tokens]) if t in eos), None) for row in tokens]
    return min(new_tokens, max(ends)) if ends and None not in ends else new_tokens  # type: ignore[type-var]


def _check_step_top(top: dict[str, Any], batch: int, new_tokens: int, k: int, vocab: int | None) -> None:
    """The warm-up's top-k at each step: ids and logits, [batch][new_tokens][k] each as the job asked (k =
    job.generate.top_k, set by the harness), ids inside the vocabulary, logits numbers or null (non-finite)."""
    where = "result.generation.step_top"
    ids, values = _require(top, "ids", (list,), where), _require(top, "values", (list,), where)
    for name, rows in (("ids", ids), ("values", values)):
        if len(rows) != batch or not all(
            isinstance(row, list) and len(row) == new_tokens and all(isinstance(s, list) and len(s) == k for s in row)
            for row in rows
        ):
            raise PageResultError(f"{where}.{name} must hold [{batch}][{new_tokens}][{k}] values (batch, steps, k)")
    top = vocab if vocab is not None else 0
    if not all(_COUNT[1](i) and i < top for row in ids for step in row for i in step):
        raise PageResultError(f"{where}.ids must be token ids 0..{top - 1} (the vocabulary)")
    if not all(v is None or _is_number(v) for row in values for step in row for v in step):
        raise PageResultError(f"{where}.values must be numbers (null for a non-finite one)")


def decode_outputs(outputs: list[dict[str, Any]]) -> list[np.ndarray]:
    """The page's base64 outputs as numpy arrays (dtype and byte count checked)."""
    arrays = []
    for out in outputs:
        data = base64.b64decode(out["data_b64"], validate=True)
        dtype = np.dtype(NUMPY_DTYPES[out["dtype"]])
        count = int(np.prod(out["dims"], dtype=np.int64))
        if len(data) != count * dtype.itemsize:
            raise ValueError(f"output {out['name']}: {len(data)} bytes for shape {out['dims']} of {out['dtype']}")
        arrays.append(np.frombuffer(data, dtype=dtype).reshape(out["dims"]))
    return arrays
