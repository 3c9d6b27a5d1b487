"""`accelharness ab`: two variants measured interleaved, and the paired verdict (harness.ab.run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from harness.ab.run import AbRequest
from harness.analysis.options import AbVerdict
from harness.cli.analysis import emit
from harness.cli.common import errors, fail, given, refuse_bad, request_values, with_options
from harness.cli.progress import run_with_progress
from harness.core.paths import unwritable_file

# ab's request (harness.ab.run.AbRequest): its own fields and the run options it takes, each written once on
# its field (--hardware is native's, --web-hardware web's --hardware, --threads web's).
OWN = ("a", "b", "hardware", "web_hardware", "threads", "browsers", "browser_path", "driver", "webdriver_url",
       "a_browser", "b_browser", "a_precision", "b_precision", "a_python", "b_python", "rounds", "block",
       "block_time_s")  # fmt: skip
OPTIONS = ("engines", "batch_sizes", "sequence_lengths", "precision", "warmup", "timeout_s", "db_path", "machine_label")


# ...and the verdict after the rounds (harness.analysis.options.AbVerdict: compare's options, ab's formats).
@with_options(AbVerdict)
@with_options(AbRequest, OWN + OPTIONS)
def ab(
    ctx: typer.Context, *, threshold: str, fail_on_regression: bool, fmt: str, out: Path | None, **options: Any
) -> None:
    """Did B get slower than A? Both measured interleaved in one run (ABBA rounds), a paired verdict."""
    from harness.ab.run import run_ab, validate_ab
    from harness.analysis.compare import parse_threshold, render
    from harness.analysis.paired import compare_pair
    from harness.analysis.tables import AnalysisError
    from harness.run.plan import RequestError

    refuse_bad(AbVerdict, fmt=fmt)
    if not options["web_hardware"] and given(ctx, "threads"):
        raise fail(
            f"--threads {options['threads']}: wasm thread counts of the browser half, which runs only with "
            "--web-hardware (native engines choose their own threads); add --web-hardware wasm or drop --threads"
        )
    request = AbRequest(**request_values(AbRequest, options), output_dir=None)
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
