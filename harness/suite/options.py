"""`accelharness suite`'s own options, each declared once (harness.core.options): what the command does with its
config (write it, check it, filter it, continue it, only report). The run options it overrides are RunOptions'
fields (harness.cli.suite.OVERRIDES); those it shares with compare, matrix and the benchmarks
(--baseline, --threshold, --fail-on-regression, --update-matrix-only, --hardware, --resume) are reused from
harness.core.options.Shared."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.core.options import RUN_SELECTOR, Shared, option, reuse

DEFAULT_CONFIG_PATH = Path("accelharness-suite.toml")
WITH_BASELINE = "With --baseline."


@dataclass(frozen=True)
class SuiteCommand:
    config: Path = option(DEFAULT_CONFIG_PATH, flag="--config", help="The suite config (.toml, or .json).")
    create_config: bool = option(False, flag="--create-config", help="Write a commented default config to --config.")
    check: bool = option(False, flag="--check", help="Verify prerequisites and print the plan; run nothing.")
    models: str | None = option(None, flag="--models", help="Only these families or models, comma-separated.")
    hardware: str | None = reuse(Shared, "hardware", default=None, note="Comma-separated, of the config's.")
    resume: bool = reuse(Shared, "resume", default=False)
    older_than: str | None = option(
        None, flag="--older-than", help="A new run of only what the suite measured longer ago, e.g. 30d."
    )
    plot_only: str | None = option(None, flag="--plot-only", help=f"Only write RUN's HTML report ({RUN_SELECTOR}).")
    update_matrix_only: bool = reuse(Shared, "update_matrix_only", default=False)
    aggregate: str | None = option(None, flag="--aggregate", help="Only write one report over RUN,RUN,… (or all).")
    # two runs, where compare's --plot-comparison is the file its plot is written to
    plot_comparison: tuple[str, str] | None = option(
        None, flag="--plot-comparison", help="Only plot run B against run A."
    )
    baseline: str | None = reuse(Shared, "baseline", default=None, note="Compared with this run after it.")
    threshold: str = reuse(Shared, "threshold", default="5%", note=WITH_BASELINE)
    fail_on_regression: bool = reuse(Shared, "fail_on_regression", default=False, note=WITH_BASELINE)
    ray_address: str | None = option(
        None, flag="--ray-address",
        help="Run each (model, hardware) job as a Ray task on the cluster at auto|HOST:PORT "
        "(needs accelharness\\[ray]).",
    )  # fmt: skip
