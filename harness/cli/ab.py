"""`accelharness ab`: two variants measured interleaved, and the paired verdict (harness.ab.run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.ab.run import AbRequest
from harness.cli.analysis import emit
from harness.cli.common import (
    BatchOption,
    DbOption,
    MachineLabelOption,
    SeqOption,
    TimeoutOption,
    WarmupOption,
    errors,
    fail,
    given,
    int_list,
    split_list,
)
from harness.cli.progress import run_with_progress
from harness.core.paths import unwritable_file
from harness.native import DEFAULT_ENGINES, ENGINES
from harness.store import DEFAULT_DB
from harness.web.eps import WEB_HARDWARE

WEB_EPS = ",".join(WEB_HARDWARE)

VariantOption = "A spec name (`accelharness models`), an HF model directory or an .onnx file."
PythonHelp = "Another environment's python for variant {side} (with accelharness installed), e.g. another onnxruntime."


def ab(
    ctx: typer.Context,
    a: Annotated[str, typer.Option("--a", help=f"Variant A (the baseline). {VariantOption}")],
    b: Annotated[str, typer.Option("--b", help=f"Variant B (the change). {VariantOption}")],
    hardware: Annotated[
        str | None, typer.Option(help="Native platforms, comma-separated (default: cpu; none with --web-hardware).")
    ] = None,
    web_hardware: Annotated[
        str | None, typer.Option(help=f"Browser EPs, comma-separated ({WEB_EPS}): both variants in one page.")
    ] = None,
    threads: Annotated[str, typer.Option(help="With --web-hardware: wasm thread counts, comma-separated.")] = "1",
    engines: Annotated[
        str | None, typer.Option(help=f"{','.join(ENGINES)} (default: {','.join(DEFAULT_ENGINES)})")
    ] = None,
    batch_sizes: BatchOption = "1",
    sequence_lengths: SeqOption = "32",
    precision: Annotated[str, typer.Option(help="Both variants' precision.")] = "fp32",
    a_precision: Annotated[str | None, typer.Option(help="Variant A's precision instead.")] = None,
    b_precision: Annotated[str | None, typer.Option(help="Variant B's precision instead.")] = None,
    a_python: Annotated[Path | None, typer.Option(help=PythonHelp.format(side="A"))] = None,
    b_python: Annotated[Path | None, typer.Option(help=PythonHelp.format(side="B"))] = None,
    rounds: Annotated[int, typer.Option(help="Rounds per case: a block of A and one of B each.")] = AbRequest.rounds,
    block: Annotated[int, typer.Option(help="Fewest iterations per variant and round.")] = AbRequest.block,
    block_time: Annotated[float, typer.Option(help="Fewest seconds per variant and round.")] = AbRequest.block_time_s,
    warmup: WarmupOption = 5,
    timeout: TimeoutOption = 300.0,
    threshold: Annotated[str, typer.Option(help="Smallest change that counts: 5% or 0.05.")] = "5%",
    fail_on_regression: Annotated[bool, typer.Option(help="Exit 1 if any case regressed.")] = False,
    fmt: Annotated[str, typer.Option("--format", help="md or json.")] = "md",
    out: Annotated[Path | None, typer.Option("--out", help="Write the verdicts here instead of stdout.")] = None,
    db: DbOption = DEFAULT_DB,
    machine_label: MachineLabelOption = None,
) -> None:
    """Did B get slower than A? Both measured interleaved in one run (ABBA rounds), a paired verdict."""
    from harness.ab.run import run_ab, validate_ab
    from harness.analysis.compare import parse_threshold, render
    from harness.analysis.paired import compare_pair
    from harness.analysis.tables import AnalysisError
    from harness.run.plan import RequestError

    if fmt not in ("md", "json"):
        raise fail(f"unknown format '{fmt}'; valid: md, json")
    if not web_hardware and given(ctx, "threads"):
        raise fail(
            f"--threads {threads}: wasm thread counts of the browser half, which runs only with --web-hardware "
            "(native engines choose their own threads); add --web-hardware wasm or drop --threads"
        )
    request = AbRequest(
        a=a, b=b, hardware=split_list(hardware), engines=split_list(engines), web_hardware=split_list(web_hardware),
        threads=int_list("--threads", threads),
        batch_sizes=int_list("--batch-sizes", batch_sizes),
        sequence_lengths=int_list("--sequence-lengths", sequence_lengths),
        precision=precision, a_precision=a_precision, b_precision=b_precision, a_python=a_python, b_python=b_python,
        rounds=rounds, block=block, block_time_s=block_time, warmup=warmup, timeout_s=timeout, db_path=db,
        output_dir=None, machine_label=machine_label,
    )  # fmt: skip
    try:
        limit = parse_threshold(threshold)
        plan = validate_ab(request)
    except (AnalysisError, RequestError) as exc:
        raise fail(str(exc)) from None
    if out is not None and (why := unwritable_file(out)):  # found out now, not after the rounds
        raise fail(f"--out {out}: {why}; nothing was run")
    summary = run_with_progress(plan.total_results, lambda on_result: run_ab(request, on_result, plan), False)
    comparison = compare_pair(db, summary.run_id, limit)
    emit(render(comparison, fmt), out)
    if fail_on_regression and comparison.regressed:
        errors.print(f"{len(comparison.regressed)} case(s) regressed; exit 1", highlight=False)
        raise typer.Exit(1)
