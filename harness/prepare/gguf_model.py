"""A GGUF given as the model (--model-path x.gguf), prepared: the facts every row of it carries (the file's name and
SHA-256, its header's: harness.prepare.gguf_file), each case's prompt ids, and native llama.cpp's greedy tokens on
the file, the reference every llama.cpp row is checked against, native and in the page (the same file at the same
precision: equal tokens expected, else `mismatch`).

The prompt is the GGUF's own vocabulary's: the harness's passage (harness.prepare.audio.PASSAGE, the text perplexity
and speech rows use) tokenized by llama.cpp itself, and of its ids the first window of the case's length whose text,
spelled as the page spells it (harness.prepare.gguf_vocab.spell), llama.cpp tokenizes back into exactly those ids:
wllama takes text only, so ids that do not survive that round trip would run another prompt in the page. A GGUF
whose tokenizer adds BOS has it first, as llama.cpp's own prompt would. --prompt-ids are taken as given.

llama.cpp is handed in (GgufEngines: harness.run.gguf_prepare gives node-llama-cpp's prebuilt binary), as prepare
imports no engine. Everything is cached under the file's SHA-256, the prompt rule and the engine's version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from harness.core.generation import StepTop
from harness.core.records import Case
from harness.prepare.gguf_file import NO_ONNX, read_gguf
from harness.prepare.gguf_vocab import spell, vocabulary
from harness.prepare.prepared import Phase, PreparedModel, PrepareJob, write_atomically

PROMPT_RULE = "passage1"  # how a case's prompt is chosen (module docstring): a new rule, new case files
REFERENCE_RULE = "top1"  # what a reference file holds (Reference): a new layout, new files
MAX_WINDOW_TRIES = 512  # windows of the passage's ids tried per prompt before the case fails, saying so


# Both sides of a GGUF row's check run the same file through llama.cpp's kernels (ggml): each step's top-k logits
# (native rows) or log-probabilities (the page's) within (absolute, relative to the step's largest |value|) of the
# reference's at the same ids. Native rows run the reference's own binary: equal (0 apart, 1 and 2 threads). The page
# runs wllama's build of llama.cpp in wasm: on float weights only the order of sums differs (llama-tiny F32: 2.8e-5
# apart, and its embeddings scaled by 1.05 move them by 0.21), held as llama.cpp's F32 kernels are to native ORT
# (harness.core.parity, ("fp32", GGML_SIDE)); on quantized blocks the two builds compute apart (SmolLM2-135M's Q4_1
# GGUF, 32 steps: top-8 log-probabilities up to 0.36 apart, at most 4.7% of the step's largest, whichever
# flash-attention setting native runs), so a quantized file is held to a bound with 3x headroom over that.
STEP_TOLERANCES = {"float": (1e-4, 1e-3), "quantized": (5e-2, 1.5e-1)}
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16")


# Where a llama.cpp row leaves the reference's tokens, the reference's top-1 logit minus its logit of the row's token
# (its margin over the row's choice) must be below a gap tolerance: two builds whose values differ by less can only
# swap a near tie, as harness.core.generation's rule for native ORT's same-graph rows. A float file: twice its step
# tolerance (two sides each within it). A quantized one: measured, as the largest change of a step's top-1/top-2
# margin between the two builds (native node-llama-cpp and wllama's wasm, each step both hold the reference's top
# two), 2x headroom (docs/measurement.md): on SmolLM2-135M's Q4_1 GGUF, prompts of 8, 16, 32 and 64 of the passage's
# ids, 32 greedy steps, wasm 1 thread, 106 steps compared, up to 0.479 apart; the one divergence (prompt 16, step 10)
# came where the reference's margin was 0.0074.
QUANTIZED_MARGIN_MEASURED = 0.479
QUANTIZED_GAP = 2 * QUANTIZED_MARGIN_MEASURED


def step_tolerance(precision: str) -> tuple[float, float]:
    return STEP_TOLERANCES["float" if precision in FLOAT_PRECISIONS else "quantized"]


def gap_tolerance(precision: str, largest: float) -> float:
    """How far below the reference's top-1 a row's different token may be and still be a near tie (above)."""
    if precision in FLOAT_PRECISIONS:
        atol, rtol = STEP_TOLERANCES["float"]
        return 2 * (atol + rtol * largest)
    return QUANTIZED_GAP


@dataclass(frozen=True)
class Reference:
    """Native llama.cpp's greedy generation on a prompt: its tokens and each step's top-k [steps, k] ids and logits,
    and each step's log of the sum of exp(logit - largest logit) (the top logits as log-probabilities: logit -
    largest - it)."""

    tokens: list[int]
    top_ids: np.ndarray
    top_logits: np.ndarray
    log_weight: np.ndarray

    @property
    def top_logprobs(self) -> np.ndarray:
        return self.top_logits - self.top_logits[:, :1] - self.log_weight[:, None]


class GgufEngine(Protocol):
    """llama.cpp with the GGUF loaded: its tokenizer and its greedy loop."""

    bos: int | None
    add_bos: bool  # whether its tokenizer puts BOS before a prompt
    described: str  # what made the reference tokens, in words (its version, threads)

    def tokenize(self, text: str) -> list[int]:
        """The text's ids, no BOS added."""

    def greedy(self, ids: list[int], new_tokens: int, eos: tuple[int, ...]) -> Reference:
        """Greedy tokens on the prompt ids from an empty KV cache, with each step's top logits."""


class GgufEngines(Protocol):
    version: str  # the engine's build, in the cache key of its reference tokens

    def open(self, path: Path, job: PrepareJob) -> AbstractContextManager[GgufEngine]: ...


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(2**22):
            digest.update(chunk)
    return digest.hexdigest()


def prepare_gguf(job: PrepareJob, engines: GgufEngines) -> Iterator[Phase | PreparedModel]:
    """The PreparedModel of a GGUF (module docstring), a Phase before each long step."""
    from harness.prepare.cache import cache_root
    from harness.prepare.prompts import model_eos_ids

    spec = job.spec
    assert spec.local_path is not None
    path = spec.local_path
    facts = read_gguf(path)  # again: the file may have changed since the run was checked
    yield Phase(spec.name, "the GGUF's SHA-256")
    digest = file_sha256(path)
    prepared = PreparedModel(spec=spec, weights="pretrained", weights_source=str(path), onnx_path=None,
                             onnx_error=NO_ONNX, reference="native llama.cpp on the same file", output_names=(),
                             parameters=facts.parameters, export={"exporter": "file"})  # fmt: skip
    prepared.onnx_past_error = NO_ONNX
    prepared.facts = {"model_file": path.name, "model_sha256": digest} | facts.row_facts()
    assert facts.precision is not None  # refused when the run was checked (harness.prepare.specs)
    prepared.gguf_files = {facts.precision: str(path)}
    prepared.gguf_facts = {facts.precision: prepared.facts}
    if job.stop_at_eos:
        prepared.eos, prepared.eos_asked = model_eos_ids(spec), True
    folder = cache_root() / "cases" / f"gguf-{digest[:24]}"
    folder.mkdir(parents=True, exist_ok=True)
    for batch, seq in job.shapes:
        if seq is not None and seq > facts.context_length:
            why = f"sequence length {seq} exceeds the GGUF's context of {facts.context_length}"
            prepared.skipped[(batch, seq)] = why
        else:
            prepared.case_files[(batch, seq)] = folder / _case_name(spec.prompt, batch, seq)
    generations = _generation_files(prepared, job, engines.version)
    missing = [p for p in [*prepared.case_files.values(), *generations.values()] if not p.exists()]
    if missing:
        yield Phase(spec.name, "llama.cpp: the prompts' ids and its reference tokens")
        with engines.open(path, job) as engine:
            _build_cases(prepared, engine, path)
            _build_generations(prepared, generations, engine)
    for key, file in generations.items():
        if file.exists():
            prepared.generation_files[key] = file
            with np.load(file) as data:
                prepared.reference = str(data["described"])
    yield prepared


def _case_name(prompt: tuple[int, ...] | None, batch: int, seq: int | None) -> str:
    given = "" if prompt is None else "_p" + hashlib.sha256(json.dumps(list(prompt)).encode()).hexdigest()[:16]
    return f"b{batch}_s{seq}_{PROMPT_RULE}{given}.npz"


def _generation_files(prepared: PreparedModel, job: PrepareJob, version: str) -> dict[tuple, Path]:
    """Each batch-1 case's reference generation file (llama.cpp generates one sequence at a time), by the key
    PreparedModel.load_generation reads."""
    if not job.reference_tokens:
        return {}
    stop = "_eos" + "-".join(map(str, prepared.eos)) if prepared.eos else ""
    tag = hashlib.sha256(f"{version}|{REFERENCE_RULE}".encode()).hexdigest()[:12]
    return {((batch, seq), job.reference_tokens, 0): case.with_name(f"{case.stem}_gen{job.reference_tokens}{stop}_"
                                                                    f"{tag}.npz")
            for (batch, seq), case in prepared.case_files.items() if batch == 1}  # fmt: skip


def _build_cases(prepared: PreparedModel, engine: GgufEngine, path: Path) -> None:
    """Each missing case's prompt (module docstring); a case whose prompt cannot be chosen fails alone."""
    for (batch, seq), file in list(prepared.case_files.items()):
        if file.exists():
            continue
        try:
            given = prepared.spec.prompt
            rows = [list(given)] * batch if given is not None else _windows(engine, path, seq or 1, batch)
        except ValueError as exc:
            prepared.failed[(batch, seq)] = ("error", f"preparing the prompt failed: {exc}")
            del prepared.case_files[(batch, seq)]
            continue
        ids = np.asarray(rows, dtype=np.int64)
        arrays = {"in:input_ids": ids, "in:attention_mask": np.ones_like(ids)}
        write_atomically(file, lambda out, arrays=arrays: np.savez(out, **arrays))


def _windows(engine: GgufEngine, path: Path, seq: int, count: int) -> list[list[int]]:
    """`count` prompts of `seq` ids from the passage, each surviving the page's round trip (module docstring)."""
    from harness.prepare.audio import PASSAGE

    vocab = vocabulary(path)
    first = [engine.bos] if engine.add_bos and engine.bos is not None else []
    length = seq - len(first)
    if length < 1:
        return [first[:seq]] * count
    ids = engine.tokenize(PASSAGE)
    if not ids:
        raise ValueError("llama.cpp tokenizes the passage into no ids")
    repeats = -(-(length + MAX_WINDOW_TRIES) // len(ids))
    ids = engine.tokenize(" ".join([PASSAGE] * repeats)) if repeats > 1 else ids
    found: list[list[int]] = []
    for start in range(min(MAX_WINDOW_TRIES, len(ids) - length + 1)):
        body = ids[start : start + length]
        if engine.tokenize(spell(body, vocab)) == body:
            found.append(first + body)
            if len(found) == count:
                return found
    raise ValueError(f"no window of {length} of the passage's ids that llama.cpp tokenizes back into the same ids, as "
                     f"the page's text must be, was found in {MAX_WINDOW_TRIES} tries; give --prompt-ids")  # fmt: skip


def _build_generations(prepared: PreparedModel, files: dict[tuple, Path], engine: GgufEngine) -> None:
    """Native llama.cpp's greedy tokens of each batch-1 case (module docstring), with each step's top-1/top-2 logit
    margin (what a divergence's message states) and top logits."""
    for (shape, new_tokens, _), file in files.items():
        if file.exists() or shape not in prepared.case_files:
            continue
        feeds, _ = prepared.load_case(shape)
        made = engine.greedy(feeds["input_ids"][0].tolist(), new_tokens, prepared.eos)
        top = made.top_logits
        margins = top[:, 0] - top[:, 1] if top.ndim == 2 and top.shape[1] > 1 else np.full(len(made.tokens), np.nan)
        arrays = {"tokens": np.asarray([made.tokens], dtype=np.int64), "margins": np.asarray([margins]),
                  "prefill_logits": np.zeros((0,), dtype=np.float32), "top_ids": made.top_ids, "top_logits": top,
                  "log_weight": made.log_weight, "described": np.asarray(engine.described)}  # fmt: skip
        write_atomically(file, lambda out, arrays=arrays: np.savez(out, **arrays))


def reference(prepared: PreparedModel, case: Case) -> Reference | None:
    """Native llama.cpp's reference generation of a case (None where none was made)."""
    file = prepared.generation_files.get(((case.batch_size, case.seq_len), case.new_tokens or 0, 0))
    if file is None:
        return None
    with np.load(file) as data:
        return Reference(data["tokens"][0].tolist(), data["top_ids"], data["top_logits"], data["log_weight"])


def token_check(prepared: PreparedModel, case: Case, tokens: list[list[int]] | None, top: StepTop | None = None,
                log_probs: bool = False) -> tuple[bool | None, dict]:  # fmt: skip
    """(whether a llama.cpp row agrees with native llama.cpp's reference on the same file, the facts saying so; None
    where there is no reference for the case): the same tokens, and each step's top-k `top` (the row's first
    generation's: logits, or with `log_probs` log-probabilities) within step_tolerance of the case's precision of
    the reference's at the same ids, up to the first differing token."""
    made = reference(prepared, case)
    if made is None or not tokens:
        return None, {"token_parity": "not checked: no reference generation of native llama.cpp for this case"}
    expected, got = made.tokens, list(tokens[0])
    facts: dict[str, Any] = {"token_reference": prepared.reference}
    step = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
    if step is None and len(got) != len(expected):
        step = min(len(got), len(expected))
    agree = step is None
    if agree:
        facts["token_parity"] = f"all {len(got)} tokens equal native llama.cpp's on the same file"
    else:
        facts |= _divergence(got, expected, made, step or 0, case.precision)
        agree = facts.get("near_tie") is True
    if top is not None:
        steps = len(got) if step is None else step
        logits_agree, found = _step_check(made, top, log_probs, steps, step_tolerance(case.precision))
        facts |= found | _margins(made, top, steps)
        if not logits_agree:
            facts["token_parity"] += f"; {found['step_logits']}"
        agree = agree and logits_agree
    return agree, facts


def _divergence(got: list[int], expected: list[int], made: Reference, step: int, precision: str) -> dict[str, Any]:
    """Where a row leaves the reference's tokens: the step, the reference's margin there, and whether it is a near
    tie (the reference's top-1 minus its logit of the row's token below gap_tolerance): then the row agrees up to
    there, and the steps after it, on another prefix, are not compared."""
    margins = made.top_logits[:, 0] - made.top_logits[:, 1] if made.top_logits.shape[-1] > 1 else []
    margin = f" (its top-1/top-2 logit margin there: {margins[step]:.3g})" if step < len(margins) else ""
    ours = got[step] if step < len(got) else "the end"
    theirs = expected[step] if step < len(expected) else "the end"
    said = (f"{step} of {len(expected)} tokens equal native llama.cpp's on the same file; at step {step} {ours} "
            f"where it chose {theirs}{margin}")  # fmt: skip
    facts: dict[str, Any] = {"first_divergence": step}
    gap = _gap(made, step, ours)
    if gap is None:
        facts["token_parity"] = f"{said}: the same file at the same precision is expected to give the same tokens"
        return facts
    limit = gap_tolerance(precision, float(np.max(np.abs(made.top_logits[step]))))
    facts |= {"reference_gap": gap, "gap_tolerance": limit, "near_tie": gap < limit}
    if gap < limit:
        facts["token_parity"] = (f"ok: {said}, a near tie (its logit of {ours} {gap:.3g} below its top-1 < "
                                 f"{limit:.3g}); the steps after it, on another prefix, are not compared")  # fmt: skip
    else:
        facts["token_parity"] = (f"{said}: its logit of {ours} is {gap:.3g} below its top-1 (a near tie is below "
                                 f"{limit:.3g})")  # fmt: skip
    return facts


def _gap(made: Reference, step: int, token: Any) -> float | None:
    """The reference's top-1 logit minus its logit of `token` at `step`, or None where it holds no logit of it (a
    token outside its top-k, or past its end: no near tie)."""
    if type(token) is not int or step >= len(made.top_ids):
        return None
    ids = made.top_ids[step].tolist()
    return float(made.top_logits[step][0] - made.top_logits[step][ids.index(token)]) if token in ids else None


def _margins(made: Reference, top: StepTop, steps: int) -> dict[str, Any]:
    """How far a row's top-1/top-2 margin is from the reference's, at each step before a divergence where the row
    holds the reference's top two ids (logits or log-probabilities alike: a margin is the same in both): the figure
    QUANTIZED_GAP is measured by."""
    diffs = []
    for index in range(min(steps, len(made.top_ids), top.ids.shape[1])):
        if made.top_ids.shape[-1] < 2:
            break
        first, second = made.top_ids[index][:2].tolist()
        row = dict(zip(top.ids[0, index].tolist(), top.values[0, index].tolist(), strict=True))
        if first in row and second in row and np.isfinite(row[first]) and np.isfinite(row[second]):
            theirs = made.top_logits[index][0] - made.top_logits[index][1]
            diffs.append(abs((row[first] - row[second]) - theirs))
    return {"step_margin_max_diff": float(max(diffs)) if diffs else None, "step_margins_compared": len(diffs)}


def _step_check(made: Reference, top: StepTop, log_probs: bool, steps: int,
                tolerance: tuple[float, float]) -> tuple[bool, dict[str, Any]]:  # fmt: skip
    """Each step's top-k of a row against the reference's at the ids both hold, within `tolerance`."""
    values = made.top_logprobs if log_probs else made.top_logits
    atol, rtol = tolerance
    worst, relative, over = 0.0, 0.0, []
    for index in range(min(steps, len(values), top.ids.shape[1])):
        theirs = dict(zip(made.top_ids[index].tolist(), values[index].tolist(), strict=True))
        largest = max(abs(v) for v in theirs.values())
        for token, value in zip(top.ids[0, index].tolist(), top.values[0, index].tolist(), strict=True):
            if token in theirs and np.isfinite(value):
                diff = abs(value - theirs[token])
                worst, relative = max(worst, diff), max(relative, diff / largest if largest else 0.0)
                if diff > atol + rtol * largest:
                    over.append(index)
    kind = "log-probabilities" if log_probs else "logits"
    facts = {"step_logit_max_diff": worst, "step_logit_max_relative": relative, "step_logit_tolerance": [atol, rtol],
             "step_top_values": kind,
             "step_logits": f"each step's top-{top.ids.shape[-1]} {kind} at most {worst:.3g} ({relative:.2%} of the "
                            f"step's largest) from native llama.cpp's (tolerance {atol:g} + {rtol:g} x the step's "
                            "largest)"}  # fmt: skip
    if over:
        facts["step_logits"] += f": beyond it at step {over[0]}"
    return not over, facts
