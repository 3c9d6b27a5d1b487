"""Inference latency by the roofline: predict's third method beside operators and the log-linear fit
(harness.analysis.predict_model picks, per target, the one with the lowest held-out error).

latency = overhead + FLOPs per batch at a fitted fraction of the compute ceiling + bytes per batch at a fitted
fraction of the bandwidth those bytes see (the in-cache ceiling, bandwidth_large past it: harness.analysis.
roofline_data) (harness.analysis.roofline_fit), fitted per target on its rows of other models
whose work was counted and whose ceilings were measured. Its error is leave-one-model-out latency MAPE, as the
other methods' is. A target is keyed as predict keys it (hardware, engine, provider, precision) over this
machine's own targets; with rows on several machines, the one holding most of them is the target's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.roofline_data import Book, Where, read_book
from harness.analysis.roofline_fit import MIN_FIT_MODELS, Law, fit, lomo_error, models_of

ROOFLINE = "roofline"
TargetKey = tuple[str, str, str, str]  # (hardware, engine, provider, precision), as harness.analysis.op_predict


@dataclass
class InferenceFit:
    where: Where
    law: Law
    error: float | None  # leave-one-model-out latency MAPE on the target's rows
    models: list[str]
    rows: int
    book: Book  # the target's ceilings, its bytes held against the bandwidth they see (Book.ideal)
    measured: dict[tuple[int, Any], float] = field(default_factory=dict)  # the asked model's own p50 ms, not learned

    def latency_ms(self, per_item: Mapping[str, float | None], batch: int) -> float | None:
        flops, nbytes = per_item.get("flops_per_item"), per_item.get("bytes_per_item")
        if flops is None or nbytes is None:
            return None
        ideal = self.book.ideal(self.where, "inference", (flops * batch, nbytes * batch))
        return self.law.seconds(ideal) * 1000.0 if ideal else None


def inference_fits(
    db_path: Path, precision: str, without: str | None, wants: Callable[[str, str], bool] = lambda h, e: True
) -> dict[TargetKey, InferenceFit]:
    """Per target measured at `precision`, its law from rows of at least MIN_FIT_MODELS models other than `without`."""
    return _fits(read_book(db_path, "inference"), precision, without, wants)


def _fits(book: Book, precision: str, without: str | None, wants: Callable[[str, str], bool]) -> dict:
    found: dict[TargetKey, InferenceFit] = {}
    for where in book.rows:
        if where.device or not wants(where.hardware, where.engine) or not book.has(where, "inference"):
            continue
        points = book.points(where, "inference", without, precision)
        key = (where.hardware, where.engine, where.provider, precision)
        if len(models_of(points)) < MIN_FIT_MODELS or (key in found and found[key].rows >= len(points)):
            continue
        own = [r for r in book.rows[where] if r["model"] == without and r["precision"] == precision]
        measured = {
            (b, s): float(np.median([r["latency_p50_ms"] for r in own if (r["batch_size"], r["seq_len"]) == (b, s)]))
            for b, s in {(r["batch_size"], r["seq_len"]) for r in own}
        }
        found[key] = InferenceFit(where, fit(points), lomo_error(points, scored="time"), models_of(points),
                                  len(points), book, measured)  # fmt: skip
    return found


def roofline_rows(
    fits: Mapping[TargetKey, InferenceFit], asked: Any, per_item: Mapping[tuple[int, Any], Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """predict's rows (harness.analysis.predict_model's shape) for each fitted target at each counted case."""
    rows = []
    for (hardware, engine, provider, precision), found in fits.items():
        for (batch, seq), work in per_item.items():
            latency = found.latency_ms(work, batch)
            if not latency:
                continue
            seen = found.measured.get((batch, seq))
            measured = {"measured_latency_p50_ms": seen} if seen is not None else {}
            rows.append(measured | {
                "model": asked.model, "family": asked.family, "parameters": asked.parameters, "hardware": hardware,
                "engine": engine, "provider": provider, "precision": precision, "batch_size": batch, "seq_len": seq,
                "method": ROOFLINE, "held_out_mape": found.error, "predicted_latency_p50_ms": latency,
                "predicted_throughput_per_s": batch * 1000.0 / latency, "predicted_memory_peak_mb": None,
                "learned_from_marks": "", "learned_from_models": found.models,
            })  # fmt: skip
    return rows
