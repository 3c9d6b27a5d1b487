"""`accelharness predict`: a model's latency on every measured target, by operators, the log-linear fit or the
roofline, or (--evaluate) each method's leave-one-model-out error on the store; `--mode generate`: its TTFT,
prefill and decode tokens/s by the roofline (harness.cli.predict_generate)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from harness.analysis.machines import one_machine
from harness.analysis.options import Predict
from harness.analysis.tables import AnalysisError
from harness.cli.common import (
    console,
    fail,
    refuse_bad,
    request_values,
    say,
    shown,
    split_list,
    with_options,
)
from harness.core.options import check, declared
from harness.run.plan import MAX_TIMEOUT_S, RequestError, RunOptions, check_context, check_seconds
from harness.store import StoreError

if TYPE_CHECKING:
    from harness.prepare.graph_work import GraphWork

METHODS = {
    "operators": "per-op-class costs fitted on this target's profiled runs (--profile), summed over the model's "
    "ONNX graph at each case (counted, not run), calibrated on measured latencies",
    "log-linear": "ridge regression in log space on parameter counts, batch, sequence, family and target",
    "roofline": "a fixed overhead plus the graph's FLOPs and bytes per item (counted, not run) at fitted fractions of "
    "the target's measured compute and bandwidth ceilings, fitted on this target's rows of other models",
}


# The run options predict takes (harness.run.plan.RunOptions): the cases to predict, each written once on its field.
CASES = ("batch_sizes", "sequence_lengths", "new_tokens", "depths")


# predict's own options: harness.analysis.options.Predict (its --precision the one it predicts for)
@with_options(RunOptions, CASES)
@with_options(Predict)
def predict(
    *,
    model: str | None,
    model_path: Path | None,
    model_family: str | None,
    hardware: str | None,
    engines: str | None,
    precision: str,
    mode: str,
    evaluate: bool,
    method: str,
    max_error: str | None,
    timeout: float,
    machine: str | None,
    db_path: Path,
    as_json: bool,
    **options: Any,
) -> None:
    """Predict latency (and, by the log-linear fit, throughput and memory) for untested combinations, even
    for a model never measured: each target by operators where it has profiles, else by the log-linear fit;
    every row names its method and that method's held-out error."""
    refuse_bad(Predict, mode=mode)
    if mode == "generate":
        return _generate(model, model_path, model_family, hardware, engines, precision, evaluate, method, max_error,
                         timeout, machine, db_path, as_json, options)  # fmt: skip
    if evaluate:
        if model or model_path:
            raise fail("--evaluate scores the predictors on the whole store; it takes no --model or --model-path")
        try:
            with one_machine(db_path, machine) as scoped:
                return _evaluate(scoped, as_json)
        except (StoreError, AnalysisError) as exc:
            raise fail(str(exc)) from None
    if (model is None) == (model_path is None):
        raise fail("give one of --model (a spec or a measured model) or --model-path (an .onnx file or HF directory)")
    cases = RunOptions(**request_values(RunOptions, options))
    refuse_bad(Predict, precision=precision)
    try:
        check(cases, declared(RunOptions), CASES)
        check_seconds("--timeout", timeout, positive=True, limit=MAX_TIMEOUT_S)
    except RequestError as exc:
        raise fail(str(exc)) from None
    batches, seqs = cases.batch_sizes, cases.sequence_lengths
    if not db_path.exists():
        raise fail(f"no store at {db_path}: run benchmarks first (accelharness native ...)")
    error_bound = _error_bound(method, max_error)
    from harness.analysis.op_predict import MIN_MODELS
    from harness.analysis.predict import InsufficientData
    from harness.analysis.predict_model import (
        OPERATORS,
        ROOFLINE,
        Asked,
        believable,
        best_per_target,
        operator_fits,
        predict_model,
    )
    from harness.analysis.roofline_fit import MIN_FIT_MODELS
    from harness.analysis.roofline_inference import inference_fits

    spec = _spec(model, model_path, model_family)
    if spec is not None and not spec.inputs.uses_sequence:
        seqs = [None]  # type: ignore[list-item]  # images and audio: no sequence axis
    asked = Asked(
        spec.name if spec else str(model), spec.family if spec else "", None,
        [(b, s) for b in batches for s in seqs], precision, split_list(hardware, "--hardware"),
        split_list(engines, "--engines"),
    )  # fmt: skip
    try:
        with one_machine(db_path, machine) as scoped:
            fits = operator_fits(scoped, asked)
            if method == OPERATORS and not fits:
                why = (
                    f"no target here has operator profiles of {MIN_MODELS}+ models at {precision} (run with --profile)"
                )
                return _refuse(asked.model, [why], as_json)
            roofs = inference_fits(scoped, precision, asked.model, asked.wants)
            if method == ROOFLINE and not roofs:
                why = f"no target here has ceilings and rows of {MIN_FIT_MODELS}+ models with their work counted"
                return _refuse(asked.model, [why], as_json)
            counts = spec is not None and (fits or roofs or model_path)  # a graph to count, and a use for it
            counted, notes = _count(spec, asked, timeout, model_path) if counts else (None, [])
            asked = dataclasses.replace(asked, **_facts(scoped, asked, counted, model_path))
            per_item = counted.per_item if counted and roofs else None
            result = predict_model(scoped, asked, fits, counted.work if counted else None, per_item)
    except (StoreError, InsufficientData, AnalysisError) as exc:
        raise fail(str(exc)) from None
    result.notes[:0] = notes
    chosen = best_per_target(result.rows) if method == "any" else result.rows  # each target's lowest error
    result.rows, left_out = believable(chosen, method, error_bound)
    if not result.rows:
        return _refuse(asked.model, notes + left_out, as_json)
    result.notes += [f"left out: {why}" for why in left_out]
    if as_json:
        console.print_json(json.dumps(dataclasses.asdict(result) | {"methods": METHODS}, default=str))
        return
    _print_predictions(asked, result)


def _generate(model: str | None, model_path: Path | None, family: str | None, hardware: str | None,
              engines: str | None, precision: str, evaluate: bool, method: str, max_error: str | None,
              timeout: float, machine: str | None, db_path: Path, as_json: bool,
              options: dict[str, Any]) -> None:  # fmt: skip
    """--mode generate: the checks every prediction has, then harness.cli.predict_generate."""
    from harness.cli.predict_generate import Filters, evaluate_generation, predict_generation

    filters = Filters(split_list(hardware, "--hardware"), split_list(engines, "--engines"), machine)
    if evaluate:
        if model or model_path:
            raise fail("--evaluate scores the predictors on the whole store; it takes no --model or --model-path")
        return evaluate_generation(db_path, filters, as_json) if db_path.exists() else _no_store(db_path)
    if (model is None) == (model_path is None):
        raise fail("give one of --model (a spec) or --model-path (an .onnx file with past key/values, or a folder)")
    cases = RunOptions(**request_values(RunOptions, options))
    refuse_bad(Predict, precision=precision)
    bound = _error_bound(method, max_error)
    spec = _spec(model, model_path, family)
    if spec is None:
        raise fail(f"--mode generate counts the model's graph from its spec: '{model}' is not a spec "
                   "(`accelharness models`); give --model-path for a model of your own")  # fmt: skip
    if not spec.is_onnx_file and (not spec.has_past_export or spec.is_seq2seq):
        raise fail(f"--mode generate predicts decoder-only language models; {spec.name} is not one")
    try:
        check(cases, declared(RunOptions), CASES)
        check_seconds("--timeout", timeout, positive=True, limit=MAX_TIMEOUT_S)
        check_context([spec], cases.sequence_lengths, cases.new_tokens, depths=cases.depths)
    except RequestError as exc:
        raise fail(str(exc)) from None
    if not db_path.exists():
        return _no_store(db_path)
    predict_generation(spec, precision, cases, filters, db_path, timeout, method, bound, as_json)


def _no_store(db_path: Path) -> None:
    raise fail(f"no store at {db_path}: run benchmarks first (accelharness run --mode generate ...)")


def _error_bound(method: str, max_error: str | None) -> float | None:
    """--max-error as a fraction (None: no bound), after checking --method."""
    from harness.analysis.compare import parse_threshold

    refuse_bad(Predict, method=method)
    if max_error is None:
        return None
    try:
        return parse_threshold(max_error)
    except ValueError:
        why = f"--max-error takes a percentage or a fraction in (0, 1), e.g. 30% or 0.3 (got '{max_error}')"
        raise fail(why) from None


def _refuse(model: str, reasons: list[str], as_json: bool) -> None:
    """One line instead of a table: no prediction here has a held-out error a user can believe."""
    line = f"no prediction for {model} worth acting on here: {'; '.join(reasons)}"
    if as_json:
        console.print_json(json.dumps({"rows": [], "refused": line}))
    else:
        say(line)


def _spec(model: str | None, model_path: Path | None, family: str | None) -> Any:
    """The model's spec (None for a measured model with no spec: the log-linear fit only)."""
    from harness.prepare.specs import SpecError, load_specs, spec_from_path

    if model_path is not None:
        try:
            spec = spec_from_path(model_path, family)
        except SpecError as exc:
            raise fail(str(exc)) from None
        if spec.is_gguf_file:  # the laws are fitted on work counted on ONNX graphs, and llama.cpp rows count none
            raise fail(
                f"--model-path {shown(model_path.name)}: predict counts a model's ONNX graph (its operators, "
                "its bytes per decode step) and fits it to rows whose work was counted the same way; a GGUF "
                "file has no ONNX graph, and llama.cpp's rows count none. Measure it instead: accelharness run "
                "--mode generate --model-path FILE.gguf --engines llama.cpp --web-runtimes llama.cpp"
            )
        return spec
    return load_specs().get(model or "")


def _count(spec: Any, asked: Any, timeout: float, model_path: Path | None) -> tuple[GraphWork | None, list[str]]:
    """The model's graph counted at the asked cases (or None), and notes: the cases it cannot take, or why not.
    A --model-path model that cannot be counted is refused with the reason: its graph is all there is to
    go on (its size included), and the store knows nothing of it."""
    from harness.prepare.prepared import PrepareJob
    from harness.run.worker import count_isolated

    console.print(
        f"counting {shown(spec.name)}'s graph at {len(asked.shapes)} case(s) (exported if not cached; not run)"
    )
    try:
        counted = count_isolated(PrepareJob(spec, asked.shapes), timeout)
    except RuntimeError as exc:
        if model_path is not None:
            raise fail(f"--model-path {model_path}: {exc}") from None
        return None, [f"operators: {exc}"]
    return counted, [f"b{b} s{s}: {why}" for (b, s), why in counted.skipped.items()]


def _facts(db: Path, asked: Any, counted: GraphWork | None, model_path: Path | None) -> dict:
    """The family and parameter count the log-linear fit needs: from the counted graph, the store or the spec."""
    from harness.analysis.predict import model_facts

    if counted is not None and counted.parameters is not None:
        return {"parameters": counted.parameters}
    if model_path is not None:
        return {}
    try:
        family, parameters = model_facts(db, asked.model)
    except KeyError:
        raise fail(
            f"unknown model '{asked.model}': not a spec nor measured in {db}; see `accelharness models`"
        ) from None
    return {"family": family, "parameters": parameters}


def _print_predictions(asked: Any, result: Any) -> None:
    from harness.core.labels import MARK_STYLES

    size = f"{asked.parameters:,} parameters" if asked.parameters else "parameters unknown"
    table = Table(title=f"Predicted for {shown(asked.model)} ({size}) — predictions, not measurements")
    columns = ("target", "precision", "batch", "seq", "method", "p50 ms", "items/s", "memory MB", "held-out MAPE")
    for name in (*columns, "learned from", "measured p50 ms"):
        table.add_column(name)
    for row in result.rows:
        cells = (row["predicted_latency_p50_ms"], row["predicted_throughput_per_s"], row["predicted_memory_peak_mb"])
        mape, measured = row["held_out_mape"], row.get("measured_latency_p50_ms")
        table.add_row(
            shown(f"{row['hardware']}/{row['engine']}:{row['provider']}"), shown(row["precision"]),
            str(row["batch_size"]), str(row["seq_len"] or "—"), row["method"],
            *(f"{v:.{d}f}" if v is not None else "—" for v, d in zip(cells, (3, 1, 0), strict=True)),
            f"{mape:.1%}" if mape is not None else "— (too few models)",
            f"rows marked {row['learned_from_marks']}" if row.get("learned_from_marks") else "—",
            f"{measured:.3f}" if measured else "—",
        )  # fmt: skip
    console.print(table)
    for method in sorted({row["method"] for row in result.rows}):
        console.print(f"{method}: {METHODS[method]}")
    codes = "".join(row.get("learned_from_marks") or "" for row in result.rows)
    legends = [style.legend for style in MARK_STYLES.values() if style.code in codes]
    if legends:
        console.print(f"learned from: the measured rows behind a prediction carry these marks; {'; '.join(legends)}")
    for note in result.notes:
        console.print(f"note: {shown(note)}")


def _evaluate(db: Path, as_json: bool) -> None:
    from harness.analysis.predict_model import compare_methods

    try:
        found = compare_methods(db)
    except StoreError as exc:
        raise fail(str(exc)) from None
    if as_json:
        console.print_json(json.dumps([dataclasses.asdict(e) for e in found], default=str))
        return
    if not found:
        console.print(f"no profiled results in {shown(db)}: run benchmarks with --profile first")
        return
    table = Table(title="Leave-one-model-out MAPE for latency, on the profiled results")
    for name in ("target", "precision", "results", "models", "operators", "log-linear (same results)",
                 "roofline (same results)"):  # fmt: skip
        table.add_column(name)
    for e in found:
        cells = [f"{v:.1%}" if v is not None else "—" for v in (e.operators, e.log_linear, e.roofline)]
        target = shown(f"{e.target[0]}/{e.target[1]}:{e.target[2]}")
        table.add_row(target, shown(e.target[3]), str(e.rows), str(e.models), *cells)
    console.print(table)
    for e in found:
        for note in e.notes:
            console.print(f"note ({shown('/'.join(e.target))}): {shown(note)}")
