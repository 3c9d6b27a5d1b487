"""`accelharness ab`: two variants measured interleaved, and the paired verdict (harness.ab.run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.ab.run import AbRequest
from harness.browser.run import WebRequest
from harness.cli.analysis import emit
from harness.cli.common import errors, fail, given, int_list, request_values, split_list, with_options
from harness.cli.progress import run_with_progress
from harness.core.paths import unwritable_file
from harness.web.eps import WEB_HARDWARE

WEB_EPS = ",".join(WEB_HARDWARE)

VariantOption = "A spec name (`accelharness models`), an HF model directory or an .onnx file."
PythonHelp = "Another environment's python for variant {side} (with accelharness installed), e.g. another onnxruntime."
# The run options ab takes: fields of its request (harness.run.plan.RunOptions), each written there once.
OPTIONS = ("engines", "batch_sizes", "sequence_lengths", "precision", "warmup", "timeout_s", "db_path", "machine_label")


@with_options(WebRequest, ("threads",))
@with_options(AbRequest, OPTIONS)
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
    threads: str = "1",  # --threads, as `web`'s (WebRequest's field): with --web-hardware only
    a_precision: Annotated[str | None, typer.Option(help="Variant A's precision instead of --precision.")] = None,
    b_precision: Annotated[str | None, typer.Option(help="Variant B's precision instead.")] = None,
    a_python: Annotated[Path | None, typer.Option(help=PythonHelp.format(side="A"))] = None,
    b_python: Annotated[Path | None, typer.Option(help=PythonHelp.format(side="B"))] = None,
    rounds: Annotated[int, typer.Option(help="Rounds per case: a block of A and one of B each.")] = AbRequest.rounds,
    block: Annotated[int, typer.Option(help="Fewest iterations per variant and round.")] = AbRequest.block,
    block_time: Annotated[float, typer.Option(help="Fewest seconds per variant and round.")] = AbRequest.block_time_s,
    threshold: Annotated[str, typer.Option(help="Smallest change that counts: 5% or 0.05.")] = "5%",
    fail_on_regression: Annotated[bool, typer.Option(help="Exit 1 if any case regressed.")] = False,
    fmt: Annotated[str, typer.Option("--format", help="md or json.")] = "md",
    out: Annotated[Path | None, typer.Option("--out", help="Write the verdicts here instead of stdout.")] = None,
    **options: Any,
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
        a=a, b=b, hardware=split_list(hardware), web_hardware=split_list(web_hardware),
        threads=int_list("--threads", threads), a_precision=a_precision, b_precision=b_precision,
        a_python=a_python, b_python=b_python, rounds=rounds, block=block, block_time_s=block_time, output_dir=None,
        **request_values(AbRequest, options),
    )  # fmt: skip
    try:
        limit = parse_threshold(threshold)
        plan = validate_ab(request)
    except (AnalysisError, RequestError) as exc:
        raise fail(str(exc)) from None
    if out is not None and (why := unwritable_file(out)):  # found out now, not after the rounds
        raise fail(f"--out {out}: {why}; nothing was run")
    summary = run_with_progress(plan.total_results, lambda on_result: run_ab(request, on_result, plan), False)
    comparison = compare_pair(request.db_path, summary.run_id, limit)
    emit(render(comparison, fmt), out)
    if fail_on_regression and comparison.regressed:
        errors.print(f"{len(comparison.regressed)} case(s) regressed; exit 1", highlight=False)
        raise typer.Exit(1)
