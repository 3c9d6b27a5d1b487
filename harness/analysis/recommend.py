"""Hardware recommendation (the seeds' hardware selector), backed by measured rows or predictions.

Candidates are the targets (hardware/engine/provider) the store knows, narrowed to the hardware
the user has. Each is scored on latency, throughput, memory and compatibility, each normalised
against the best candidate (1.0 = best), and combined with the user's weights. A candidate
measured for the model at that batch size uses the medians of its latest rows; otherwise a
prediction is used, and the candidate says so with the predictor's held-out error.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.predict import InsufficientData, Predictor, Query, model_facts, training_rows
from harness.analysis.speech import row_wer
from harness.core.labels import TARGET_FIELDS, browser_of, flags, in_page, served, target_key, target_label
from harness.store import open_store

TASK_FAMILIES = {
    "feature-extraction": "embedding",
    "sentence-similarity": "embedding",
    "fill-mask": "embedding",
    "text-classification": "embedding",
    "text-generation": "text_generation",
    "summarization": "text_generation",
    "translation": "text_generation",
    "image-classification": "vision",
    "object-detection": "vision",
    "automatic-speech-recognition": "audio",
    "audio-classification": "audio",
    "zero-shot-image-classification": "multimodal",
    "image-to-text": "multimodal",
}
SIZE_CLASSES = ((100e6, "small"), (1e9, "medium"), (float("inf"), "large"))
# A generate() call's time depends on how many tokens it makes, which the predictor does not model.
RECOMMEND_MODES = ("inference", "training")


@dataclass(frozen=True)
class ScoreWeights:
    latency: float = 0.4
    throughput: float = 0.3
    memory: float = 0.1
    compatibility: float = 0.2


@dataclass
class Candidate:
    target: str
    hardware: str
    engine: str
    provider: str
    device: str | None  # a device served by `web --serve`, None for this machine's targets
    source: str  # measured | predicted
    latency_ms: float
    throughput_per_s: float
    memory_mb: float | None  # None where nothing was measured (a served device has no process to watch)
    compatibility: float  # share of this target's rows for the model (or family) that ran ok
    evidence: list[str] = field(default_factory=list)  # result ids, or the prediction's error
    score: float = 0.0


@dataclass
class Recommendation:
    subject: str
    batch_size: int
    mode: str
    primary: Candidate | None
    fallbacks: list[Candidate]
    excluded: list[str]  # targets that never ran ok, with the reason
    weights: ScoreWeights


def _latest_rows(db_path: Path, models: list[str], mode: str) -> list[dict[str, Any]]:
    """The latest row per (model, target, batch, seq, precision) of one mode for these models, any status."""
    sql = """
        SELECT * FROM results WHERE model IN (SELECT unnest(?)) AND mode = ?
        QUALIFY row_number() OVER (PARTITION BY model, hardware, engine, provider, device, batch_size, seq_len,
                                                precision ORDER BY created_at DESC) = 1
    """
    with open_store(db_path, read_only=True) as store:
        return store.query(sql, [models, mode])


def _family_models(db_path: Path, family: str) -> list[str]:
    with open_store(db_path, read_only=True) as store:
        return [r["model"] for r in store.query("SELECT DISTINCT model FROM results WHERE family = ?", [family])]


def _label(*target: Any) -> str:
    return target_label(dict(zip(TARGET_FIELDS, target, strict=True)))


def _measured_candidates(rows: list[dict[str, Any]], batch: int) -> tuple[dict[tuple, Candidate], list[str]]:
    by_target: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        by_target.setdefault(target_key(row), []).append(row)
    candidates, excluded = {}, []
    for key, target_rows in by_target.items():
        compatibility = sum(r["status"] == "ok" for r in target_rows) / len(target_rows)
        at_batch = [r for r in target_rows if r["status"] == "ok" and r["batch_size"] == batch]
        if compatibility == 0:
            excluded.append(f"{_label(*key)}: never ran ok ({target_rows[0]['status']}: {target_rows[0]['error']})")
        elif at_batch:
            candidates[key] = Candidate(
                _label(*key),
                *key,
                source="measured",
                latency_ms=float(np.median([r["latency_p50_ms"] for r in at_batch])),
                throughput_per_s=float(np.median([r["throughput_per_s"] for r in at_batch])),
                memory_mb=_median_measured([r["memory_peak_mb"] for r in at_batch]),
                compatibility=compatibility,
                evidence=[r["result_id"] for r in at_batch],
            )
    return candidates, excluded


def _predicted_candidates(
    db_path: Path,
    model: str,
    batch: int,
    seq: int | None,
    mode: str,
    known: set[tuple],
    family_compat: dict[tuple, float],
) -> tuple[dict[tuple, Candidate], list[str]]:
    try:
        predictor = Predictor(training_rows(db_path, mode))
    except InsufficientData as exc:
        return {}, [f"no predictions: {exc}"]
    family, parameters = model_facts(db_path, model)
    # the predictor learns this machine's targets only (device None): served devices are measured, not predicted
    targets = [(*t, None) for t in sorted(predictor.known_targets)]
    targets = [t for t in targets if t not in known and family_compat.get(t, 0) > 0]
    queries = [Query(model, family, parameters, *t[:3], batch_size=batch, seq_len=seq) for t in targets]
    error = f"predicted (leave-one-model-out MAPE {predictor.mape['latency_p50_ms']:.0%})"
    candidates = {}
    for target, values in zip(targets, predictor.predict(queries) if queries else [], strict=True):
        candidates[target] = Candidate(
            _label(*target),
            *target,
            source="predicted",
            latency_ms=values["latency_p50_ms"],
            throughput_per_s=values["throughput_per_s"],
            memory_mb=_median_measured([values["memory_peak_mb"]]),
            compatibility=family_compat[target],
            evidence=[error],
        )
    return candidates, []


def _median_measured(values: list[float | None]) -> float | None:
    """The median of the measured values (neither NULL nor NaN), or None when none was measured."""
    measured = [v for v in values if v is not None and not np.isnan(v)]
    return float(np.median(measured)) if measured else None


def _score(candidates: list[Candidate], weights: ScoreWeights) -> None:
    """Each metric normalised to the best candidate (1.0), then the weighted mean."""
    best_latency = min(c.latency_ms for c in candidates)
    best_throughput = max(c.throughput_per_s for c in candidates)
    memories = [c.memory_mb for c in candidates if c.memory_mb is not None]
    total = weights.latency + weights.throughput + weights.memory + weights.compatibility
    for c in candidates:
        memory_score = min(memories) / c.memory_mb if c.memory_mb is not None else 0.0
        c.score = (
            weights.latency * best_latency / c.latency_ms
            + weights.throughput * c.throughput_per_s / best_throughput
            + weights.memory * memory_score
            + weights.compatibility * c.compatibility
        ) / total


def _family_compatibility(db_path: Path, family: str, mode: str) -> dict[tuple, float]:
    rows = _latest_rows(db_path, _family_models(db_path, family), mode)
    shares: dict[tuple, list[bool]] = {}
    for r in rows:
        shares.setdefault(target_key(r), []).append(r["status"] == "ok")
    return {k: sum(v) / len(v) for k, v in shares.items()}


def recommend(
    db_path: Path,
    model: str | None = None,
    family: str | None = None,
    task: str | None = None,
    batch_size: int = 1,
    seq_len: int | None = None,
    mode: str = "inference",
    hardware: list[str] | None = None,
    weights: ScoreWeights | None = None,
    browser: str | None = None,
) -> Recommendation:
    """Rank the targets for a model (or a family's measured models) at a batch size, from the rows
    of one mode (inference or training) only."""
    weights = weights or ScoreWeights()
    if mode not in RECOMMEND_MODES:
        raise ValueError(f"recommend ranks one of the modes {', '.join(RECOMMEND_MODES)}, not '{mode}'")
    family = family or (TASK_FAMILIES.get(task) if task else None)
    if model is None and family is None:
        raise ValueError(f"give --model, --model-family or a known --task ({', '.join(sorted(TASK_FAMILIES))})")
    models = [model] if model else _family_models(db_path, family or "")
    candidates, excluded = _measured_candidates(_latest_rows(db_path, models, mode), batch_size)
    if model is not None:
        family = family or model_facts(db_path, model)[0]
        predicted, notes = _predicted_candidates(
            db_path,
            model,
            batch_size,
            seq_len,
            mode,
            set(candidates),
            _family_compatibility(db_path, family, mode),
        )
        candidates |= predicted
        excluded += notes
    if hardware:
        excluded += [
            f"{c.target}: not in --hardware {','.join(hardware)}"
            for c in candidates.values()
            if c.hardware not in hardware
        ]
        candidates = {k: c for k, c in candidates.items() if c.hardware in hardware}
    if browser:
        excluded += [f"{c.target}: not in --browser {browser}" for k, c in candidates.items() if not _in(k, browser)]
        candidates = {k: c for k, c in candidates.items() if _in(k, browser)}
    ranked = list(candidates.values())
    if ranked:
        _score(ranked, weights)
        ranked.sort(key=lambda c: c.score, reverse=True)
    subject = model or f"family {family}"
    return Recommendation(subject, batch_size, mode, ranked[0] if ranked else None, ranked[1:], excluded, weights)


@dataclass
class GenerationChoice:
    """generate targets of one model ranked by decode rate, above a quality floor where one is asked."""

    subject: str
    batch_size: int
    min_agreement: float | None
    ranked: list[dict[str, Any]]  # ok rows, fastest decode first: target, precision, rates, agreement, KL
    excluded: list[str]  # rows below the agreement floor, or whose agreement was not measured


def agreement(row: dict[str, Any]) -> float | None:
    """A generate row's top-1 agreement with the fp32 model: 1 for an fp32 row (it is that model), the
    measured figure at another precision, None where it was not measured."""
    return 1.0 if row["precision"] == "fp32" else row.get("agreement_top1")


def _in(key: tuple[Any, ...], browser: str) -> bool:
    """Whether a target is native (every browser's user has it) or a page of this browser."""
    row = dict(zip(TARGET_FIELDS, key, strict=True))
    return not in_page(row) or browser_of(row) == browser


def fastest_generation(db_path: Path, model: str, batch_size: int = 1, min_agreement: float | None = None,
                       browser: str | None = None) -> GenerationChoice:  # fmt: skip
    """The model's generate targets (target x precision, their latest ok rows at the batch size) by decode
    tokens/s; with min_agreement (0..1), only those whose top-1 agreement with the fp32 model reaches it."""
    if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"--min-agreement takes a share from 0 to 1 (got {min_agreement:g})")
    rows = [r for r in _latest_rows(db_path, [model], "generate") if r["status"] == "ok"
            and r["batch_size"] == batch_size and r["decode_tokens_per_s"] is not None
            and (browser is None or _in(target_key(r), browser))]  # fmt: skip
    kept, excluded = [], []
    for row in rows:
        share, label = agreement(row), f"{target_label(row)} {row['precision']}"
        if min_agreement is not None and share is None:
            excluded.append(f"{label}: its agreement with the fp32 model was not measured")
        elif min_agreement is not None and share < min_agreement:  # type: ignore[operator]
            excluded.append(f"{label}: top-1 agreement {share:.3f} below {min_agreement:g}")
        else:
            kept.append(row | {"target": target_label(row), "agreement": share, "source": "measured"})
    kept.sort(key=lambda r: r["decode_tokens_per_s"], reverse=True)
    return GenerationChoice(model, batch_size, min_agreement, kept, excluded)


def with_predicted(choice: GenerationChoice, predicted: list[dict[str, Any]], browser: str | None = None) -> None:
    """Predicted targets (harness.cli.predict_generate.recommend_predictions: `source` predicted, their method and
    held-out error in `backed_by`) ranked among the measured ones under the same floor and --browser; a predicted
    row at a precision other than fp32 has no measured agreement, so a floor leaves it out."""
    for row in predicted:
        label = f"{row['target']} {row['precision']} (predicted)"
        if browser is not None and not _in(target_key(row), browser):
            continue
        if choice.min_agreement is not None and row["agreement"] is None:
            choice.excluded.append(f"{label}: a prediction has no measured agreement with the fp32 model")
        else:
            choice.ranked.append(row)
    choice.ranked.sort(key=lambda r: r["decode_tokens_per_s"], reverse=True)


def check_max_wer(max_wer: float) -> None:
    """--max-wer's value: a finite word error rate of 0 or more (one above 1 is measurable: more words than said)."""
    if not 0.0 <= max_wer < math.inf:
        raise ValueError(f"--max-wer takes a word error rate of 0 or more, e.g. 0.3 (got {max_wer:g})")


def within_wer(choice: GenerationChoice, max_wer: float) -> None:
    """--max-wer: the ranked rows whose word error rate is above it, or unmeasured (a prediction's, a row without
    text, a model that is not speech), leave the ranking for the excluded list, each with why; the kept keep it."""
    check_max_wer(max_wer)
    kept = []
    for row in choice.ranked:
        label = f"{row['target']} {row['precision']}" + (" (predicted)" if row.get("source") == "predicted" else "")
        wer, why = row_wer(row)
        if wer is None:
            choice.excluded.append(f"{label}: {why}")
        elif wer > max_wer:
            choice.excluded.append(f"{label}: WER {wer:.3f} above {max_wer:g}")
        else:
            kept.append(row | {"wer": wer})
    choice.ranked = kept


def one_line(db_path: Path, model: str, batch_size: int = 1, mode: str = "inference") -> str:
    """One sentence a user can act on, from the store's latest ok rows of `model` at `batch_size` on this
    machine: its fastest target by p50, and the browser's fastest at the same sequence and precision."""
    rows = [
        r
        for r in _latest_rows(db_path, [model], mode)
        if r["status"] == "ok" and r["batch_size"] == batch_size and not served(r)
    ]
    if not rows:
        return f"{model} has no ok {mode} row at batch {batch_size} on this machine in {db_path}: nothing to recommend"
    best = min(rows, key=lambda r: r["latency_p50_ms"])
    same_case = [r for r in rows if (r["seq_len"], r["precision"]) == (best["seq_len"], best["precision"])]
    browser = [r for r in same_case if in_page(r)]
    case = f"batch {batch_size}" + (f", sequence {best['seq_len']}" if best["seq_len"] else "")
    line = f"for {model} at {case}, {best['precision']}, here: {_fastest(best)}"
    if in_page(best):
        return f"{line} (a browser target is the fastest)"
    if not browser:
        return f"{line}; no browser target ran it ok"
    return f"{line}; the browser's best: {_fastest(min(browser, key=lambda r: r['latency_p50_ms']))}"


def _fastest(row: dict[str, Any]) -> str:
    marks = flags(row)
    return f"{target_label(row)}, {row['latency_p50_ms']:.3g} ms p50" + (f" ({'; '.join(marks)})" if marks else "")


def size_class(parameters: int) -> str:
    return next(name for limit, name in SIZE_CLASSES if parameters < limit)


def selection_map(db_path: Path, weights: ScoreWeights | None = None) -> dict[str, Any]:
    """family × size class × batch × mode → the recommended target, from the store's measured models."""
    with open_store(db_path, read_only=True) as store:
        combos = store.query(
            "SELECT DISTINCT family, model, CAST(details->>'$.parameters' AS BIGINT) AS parameters, batch_size, "
            "mode FROM results WHERE status = 'ok' AND details->>'$.parameters' IS NOT NULL "
            "AND mode IN (SELECT unnest(?)) ORDER BY ALL",
            [list(RECOMMEND_MODES)],
        )
    selection: dict[str, Any] = {}
    for combo in combos:
        batch, mode = combo["batch_size"], combo["mode"]
        result = recommend(db_path, model=combo["model"], batch_size=batch, mode=mode, weights=weights)
        key = f"{combo['family']}/{size_class(combo['parameters'])}/batch{batch}/{mode}"
        selection.setdefault(key, {})[combo["model"]] = (
            {"target": result.primary.target, "score": round(result.primary.score, 3), "source": result.primary.source}
            if result.primary
            else None
        )
    return selection


def as_json(result: Recommendation) -> str:
    return json.dumps(asdict(result), indent=2, default=str)
