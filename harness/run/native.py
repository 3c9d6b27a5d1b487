"""The native part of a run: prepare each model once, then one worker per (model, target).

from harness import BenchmarkRequest, run_native
summary = run_native(BenchmarkRequest(models=["bert-tiny"], hardware=["cpu"], iterations=50))
print(summary.run_id, summary.counts)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np

from harness.core.generation import StepTop
from harness.core.labels import CPU_CEILING_BORROWERS, ceiling_owner
from harness.core.parity import GGML_SIDE
from harness.core.profiles import PROFILE_ITERATIONS
from harness.core.records import Case, Control, Result, Target
from harness.native import capabilities
from harness.native.base import Availability
from harness.prepare.gguf_file import NO_ONNX, NOT_COUNTED
from harness.prepare.prepared import PreparedModel, PrepareJob, audio_lengths, inference_on_past, unprepared_result
from harness.prepare.specs import ModelSpec
from harness.run.ceiling_job import CeilingJob, measure_targets, run_calibration
from harness.run.ceilings import Calibration, ceilings_asked, wanted
from harness.run.measure import MeasureConfig
from harness.run.plan import BenchmarkRequest, Plan, check_engines, validate
from harness.run.recording import Body, Emit, RunSummary, record_run
from harness.run.worker import Job, prepare_isolated, run_job


def _prepare(plan: Plan, spec: ModelSpec) -> tuple[PreparedModel | None, str | None, str]:
    cases = plan.cases(spec)
    shapes = sorted({(c.batch_size, c.seq_len) for c in cases}, key=str)
    prefill = inference_on_past(spec, plan.request.modes) and plan.exports_past(spec)
    job = PrepareJob(spec, shapes, with_past=plan.exports_past(spec), plain=plan.exports_plain(spec),
                     stop_at_eos=plan.request.stop_at_eos, prefill=prefill,
                     audio_seconds=audio_lengths(cases), gguf_precisions=plan.gguf_precisions(spec),
                     reference_model=plan.request.reference_model,
                     reference_tokens=plan.request.new_tokens if spec.is_gguf_file else 0)  # fmt: skip
    prepared, outcome = prepare_isolated(job, plan.request.prepare_timeout_s)
    if prepared:
        return prepared, None, "ok"
    return None, outcome.message or "model preparation failed", outcome.status


def _not_runnable(
    prepared: PreparedModel, target: Target, availability: Availability, case: Case
) -> tuple[str, str | None] | None:
    """(status, why) for a case that cannot run on a target, or None when it can: the target is not
    available, the case has no inputs (past the model's positions, or they failed to build), or the
    engine needs the plain ONNX export that failed."""
    if not availability.ok:
        return "unsupported", availability.reason
    if outcome := prepared.unprepared(case):
        return outcome
    can = capabilities(target.engine)
    on_past = case.mode == "generate" and can.generate_needs_past_export  # the worker says when it has none
    if can.needs_onnx and not on_past and prepared.onnx_path is None:
        return "unsupported", prepared.onnx_error
    return None


def _run_model(plan: Plan, spec: ModelSpec, emit: Emit, measured: dict[Target, set[tuple[str, str]]]) -> None:
    if not any(plan.remaining(spec, target) for target, _ in plan.targets):
        return  # a resumed run holds every result of this model: do not even export it
    prepared, error, status = _prepare(plan, spec)
    request = plan.request
    measure = MeasureConfig(
        request.warmup,
        request.iterations,
        request.min_duration_s,
        request.max_iterations,
        min_iterations=request.min_iterations,
        max_time_s=request.max_time_s,
        profile_iterations=PROFILE_ITERATIONS if request.profile else 0,
    )
    for target, availability in plan.targets:
        cases = plan.remaining(spec, target)
        if spec.is_onnx_file and not capabilities(target.engine).runs_onnx_files:
            for case in cases:
                emit(unprepared_result(spec, target, case, "unsupported", "not applicable: the model is an .onnx file"))
        elif spec.is_gguf_file and not capabilities(target.engine).runs_gguf:
            for case in cases:
                emit(unprepared_result(spec, target, case, "unsupported", f"not applicable: {NO_ONNX}"))
        elif prepared is None:
            for case in cases:
                failed = "error" if status == "finished" else status
                emit(unprepared_result(spec, target, case, failed, f"model preparation failed: {error}"))
        else:
            job = Job(prepared, target, [], measure)
            runnable = []
            for case in cases:
                if outcome := _not_runnable(prepared, target, availability, case):
                    emit(job.prepared.result(job.target, case, *outcome))
                else:
                    runnable.append(case)
            if runnable:
                can = capabilities(target.engine)
                checked = (
                    emit
                    if not (can.generate_needs_past_export or can.checked_on_export)
                    else (lambda result, prepared=prepared: emit(checked_generation(prepared, result)))
                )
                # the target's ceilings, measured once per run, before the first job that needs each of them
                asked = ceilings_asked(plan.request.no_ceilings)
                calibrations: tuple[Calibration, ...] = ()
                if target.engine in CPU_CEILING_BORROWERS:  # no calibration graph of its own: it borrows ORT's
                    _borrowed_ceilings(plan, target, runnable, measured, asked, emit)
                else:
                    calibrations = tuple(wanted((c.precision for c in runnable), measured.setdefault(target, set()),
                                                asked))  # fmt: skip
                prior = plan.ceilings.for_target(target, plan.request.ceilings) if calibrations else ()
                job = Job(prepared, target, runnable, measure, calibrations, prior)
                run_job(job, plan.request.timeout_s, checked)


def _borrowed_ceilings(plan: Plan, target: Target, cases: list[Case], measured: dict[Target, set[tuple[str, str]]],
                       asked: bool, emit: Emit) -> None:  # fmt: skip
    """A native GGUF runtime's rows at N threads are held against ONNX Runtime's CPU EP's ceilings at N threads
    (harness.core.labels.ceiling_owner): measured here, in a worker of their own, unless this run has them already
    (ORT's own target at N threads measures them once for both). At its default thread count there is no pairing."""
    engine, provider = ceiling_owner(target.hardware, target.engine, target.provider)
    if engine == target.engine:
        return
    owner = Target(target.hardware, engine, provider)
    calibrations = tuple(wanted((c.precision for c in cases), measured.setdefault(owner, set()), asked))
    if calibrations:
        prior = plan.ceilings.for_target(owner, plan.request.ceilings)
        run_calibration(CeilingJob(owner, calibrations, prior), plan.request.timeout_s, emit)


def checked_generation(prepared: PreparedModel, result: Result | Control) -> Result | Control:
    """A native generate row on an ONNX graph, checked on the same graph (the file its precision gives):
    native ORT CPU teacher-forced on its tokens (a near tie where they differ, or `mismatch`), and its
    quality beside the fp32 graph at another precision (harness.prepare.quality). Other rows pass through."""
    if not isinstance(result, Result) or result.case.mode != "generate" or result.status != "ok":
        return result  # a drift control's measurement, or a row with nothing to check
    if not result.generated_tokens:
        return result
    if prepared.spec.is_gguf_file:  # llama.cpp on a GGUF given as the model: its reference is native llama.cpp's
        return _gguf_checked(prepared, result)
    from harness.prepare.quality import check_generation, ran_graphs

    if capabilities(result.target.engine).checked_on_export:  # the engine's own module of the weights
        return _module_checked(prepared, result)
    source = prepared.onnx_past_path
    assert source is not None  # a generate row of an engine that runs the graph with past ran it
    if result.target.hardware != "cpu":  # other kernels than the reference's: no tolerance was measured for them
        why = f"not checked: native ORT CPU is the reference, and no tolerance is measured for {result.target.hardware}"
        return replace(result, details=result.details | {"token_parity": why})
    try:
        # the prompt, or an encoder-decoder's encoder inputs (speech: its log-mel features)
        case = result.case
        feeds, _ = prepared.load_case((case.batch_size, case.seq_len), case.audio_seconds)
        prompt = {k: v for k, v in feeds.items() if k in ("input_ids", "attention_mask", "input_features")}
        if capabilities(result.target.engine).runs_gguf and result.precision != "fp32":
            return replace(result, details=_gguf_quality(prepared, prompt, result))
        graph = ran_graphs(source, result.precision)  # an encoder–decoder's: each graph at its own precision
        top = _engine_top(result.details)  # an engine's own logits per step, where it returned them
        side = GGML_SIDE if capabilities(result.target.engine).runs_gguf else "native"  # other kernels than ORT's
        agree, facts, _ = check_generation(graph, source, prompt, result.generated_tokens, result.precision, side,
                                           top=top, depth=case.depth or 0, fp32=prepared.fp32_reference)  # fmt: skip
    except Exception as exc:  # the check's own failure is the row's error, never the run's
        return replace(result, status="error", error=f"token check failed: {type(exc).__name__}: {exc}"[:500])
    details = _without_top(result.details) | facts
    if agree:
        return replace(result, details=details)
    return replace(result, status="mismatch", error=facts["token_parity"], details=details)


def _module_checked(prepared: PreparedModel, result: Result) -> Result:
    """A generation of an engine's own module (torch) against native ORT CPU on the fp32 export of the same weights
    (harness.prepare.quality.module_check): `mismatch` beyond the tolerance; its quality beside fp32 stays the
    worker's, measured on its own distributions."""
    from harness.prepare.quality import module_check

    details = {key: value for key, value in result.details.items() if key != ENGINE_TOP}
    if prepared.onnx_past_path is None:
        why = "not checked: no ONNX export with past of the model in this run, native ORT's reference"
        return replace(result, details=details | {"token_parity": why})
    if result.target.hardware != "cpu":
        why = f"not checked: native ORT CPU is the reference, and no tolerance is measured for {result.target.hardware}"
        return replace(result, details=details | {"token_parity": why})
    try:
        case = result.case
        feeds, _ = prepared.load_case((case.batch_size, case.seq_len), case.audio_seconds)
        prompt = {k: v for k, v in feeds.items() if k in ("input_ids", "attention_mask", "input_features")}
        agree, facts = module_check(prepared.onnx_past_path, prompt, result.generated_tokens or [], result.precision,
                                    _engine_top(result.details), case.depth or 0)  # fmt: skip
    except Exception as exc:  # the check's own failure is the row's error, never the run's
        return replace(result, status="error", error=f"token check failed: {type(exc).__name__}: {exc}"[:500])
    # the worker's quality, on the engine's own distributions, stands; a row without it (an encoder–decoder's: no
    # forced pass; a padded prompt) takes its tokens against the fp32 graph's argmax, and the worker's reason for KL
    against = facts.pop("tokens_against", None)
    if against is not None and details.get("agreement_top1") is None:
        why = details.pop("quality", None) or "the engine's own distributions were not forced"
        details |= against | {"kl_mean_not_measured": why}
    details |= facts
    if agree is False:
        return replace(result, status="mismatch", error=facts["token_parity"], details=details)
    return replace(result, details=details)


ENGINE_TOP = "step_top"  # an engine's own top logits per step, in its row's details until the check takes them


def _engine_top(details: dict) -> StepTop | None:
    """The first generation's top-k logits per step where the engine returned them (llama.cpp's runner): checked
    against native ORT's at the same ids (token_check), so a wrong weight shows before it moves a token."""
    top = details.get(ENGINE_TOP)
    if not top:
        return None
    return StepTop(np.asarray(top["ids"], dtype=np.int64), np.asarray(top["values"], dtype=np.float64))


def _without_top(details: dict) -> dict:
    """The worker's details without the engine's top-k and its own quality facts: the check's replace them."""
    from harness.prepare.quality import QUALITY_KEYS

    return {key: value for key, value in details.items() if key != ENGINE_TOP and key not in QUALITY_KEYS}


def _gguf_checked(prepared: PreparedModel, result: Result) -> Result:
    """A row of a GGUF given as the model: its tokens against native llama.cpp's on the same file (harness.prepare.
    gguf_model.token_check: equal, else `mismatch`)."""
    from harness.prepare.gguf_model import token_check

    agree, facts = token_check(prepared, result.case, result.generated_tokens, _engine_top(result.details))
    details = _without_top(result.details) | facts | {"work_counted": NOT_COUNTED}  # no ONNX file ran
    if agree is False:
        return replace(result, status="mismatch", error=facts["token_parity"], details=details)
    return replace(result, details=details)


def _gguf_quality(prepared: PreparedModel, prompt: dict, result: Result) -> dict:
    """A GGUF row at another precision than fp32: harness.prepare.quality.gguf_quality, the engine's top-k dropped."""
    from harness.prepare.quality import gguf_quality

    assert prepared.onnx_past_path is not None
    facts = gguf_quality(prepared.onnx_past_path, prompt, result.generated_tokens or [], result.precision,
                         prepared.fp32_reference)  # fmt: skip
    return _without_top(result.details) | facts


def execute_native(plan: Plan) -> Body:
    """The native part of a run, as a body for harness.run.recording.record_run."""

    def body(emit: Emit) -> None:
        if plan.request.ceilings_only:  # no model: each target's ceilings in a worker of its own
            measure_targets(plan, emit)
            return
        measured: dict[Target, set[tuple[str, str]]] = {}  # each target's ceilings measured in this run
        for spec in plan.specs:
            _run_model(plan, spec, emit, measured)

    return body


def run_native(
    request: BenchmarkRequest,
    on_result: Callable[[Result, str], None] | None = None,
    plan: Plan | None = None,
    resume_run_id: str | None = None,
) -> RunSummary:
    """Benchmark the request on native backends; every result is committed as it completes.

    on_result(result, result_id) is called after each commit (the CLI's progress bar uses it).
    Ctrl-C marks the run 'interrupted' and re-raises; finished results stay in the store.
    resume_run_id (from harness.run.recording.resume_point, which also sets plan.done) continues that run.
    """
    plan = plan or validate(request)
    bodies = [execute_native(plan)]
    return record_run(
        request.db_path,
        "native",
        asdict(request),
        bodies,
        on_result,
        request.outputs,
        None,
        resume_run_id,
        request.machine_label,
        tuple(check_engines(request.engines, request.hardware)),  # this run's, not every engine this process probed
        [plan.ceilings],
    )
