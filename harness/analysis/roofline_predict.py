"""Generation predicted from the hardware's limits: a model's counted work over each target's
measured ceilings, times what that target's measured rows of other models say it reaches (harness.analysis.
roofline_fit). A decode step has two laws (harness.analysis.roofline_data):
  roofline        a fixed step overhead plus the bytes per token at a fitted fraction of the bandwidth ceiling
  roofline+nodes  a cost per dispatched node plus the weights, the KV cache and the activations the step moves,
                  each at its own fitted fraction of the bandwidth ceiling; all four counted from the graph. A tiny
                  model's step is its kernel launches (nodes, which grow with its layers), and a page copies the
                  KV cache in and out of wasm memory every step (KV bytes cost several times a weight's there)
and each target takes the one with the lower leave-one-model-out error on its rows of the other models (never the
asked one's), and says which. Prefill (TTFT) has one law: a fixed overhead plus the prompt's FLOPs at a fitted
fraction of the compute ceiling.

Each target is predicted by the first way it has:
  own rows        its rows of at least two other models (three for roofline+nodes): the law fitted on them; its
                  error is leave-one-model-out on every model's rows there (the asked model's too, where it was
                  measured: its term is exactly this prediction's error)
  from ceilings   a target with ceilings and too few rows of its own (wasm at 2 threads where only wasm at 1 thread
                  ran models; a machine imported from a bundle that measured only ceilings): the law fitted on the
                  rows of the same engine and EP elsewhere (other thread counts, machines, devices), each row held
                  against its own target's ceilings, applied to this target's ceilings (a node costs what it costs
                  there: no ceiling prices it); its range is what each of those targets' own law predicts here, and
                  its error is leave-one-target-out over them (each predicted from the others, its own rows unseen,
                  its ceilings kept); the law is the one of lower error there
The asked model's own rows are never learned from: a model that was measured is predicted as if it had not been,
its measured figures shown beside. Predictions are never stored as results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.roofline_data import NO_OVERHEAD, Book, Where, bytes_moved, phase_work, read_book
from harness.analysis.roofline_fit import (
    MIN_FIT_MODELS,
    MIN_STEP_MODELS,
    Law,
    Point,
    fit,
    lomo_error,
    mean_error,
    models_of,
)

ROOFLINE, NODES, FROM_CEILINGS = "roofline", "roofline+nodes", " from ceilings"
LOMO, LOTO = "leave-one-model-out", "leave-one-target-out"
LAWS = {"decode": {ROOFLINE: "decode", NODES: "step"}, "prefill": {ROOFLINE: "prefill"}}  # method -> its fit
MIN_MODELS = {"decode": MIN_FIT_MODELS, "prefill": MIN_FIT_MODELS, "step": MIN_STEP_MODELS, "step_median": 3}
# Which bandwidth a step's bytes are held against, every row's and fit's alike (harness.analysis.roofline_data.Book)
SEEN = (
    "; bytes at the bandwidth they see: the in-cache bandwidth ceiling up to its graph's working set, bandwidth_large "
    "(live tensors past any last-level cache) from its own, interpolated in log(bytes) between (the bandwidth ceiling "
    "alone where the target has no bandwidth_large); the row's bandwidth_used says which"
)
METHODS = {
    ROOFLINE: "a fixed step overhead plus the counted work (bytes per decode token, prefill FLOPs) at a fitted "
    "fraction of the target's measured ceiling, fitted on this target's rows of other models" + SEEN,
    NODES: "a cost per dispatched node plus the weights, the KV cache and the activations a decode step moves, each "
    "at its own fitted fraction of the bandwidth ceiling (all counted from the graph), fitted on this target's rows "
    "of other models" + SEEN,
    ROOFLINE + FROM_CEILINGS: "the roofline law fitted on the same engine and EP's rows elsewhere (other thread "
    "counts, machines), applied to this target's own measured ceilings; the range is each of those targets' own law"
    + SEEN,
    NODES + FROM_CEILINGS: "the roofline+nodes law fitted on the same engine and EP's rows elsewhere, its byte terms "
    "applied to this target's own bandwidth ceiling and its per-node cost as learned there; the range is each of "
    "those targets' own law" + SEEN,
}
Case = tuple[int, int, int]  # (batch, prompt tokens, depth)


@dataclass
class Learned:
    """What one phase on one target is predicted with."""

    method: str
    fitted: str  # the law's phase in harness.analysis.roofline_data (decode, step, prefill)
    law: Law
    error: float | None  # held-out rate error (LOMO on its own rows, LOTO from ceilings)
    sources: list[Where]
    models: list[str]
    rows: int
    range_laws: list[Law] = field(default_factory=list)  # from ceilings: each source's own law

    @property
    def from_ceilings(self) -> bool:
        return self.method.endswith(FROM_CEILINGS)


def fitted(points: Sequence[Point], fitted_phase: str) -> Law:
    return fit(points, overhead=fitted_phase not in NO_OVERHEAD)


def held_out(points: Sequence[Point], fitted_phase: str) -> float | None:
    """The law's leave-one-model-out rate error on `points` (None: too few models for each fold to fit the law:
    roofline+nodes is held out only over four models or more)."""
    if len(models_of(points)) <= MIN_MODELS[fitted_phase]:
        return None
    return lomo_error(points, overhead=fitted_phase not in NO_OVERHEAD)


def _pooled(book: Book, sources: Sequence[Where], phase: str, without: str | None) -> list[Point]:
    return [p for s in sources for p in book.points(s, phase, without)]


def siblings(book: Book, where: Where, phase: str, without: str | None) -> list[Where]:
    """The targets a target known by its ceilings learns from: its family's others with a law of their own."""
    least = MIN_MODELS[phase]
    return sorted(
        w
        for w in book.rows
        if w.family == where.family and w != where and len(models_of(book.points(w, phase, without))) >= least
    )


def loto_error(book: Book, family: Sequence[Where], phase: str, without: str | None) -> float | None:
    """Leave-one-target-out over a family: each target's rows predicted by the law of the others' rows, held
    against its own ceilings (its rows unseen); None where no target has another to learn from."""
    pairs: list[tuple[Point, float]] = []
    for left_out in family:
        others = _pooled(book, [w for w in family if w != left_out], phase, without)
        if len(models_of(others)) < MIN_MODELS[phase]:
            continue
        law = fitted(others, phase)
        pairs += [(p, law.seconds(p.ideal_s)) for p in book.points(left_out, phase, without)]
    return mean_error(pairs)


def _lowest(errors: dict[str, float | None]) -> str:
    """The method of the lowest known error (the first named where none is known)."""
    return min(errors, key=lambda method: (errors[method] is None, errors[method] or 0.0))


def learn(book: Book, where: Where, phase: str, without: str | None,
          priced: Callable[[str], bool] = lambda fitted_phase: True) -> Learned | str:  # fmt: skip
    """The phase's law on the target, or why there is none; `priced`: whether the asked model's counted work has
    every term of a law (a graph whose shapes were not all inferred has no activation bytes)."""
    laws = {m: f for m, f in LAWS[phase].items() if book.has(where, f) and priced(f)}
    if not laws:
        return f"no {phase} ceiling measured"
    own = {m: book.points(where, f, without) for m, f in laws.items()}
    fits = {m: pts for m, pts in own.items() if len(models_of(pts)) >= MIN_MODELS[laws[m]]}
    if fits:  # chosen on the other models' rows; its error: the method's on every model here, the asked one's too
        method = _lowest({m: held_out(pts, laws[m]) for m, pts in fits.items()})
        f, pts = laws[method], fits[method]
        return Learned(method, f, fitted(pts, f), held_out(book.points(where, f), f), [where], models_of(pts), len(pts))
    return _from_ceilings(book, where, laws, own, without) or _why_not(book, where, own.get(ROOFLINE, []))


def _from_ceilings(book: Book, where: Where, laws: dict[str, str], own: dict[str, list[Point]],
                   without: str | None) -> Learned | None:  # fmt: skip
    sources = {m: siblings(book, where, f, without) for m, f in laws.items()}
    sources = {m: found for m, found in sources.items() if found}
    if not sources:
        return None
    chosen = {m: loto_error(book, sources[m], laws[m], without) for m in sources}  # among the sources themselves
    if all(e is None for e in chosen.values()):  # one source: the law of lower LOMO there
        chosen = {m: held_out(_pooled(book, sources[m], laws[m], without), laws[m]) for m in sources}
    method = _lowest(chosen)
    f, found = laws[method], sources[method]
    pooled = _pooled(book, found, f, without)
    error = loto_error(book, [*found, where] if own.get(method) else found, f, None)
    ranges = [fitted(book.points(s, f, without), f) for s in found]
    return Learned(method + FROM_CEILINGS, f, fitted(pooled, f), error, found, models_of(pooled), len(pooled), ranges)


def _why_not(book: Book, where: Where, own: list[Point]) -> str:
    cls = where.precision_class
    # a row counts here only with this phase's work counted (a GGUF's rows count bytes, never FLOPs: no graph)
    held = (f"{cls} rows of {len(models_of(own))} other model(s) here with its work counted" if own
            else f"no {cls} rows here with its work counted")  # fmt: skip
    elsewhere = (f"no {'/'.join(where.family[:3])} target elsewhere has such {cls} rows of {MIN_FIT_MODELS}+ "
                 "models")  # fmt: skip
    return f"{held}, and {elsewhere}"


# --- predict --mode generate ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerationAsk:
    model: str
    precision_class: str
    precision: str
    work: dict[Case, dict[str, Any]]  # per case, the counted graph's work fields (harness.prepare.graph_work)
    new_tokens: int
    wants: Callable[[Where], bool] = lambda where: True  # --hardware, --engines, --machine


@dataclass
class GenerationPredictions:
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def predict_generation(db_path: Path, ask: GenerationAsk) -> GenerationPredictions:
    """Every target at the asked precision class with a bandwidth ceiling, by the first method it has."""
    book = read_book(db_path, "generate")
    rows, notes = [], []
    priced = lambda law: all(None not in (phase_work(law, w) or (None,)) for w in ask.work.values())  # noqa: E731
    for where in sorted(w for w in book.targets(ask.precision_class) if ask.wants(w)):
        decode = learn(book, where, "decode", ask.model, priced)
        if isinstance(decode, str):
            notes.append(f"{_name(book, where)}: not predicted: {decode}")
            continue
        prefill = learn(book, where, "prefill", ask.model)
        if isinstance(prefill, str):
            notes.append(f"{_name(book, where)}: TTFT and prefill not predicted: {prefill}")
        for case, work in sorted(ask.work.items()):
            rows.append(_row(book, where, ask, case, work, decode, prefill if isinstance(prefill, Learned) else None))
    return GenerationPredictions(rows, notes)


def _name(book: Book, where: Where) -> str:
    machine = book.machines.get(where.machine, where.machine[:8] or "unrecorded machine")
    return f"{where.label()} on {machine}"


def _row(book: Book, where: Where, ask: GenerationAsk, case: Case, work: dict[str, Any], decode: Learned,
         prefill: Learned | None) -> dict[str, Any]:  # fmt: skip
    batch, prompt, depth = case
    shape = work | {"batch_size": batch, "seq_len": prompt}
    step = _seconds(book, where, decode.fitted, decode.law, shape)
    rates = [batch / s for s in (_seconds(book, where, decode.fitted, law, shape) for law in decode.range_laws) if s]
    ttft = _seconds(book, where, "prefill", prefill.law, shape) if prefill else None
    row = {
        "model": ask.model, "machine": book.machines.get(where.machine, ""), "hardware": where.hardware,
        "engine": where.engine, "provider": where.provider, "device": where.device or None,
        "precision": ask.precision, "batch_size": batch, "prompt_tokens": prompt, "depth": depth,
        "new_tokens": ask.new_tokens, "method": decode.method,
        "error_kind": LOTO if decode.from_ceilings else LOMO,
        "predicted_decode_tokens_per_s": batch / step if step else None,
        "predicted_decode_range": [min(rates), max(rates)] if len(rates) > 1 else None,
        "predicted_ttft_ms": ttft * 1000.0 if ttft else None,
        "predicted_prefill_tokens_per_s": batch * prompt / ttft if ttft else None,
        "held_out_mape": decode.error, "held_out_mape_prefill": prefill.error if prefill else None,
        "prefill_method": prefill.method if prefill else None,
        "learned_from": {"targets": [_name(book, s) for s in decode.sources], "models": decode.models,
                         "rows": decode.rows},
        "decode_law": law_terms(decode), "bytes_per_token": work.get("bytes_per_token"),
        "step_nodes": work.get("step_nodes"), "bandwidth_gbps": book.ceiling(where, "bandwidth"),
        "bandwidth_large_gbps": book.ceiling(where, "bandwidth_large"),
        "compute_gflops": book.ceiling(where, "compute"), **_bandwidth_used(book, where, decode.fitted, shape),
    }  # fmt: skip
    return row | _measured(book, where, ask.model, case)


def _bandwidth_used(book: Book, where: Where, phase: str, work: dict[str, Any]) -> dict[str, Any]:
    """The bandwidth the decode step's bytes were held against (Book.bandwidth): GB/s and which ceiling, in words."""
    terms = phase_work(phase, work)
    seen = book.bandwidth(where, bytes_moved(phase, terms)) if terms else None
    return {"bandwidth_used_gbps": seen[0] if seen else None, "bandwidth_used": seen[1] if seen else None}


def law_terms(learned: Learned) -> dict[str, float | None]:
    """The decode law's figures: its fixed cost (per step, or per node) and the fraction of the bandwidth ceiling
    it reaches on each kind of bytes (None: that term was not seen to cost anything)."""
    law = learned.law
    if learned.fitted == "step":
        names = ("efficiency_weights", "efficiency_kv_cache", "efficiency_activations")
        return {"per_node_us": law.slopes[0] * 1e6} | dict(zip(names, law.efficiencies[1:], strict=True))
    return {"overhead_ms": law.overhead_s * 1000.0, "efficiency_bytes": law.efficiencies[0]}


def _seconds(book: Book, where: Where, phase: str, law: Law, work: dict[str, Any]) -> float | None:
    terms = phase_work(phase, work)
    if not terms or any(t is None for t in terms):
        return None
    ideal = book.ideal(where, phase, terms)  # type: ignore[arg-type]
    return law.seconds(ideal) if ideal else None


def _measured(book: Book, where: Where, model: str, case: Case) -> dict[str, float]:
    """The asked model's own figures at this case on this target, where it was measured (never learned from)."""
    batch, prompt, depth = case
    same = [r for r in book.rows.get(where, []) if (r["model"], r["batch_size"], r["seq_len"], r["depth"] or 0)
            == (model, batch, prompt, depth)]  # fmt: skip
    found = {}
    for name in ("decode_tokens_per_s", "prefill_tokens_per_s", "ttft_ms"):
        values = [r[name] for r in same if r[name]]
        if values:
            found[f"measured_{name}"] = float(np.median(values))
    return found


# --- predict --evaluate --mode generate ---------------------------------------------------------------------------
@dataclass
class GenerationErrors:
    """One measured target's held-out errors, per method, on its own rows."""

    target: str
    machine: str
    precision_class: str
    rows: int
    models: int
    roofline: dict[str, float | None]  # per phase (decode, prefill), leave-one-model-out
    nodes: dict[str, float | None]  # roofline+nodes: decode, and median_step (held against TPOT p50), LOMO
    bandwidth_only: float | None  # decode without the overhead: eff x BW / bytes, leave-one-model-out
    from_ceilings: dict[str, float | None]  # roofline per phase, leave-one-target-out
    from_ceilings_nodes: dict[str, float | None]  # roofline+nodes: decode and median_step, leave-one-target-out
    used: str | None  # the decode method its predictions take (the lower LOMO), None: neither fits
    learned_from_targets: list[str] = field(default_factory=list)  # the from-ceilings fit's other targets


def evaluate_generation(db_path: Path, wants: Callable[[Where], bool] = lambda where: True) -> list[GenerationErrors]:
    book = read_book(db_path, "generate")
    found = []
    for where in sorted(w for w in book.rows if wants(w)):
        decode = book.points(where, "decode")
        if not decode:
            continue
        chosen = learn(book, where, "decode", None)
        found.append(
            GenerationErrors(
                where.label(), book.machines.get(where.machine, ""), where.precision_class, len(decode),
                len(models_of(decode)),
                {phase: held_out(book.points(where, phase), phase) for phase in ("decode", "prefill")},
                {"decode": held_out(book.points(where, "step"), "step"),
                 "median_step": held_out(book.points(where, "step_median"), "step_median")},
                lomo_error(decode, overhead=False),
                {phase: _left_out(book, where, phase) for phase in ("decode", "prefill")},
                {"decode": _left_out(book, where, "step"), "median_step": _left_out(book, where, "step_median")},
                chosen.method if isinstance(chosen, Learned) and not chosen.from_ceilings else None,
                [_name(book, w) for w in siblings(book, where, "decode", None)],
            )
        )  # fmt: skip
    return found


def _left_out(book: Book, where: Where, phase: str) -> float | None:
    """The target's rows predicted with only its ceilings kept: the law of its family's other targets."""
    pooled = _pooled(book, siblings(book, where, phase, None), phase, None)
    if len(models_of(pooled)) < MIN_MODELS[phase]:
        return None
    law = fitted(pooled, phase)
    return mean_error([(p, law.seconds(p.ideal_s)) for p in book.points(where, phase)])
