"""`accelharness predict --mode generate`: a model's TTFT, prefill and decode tokens/s on every target from its
counted generation graph and each target's ceilings (harness.analysis.roofline_predict), or (--evaluate) each
method's held-out error per target. Its options are predict's (harness.cli.predict)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.analysis.tables import AnalysisError
from harness.cli.common import console, errors, fail, say, shown
from harness.core.labels import on_device
from harness.store import StoreError

# what a table cell shows for a figure nothing stands behind
NONE = "—"
ABBREVIATIONS = {"leave-one-model-out": "LOMO", "leave-one-target-out": "LOTO"}


@dataclasses.dataclass(frozen=True)
class Filters:
    hardware: list[str] | None
    engines: list[str] | None
    machine: str | None


def _wants(db: Path, filters: Filters) -> Any:
    from harness.analysis.machines import machine_ids

    ids = machine_ids(db, filters.machine) if filters.machine is not None else None
    return lambda where: (
        (not filters.hardware or where.hardware in filters.hardware)
        and (not filters.engines or where.engine in filters.engines)
        and (ids is None or where.machine in ids)
    )


def predict_generation(spec: Any, precision: str, cases: Any, filters: Filters, db: Path, timeout: float,
                       method: str, max_error: float | None, as_json: bool) -> None:  # fmt: skip
    """Count the model's generation graph at each (batch, prompt, depth), then predict every target."""
    from harness.analysis.predict_model import believable
    from harness.analysis.roofline_predict import METHODS, GenerationAsk
    from harness.analysis.roofline_predict import predict_generation as predicted
    from harness.core.roofline import precision_class

    if method == "operators":
        raise fail("--method operators predicts inference only; generation is predicted by the roofline")
    cls = precision_class(precision)
    if cls is None:
        raise fail(f"--precision {precision} names no precision class a ceiling is held against; give one of fp32, "
                   "fp16, bf16, int8, q4, q4f16")  # fmt: skip
    try:
        wants = _wants(db, filters)  # an unknown --machine refused before the graph is counted
    except (StoreError, AnalysisError) as exc:
        raise fail(str(exc)) from None
    work = _count(spec, precision, cases, timeout, as_json)
    try:
        result = predicted(db, GenerationAsk(spec.name, cls, precision, work.work, cases.new_tokens, wants))
    except (StoreError, AnalysisError) as exc:
        raise fail(str(exc)) from None
    rows, left_out = believable(result.rows, "any" if method == "roofline" else method, max_error)
    notes = result.notes + [f"left out: {why}" for why in left_out]
    if not rows:
        line = f"no generation prediction for {spec.name} here: {'; '.join(notes) or 'no target with ceilings'}"
        return console.print_json(json.dumps({"rows": [], "refused": line})) if as_json else say(line)
    if as_json:
        return console.print_json(json.dumps({"rows": rows, "notes": notes, "methods": METHODS}, default=str))
    _print(spec.name, work, rows, notes, METHODS)


def _count(spec: Any, precision: str, cases: Any, timeout: float, as_json: bool) -> Any:
    from harness.prepare.graph_work import GenerationJob
    from harness.run.worker import count_generation_isolated

    shapes = tuple((b, s, d) for b in cases.batch_sizes for s in cases.sequence_lengths for d in cases.depths)
    (errors if as_json else console).print(f"counting {shown(spec.name)}'s generation graph at {len(shapes)} case(s) "
                  "(exported with past key/values if not cached; not run)")  # fmt: skip
    try:
        return count_generation_isolated(GenerationJob(spec, precision, shapes, cases.new_tokens), timeout)
    except RuntimeError as exc:
        raise fail(str(exc)) from None


# recommend --mode generate predicts a model that ran nowhere at the harness's smallest usual case
DEFAULT_CASE = (32, 16)  # prompt tokens, new tokens
COUNT_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class Measured:
    """What recommend --mode generate measured of the model: (target label, precision) pairs, and one row's case."""

    targets: set[tuple[str, str]]
    precisions: list[str]
    case: tuple[int, int]  # prompt tokens, new tokens


def recommend_predictions(
    model: str, batch: int, db: Path, measured: Measured
) -> tuple[list[dict[str, Any]], list[str]]:
    """recommend --mode generate's predicted candidates: each target with a bandwidth ceiling where the model has
    no ok row at a precision it was measured at (fp32 where none), predicted at depth 0 as `predict --mode generate`
    predicts it; and notes on what could not be predicted. The graph is counted only where such a target exists."""
    from harness.analysis.roofline_data import read_book
    from harness.analysis.roofline_predict import LOMO, GenerationAsk
    from harness.analysis.roofline_predict import predict_generation as predicted
    from harness.core.labels import target_label
    from harness.core.roofline import precision_class
    from harness.prepare.graph_work import GenerationJob
    from harness.prepare.specs import load_specs
    from harness.run.worker import count_generation_isolated

    spec = load_specs().get(model)
    if spec is None or spec.is_seq2seq or not spec.has_past_export:
        return [], []  # no spec to count: the measured rows only
    book = read_book(db, "generate")
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    prompt, new_tokens = measured.case
    for precision in measured.precisions:
        cls = precision_class(precision)
        todo = {w for w in book.targets(cls) if book.has(w, "decode")} if cls else set()
        todo = {w for w in todo if (w.label(), precision) not in measured.targets}
        if not todo:
            continue
        try:
            work = count_generation_isolated(GenerationJob(spec, precision, ((batch, prompt, 0),), new_tokens),
                                             COUNT_TIMEOUT_S)  # fmt: skip
        except RuntimeError as exc:
            notes.append(f"{precision}: {exc}")
            continue
        found = predicted(db, GenerationAsk(model, cls, precision, work.work, new_tokens, lambda w, t=todo: w in t))
        notes += found.notes
        for r in found.rows:
            error = f"{ABBREVIATIONS[r['error_kind']]} error {_error(r['held_out_mape'])}"
            kind = "predicted" if r["error_kind"] == LOMO else "predicted from its ceilings"
            rows.append({"target": target_label(r), "precision": precision, "source": "predicted",
                         **{name: r[name] for name in ("hardware", "engine", "provider", "device")},
                         "decode_tokens_per_s": r["predicted_decode_tokens_per_s"], "ttft_ms": r["predicted_ttft_ms"],
                         "agreement": 1.0 if precision == "fp32" else None, "kl_mean": None,
                         "backed_by": f"{kind}: {r['method']}, {error}, pp{prompt}+tg{new_tokens} @ d0"})  # fmt: skip
    return [r for r in rows if r["decode_tokens_per_s"]], notes


MEASURED_SQL = """SELECT hardware, engine, provider, device, precision, seq_len, new_tokens, status FROM results
WHERE model = ? AND mode = 'generate' ORDER BY created_at DESC"""


def measured_of(db: Path, model: str, choice: Any) -> Measured:
    """What recommend --mode generate does not predict: the (target, precision) pairs it ranks as measured and those
    where the model failed (no prediction says it runs there); the precisions the model ran at (fp32 where none) and
    its latest ok row's case (prompt, new tokens)."""
    from harness.core.labels import target_label
    from harness.store import open_store

    with open_store(db, read_only=True) as store:
        rows = store.query(MEASURED_SQL, [model])
    failed = {(target_label(r), r["precision"]) for r in rows if r["status"] != "ok"}
    ok = [r for r in rows if r["status"] == "ok" and r["seq_len"] and r["new_tokens"]]
    case = (ok[0]["seq_len"], ok[0]["new_tokens"]) if ok else DEFAULT_CASE
    ranked = {(r["target"], r["precision"]) for r in choice.ranked}
    return Measured(ranked | failed, sorted({r["precision"] for r in ok}) or ["fp32"], case)


def _cell(value: float | None, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if value is not None else NONE


def _error(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else f"{NONE} (too few)"


def _print(model: str, work: Any, rows: list[dict[str, Any]], notes: list[str], methods: dict[str, str]) -> None:
    sizes = sorted({r["bytes_per_token"] / 1e6 for r in rows if r.get("bytes_per_token")})
    size = f"{sizes[0]:.2f}–{sizes[-1]:.2f} MB" if len(sizes) > 1 else f"{sizes[0]:.2f} MB" if sizes else "unknown"
    table = Table(title=f"Predicted generation of {shown(model)} at {shown(work.precision)} ({size} read per decode "
                  "token, counted) — predictions, not measurements")  # fmt: skip
    machines = len({r["machine"] for r in rows}) > 1
    names = ("target", *(("machine",) if machines else ()), "case", "method", "TTFT ms", "pp tok/s", "tg tok/s",
             "tg range", "held-out error tg / pp", "learned from", "measured tg tok/s")  # fmt: skip
    for name in names:
        table.add_column(name, overflow="fold")
    sources: dict[str, str] = {}
    for r in rows:
        ranged, learned = r["predicted_decode_range"], r["learned_from"]
        key = sources.setdefault(", ".join(learned["models"]), f"[{len(sources) + 1}]")
        table.add_row(
            shown(on_device(f"{r['hardware']}/{r['engine']}:{r['provider']}", r)),  # `@ firefox`: not this page's
            *((shown(r["machine"]),) if machines else ()),
            f"pp{r['prompt_tokens']}+tg{r['new_tokens']} @ d{r['depth']}", r["method"],
            _cell(r["predicted_ttft_ms"], 2), _cell(r["predicted_prefill_tokens_per_s"], 0),
            _cell(r["predicted_decode_tokens_per_s"]), f"{ranged[0]:,.0f}–{ranged[1]:,.0f}" if ranged else NONE,
            f"{_error(r['held_out_mape'])} / {_error(r['held_out_mape_prefill'])} ({ABBREVIATIONS[r['error_kind']]})",
            shown(f"{learned['rows']} rows of {len(learned['models'])} models {key}"
                  + (f" on {', '.join(learned['targets'])}" if r["error_kind"] != "leave-one-model-out" else "")),
            _cell(r.get("measured_decode_tokens_per_s")),
        )  # fmt: skip
    console.print(table)
    for models, key in sources.items():
        console.print(f"{key} {shown(models)}")
    for method in sorted({r["method"] for r in rows}):
        console.print(f"{method}: {methods[method]}")
    console.print("LOMO: leave-one-model-out; LOTO: leave-one-target-out (its own rows unseen, its ceilings kept)")
    for note in notes:
        console.print(f"note: {shown(note)}")


def evaluate_generation(db: Path, filters: Filters, as_json: bool) -> None:
    from harness.analysis.roofline_predict import evaluate_generation as evaluated

    try:
        found = evaluated(db, _wants(db, filters))
    except (StoreError, AnalysisError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        return console.print_json(json.dumps([dataclasses.asdict(e) for e in found], default=str))
    if not found:
        return say(f"no generate rows with their work counted in {db}: run --mode generate first")
    table = Table(title="Held-out error of generation's predictions: |predicted / measured rate - 1|, mean over rows")
    machines = len({e.machine for e in found}) > 1
    names = ("target", *(("machine",) if machines else ()), "class", "rows", "models",
             "tg LOMO roofline / +nodes / bandwidth only", "tg LOTO roofline / +nodes", "pp LOMO / LOTO",
             "+nodes on the median step LOMO / LOTO", "tg predicted by", "LOTO learned from")  # fmt: skip
    for name in names:
        table.add_column(name, overflow="fold")
    for e in found:
        table.add_row(
            shown(e.target), *((shown(e.machine),) if machines else ()), e.precision_class, str(e.rows), str(e.models),
            _errors(e.roofline["decode"], e.nodes["decode"], e.bandwidth_only),
            _errors(e.from_ceilings["decode"], e.from_ceilings_nodes["decode"]),
            _errors(e.roofline["prefill"], e.from_ceilings["prefill"]),
            _errors(e.nodes["median_step"], e.from_ceilings_nodes["median_step"]), e.used or NONE,
            shown(", ".join(t if machines else t.split(" on ")[0] for t in e.learned_from_targets) or NONE),
        )  # fmt: skip
    console.print(table)
    console.print("LOMO: each model predicted by a fit that saw none of its rows; LOTO: each target predicted with "
                  "only its ceilings kept, from the same engine and EP's other targets. roofline: a step overhead + "
                  "bytes at a fraction of the bandwidth they see (the in-cache ceiling, bandwidth_large past it); "
                  "+nodes: roofline+nodes, a cost per dispatched node + "
                  "weights, KV cache and activations each at its own fraction; bandwidth only: eff × BW / bytes (the "
                  "baseline); on the median step: roofline+nodes held against each row's TPOT p50, not its mean "
                  "(a row's slow first generations left out); tg predicted by: the method of lower LOMO here"
                  )  # fmt: skip


def _errors(*values: float | None) -> str:
    return " / ".join(f"{v:.0%}" if v is not None else NONE for v in values)
