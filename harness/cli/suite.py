"""`accelharness suite`: a config-driven suite run, its checks, and the seeds' report-only modes."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path

import typer
from rich.table import Table

from harness.cli.common import console, fail, given, say, split_list, with_options
from harness.cli.progress import run_with_progress
from harness.core.options import declared, problem
from harness.run.machine import check_machine_label
from harness.run.plan import RequestError, RunOptions
from harness.store import StoreError
from harness.suite.options import SuiteCommand

DURATION = re.compile(r"^(\d+(?:\.\d+)?)([dhm])$")
UNITS = {"d": "days", "h": "hours", "m": "minutes"}
MAX_AGE = timedelta(days=100 * 365)  # further back than any stored result; beyond it dates overflow
STORE = ("db_path", "output_dir")  # override the config's db and output_dir, for a run and the report-only modes
# The seeds' modes that only read the store, and the options only a run uses: never both.
REPORT_ONLY = ("plot_only", "update_matrix_only", "aggregate", "plot_comparison")
RUN_ONLY = (
    "max_time_s",
    "machine_label",
    "models",
    "hardware",
    "resume",
    "older_than",
    "check",
    "baseline",
    "threshold",
    "fail_on_regression",
    "ray_address",
)


def parse_age(text: str) -> timedelta:
    match = DURATION.match(text.strip())
    try:
        age = timedelta(**{UNITS[match.group(2)]: float(match.group(1))}) if match else None
    except OverflowError:
        age = None
    if age is None or age > MAX_AGE:
        raise fail(f"--older-than takes a number and a unit d, h or m up to 36500d, e.g. 30d or 12h (got '{text}')")
    return age


def _refuse_unused(ctx: typer.Context) -> None:
    """An option that would do nothing with the others given is refused, never silently ignored."""
    if given(ctx, "create_config") and (unused := given(ctx, *REPORT_ONLY, *RUN_ONLY, *STORE)):
        raise fail(f"--create-config only writes the config file; {', '.join(unused)} would do nothing: drop it")
    modes = given(ctx, *REPORT_ONLY)
    if modes and (unused := given(ctx, *RUN_ONLY)):
        raise fail(f"{modes[0]} only reads the store and runs nothing; {', '.join(unused)} would do nothing: drop it")
    if given(ctx, "threshold") and not given(ctx, "baseline"):
        raise fail("--threshold applies to the comparison with --baseline RUN; pass --baseline or drop --threshold")


def _report_only(
    db: Path,
    output_dir: Path,
    plot_only: str | None,
    update_matrix_only: bool,
    aggregate: str | None,
    plot_comparison: tuple[str, str] | None,
) -> None:
    """The seeds' modes that only read the store: plots, the matrix, aggregates, a before/after plot."""
    from harness.analysis import compare
    from harness.analysis.matrix import update_matrix
    from harness.analysis.tables import AnalysisError
    from harness.report import write_reports

    written: list[Path] = []
    try:
        if plot_only:
            written += write_reports(db, plot_only, output_dir, ["html"])
        if update_matrix_only:
            written += update_matrix(db, output_dir)
        if aggregate:
            written += write_reports(db, aggregate, output_dir)
        if plot_comparison:
            result = compare.compare_runs(db, *plot_comparison, compare.parse_threshold("5%"), 0.5, cwd=Path.cwd())
            written.append(compare.plot_comparison(result, output_dir / "comparison.png"))
    except (StoreError, AnalysisError) as exc:
        raise fail(str(exc)) from None
    for path in written:
        console.print(f"wrote {path}")


def _print_check(plan: object) -> None:
    from harness.suite.plan import SuitePlan, check_prerequisites

    assert isinstance(plan, SuitePlan)
    checks = Table(title="Prerequisites")
    for column in ("check", "ok", "detail"):
        checks.add_column(column, overflow="fold")
    for check in check_prerequisites(plan):
        checks.add_row(check.item, "yes" if check.ok else "[red]no[/red]", check.detail)
    console.print(checks)
    groups = Table(title="Plan: device groups run side by side, targets within a group one after another")
    for column in ("group", "targets"):
        groups.add_column(column, overflow="fold")
    for group, targets in plan.groups().items():
        groups.add_row(group, ", ".join(t.label for t in targets))
    console.print(groups)
    models = plan.native.specs if plan.native else plan.web.specs if plan.web else []
    tokens = f" ({plan.config.new_tokens} new tokens each)" if "generate" in plan.config.modes else ""
    by_mode = ", ".join(f"{count} {mode}" + (tokens if mode == "generate" else "") for mode, count in
                        plan.results_by_mode().items())  # fmt: skip
    console.print(f"results by mode: {by_mode or 'none'}")
    console.print(
        f"suite '{plan.config.name}': {len(models)} models → {plan.total_results} results to run, "
        f"{len(plan.groups())} group(s) concurrently"
        + (f"; continuing run {plan.resume_run_id}" if plan.resume_run_id else "")
        + ". Nothing was run (--check)."
    )


def _print_cluster_check(plan: object, address: str) -> None:
    from harness.suite.plan import SuitePlan
    from harness.suite.ray import print_cluster_check

    assert isinstance(plan, SuitePlan)
    try:
        print_cluster_check(plan, address, console)
    except RequestError as exc:
        raise fail(str(exc)) from None


# The run options a suite run takes over its config's keys (the fields of RunOptions, written there once).
OVERRIDES = ("max_time_s", "db_path", "output_dir", "machine_label")


def override_problem(name: str, value: object) -> str | None:
    """An override checked by its config key's option (harness.suite.config.OPTION_KEYS), named by its flag."""
    from harness.suite.config import OPTION_KEYS

    opt = declared(RunOptions)[name]
    return problem(opt.flag, OPTION_KEYS[opt.key or name][0], value)


# suite's own options: harness.suite.options.SuiteCommand (those it shares, reused from harness.core.options.Shared)
@with_options(RunOptions, OVERRIDES, overrides=True)
@with_options(SuiteCommand)
def suite(
    ctx: typer.Context,
    *,
    config: Path,
    create_config: bool,
    check: bool,
    models: str | None,
    hardware: str | None,
    resume: bool,
    older_than: str | None,
    plot_only: str | None,
    update_matrix_only: bool,
    aggregate: str | None,
    plot_comparison: tuple[str, str] | None,
    baseline: str | None,
    threshold: str,
    fail_on_regression: bool,
    ray_address: str | None,
    max_time_s: float | None,
    db_path: Path | None,
    output_dir: Path | None,
    machine_label: str | None,
) -> None:
    """Run a benchmark suite from a config file; resumable, independent devices side by side."""
    from harness.suite.config import ConfigError, load_config, write_default_config

    _refuse_unused(ctx)
    try:
        if create_config:
            write_default_config(config)
            console.print(f"wrote {config}; edit it, then: accelharness suite --config {config} --check")
            return
        loaded = load_config(config)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    loaded = dataclasses.replace(loaded, db=db_path or loaded.db, output_dir=output_dir or loaded.output_dir)
    if max_time_s is not None:  # 0: no budget, as the config's max_time_s: checked as its key is
        if found := override_problem("max_time_s", max_time_s):
            raise fail(found)
        loaded = dataclasses.replace(loaded, max_time_s=max_time_s)
    if machine_label is not None:  # the option names this machine over the config's machine_label
        try:
            check_machine_label(machine_label)
        except ValueError as exc:
            raise fail(str(exc)) from None
        loaded = dataclasses.replace(loaded, machine_label=machine_label)
    if plot_only or update_matrix_only or aggregate or plot_comparison:
        _report_only(loaded.db, loaded.output_dir, plot_only, update_matrix_only, aggregate, plot_comparison)
        return
    age = parse_age(older_than) if older_than else None
    from harness.suite.plan import plan_suite  # imports torch: only once the options are known good
    from harness.suite.run import run_suite

    try:
        plan = plan_suite(loaded, split_list(models, "--models"), split_list(hardware, "--hardware"), resume, age)
    except (RequestError, StoreError) as exc:
        raise fail(str(exc)) from None
    if resume and plan.resume_run_id is None:  # say why nothing is continued (e.g. the config changed)
        console.print(f"--resume: {plan.resume_note}")
    baseline_run = _resolve_baseline(loaded.db, baseline, threshold, fail_on_regression)
    if check:
        _print_check(plan)
        if ray_address:
            _print_cluster_check(plan, ray_address)
        return
    if plan.total_results == 0 and plan.resume_run_id is None:  # (a resumed run with nothing left is closed)
        console.print(f"suite '{loaded.name}': every result is younger than --older-than {older_than}; nothing run")
        return
    if plan.resume_run_id:
        console.print(f"continuing run {plan.resume_run_id}: {plan.total_results} results still to run")
    try:
        summary = run_with_progress(plan.total_results, lambda on_result: run_suite(plan, on_result, ray_address))
    except RequestError as exc:  # --ray-address: Ray not installed, or no cluster there
        raise fail(str(exc)) from None
    if baseline_run is not None:
        _compare_with_baseline(loaded.db, baseline_run, summary.run_id, threshold, fail_on_regression)


def _resolve_baseline(db: Path, baseline: str | None, threshold: str, fail_on_regression: bool) -> str | None:
    """The baseline's run id, resolved before the run (so 'latest' means the run before this one)."""
    from harness.analysis.compare import parse_threshold
    from harness.analysis.tables import AnalysisError
    from harness.store import open_store

    if baseline is None:
        if fail_on_regression:
            raise fail("--fail-on-regression needs --baseline RUN (e.g. latest-on-main) to compare against")
        return None
    try:
        parse_threshold(threshold)
    except AnalysisError as exc:
        raise fail(str(exc)) from None
    try:
        with open_store(db, read_only=True) as store:
            return store.resolve_run(baseline, Path.cwd())
    except StoreError as exc:
        raise fail(f"--baseline {baseline}: {exc}") from None


def _compare_with_baseline(db: Path, baseline: str, run_id: str, threshold: str, fail_on_regression: bool) -> None:
    from harness.analysis import compare

    result = compare.compare_runs(db, baseline, run_id, compare.parse_threshold(threshold), cwd=Path.cwd())
    say(compare.render(result, "md"))  # the baseline's rows may come from a bundle
    if fail_on_regression and result.regressed:
        console.print(f"[red]{len(result.regressed)} case(s) regressed or broke against {baseline}[/red]")
        raise typer.Exit(1)
