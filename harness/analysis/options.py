"""The options of the commands that read the store (report, matrix, predict, recommend, compare, history, query,
export), of those that manage it (models, db init, import, merge) and of `ab`'s verdict, each declared once
(harness.core.options): one dataclass per command, whose fields are its options in --help order; harness.cli
builds each command from its dataclass (with_options).

An option more than one command takes is declared once, on `Shared` here or harness.core.options.Shared
(those the suite and the benchmarks take too), and each command's field reuses it with its own default and
its choices narrowed to the table that owns them. The tables of choices whose modules are heavy to import
(compare's scipy, the report's plots) or that would close a cycle (query's) are here, and those modules read
them from here, so `accelharness --help` imports none of them.

Never built: a command's values go to the analysis functions, which check them as the Python API's caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.analysis.tables import FORMATS as TABLE_FORMATS
from harness.core.bounds import MAX_BATCH, MAX_WINDOW
from harness.core.labels import PAGE_BROWSERS
from harness.core.options import DEFAULT_OUTPUT_DIR, option, reuse
from harness.core.options import Shared as Everywhere
from harness.core.records import MODES, PRECISIONS
from harness.store import DEFAULT_DB

COMPARE_FORMATS = ("md", "json", "html")  # compare's and ab's verdict (harness.analysis.compare.render)
HISTORY_FORMATS = ("md", "json")  # harness.analysis.history.render
REPORT_FORMATS = ("json", "md", "csv", "html")  # a run's report files (harness.report.FORMATS)
# query --report's canned reports, export's tables and file formats (harness.analysis.query runs them)
REPORTS = ("latest", "best-hardware", "compatibility", "regressions", "ops", "machines")
EXPORT_TABLES = ("runs", "hardware", "results", "samples", "operators", "controls")
EXPORT_FORMATS = ("parquet", "csv")
METHOD_CHOICES = ("any", "operators", "roofline")  # predict --method (harness.analysis.predict_model)
PREDICT_MODES = ("inference", "generate")  # predict --mode (generate: harness.analysis.roofline_predict)
AB_FORMATS = ("md", "json")  # ab's verdict
SEVERAL_RUNS = "RUN,RUN,… for several, or all."
TO_STDOUT = "Default: stdout."


@dataclass(frozen=True)
class Shared:
    """The options only the store's commands take, more than one of them: declared once, reused per command."""

    model: str | None = option(flag="--model", help="The model, by its stored name (an .onnx file's stem).")
    batch_size: int | None = option(flag="--batch-size", low=1, high=MAX_BATCH, help="The batch size.")
    model_family: str | None = option(flag="--model-family", help="A model family.")
    mode: str = option(flag="--mode", noun="mode", help="The one mode to read.")
    machine: str | None = option(
        flag="--machine",
        help="Learn from this machine's runs only: an exact machine id, a unique id prefix of at least 8 characters, "
        "or an exact label (`query --report machines`).",
    )


@dataclass(frozen=True)
class Report:
    run: str = reuse(Everywhere, "run", default="latest", note=SEVERAL_RUNS)
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)
    output_dir: Path = reuse(Everywhere, "output_dir", default=DEFAULT_OUTPUT_DIR)
    fmt: str | None = reuse(Everywhere, "fmt", default=None, choices=REPORT_FORMATS, many=True, note="Default: all.")
    out: Path | None = reuse(Everywhere, "out", default=None, note="A file: needs exactly one --format.")


@dataclass(frozen=True)
class Matrix:
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)
    output_dir: Path = reuse(Everywhere, "output_dir", default=DEFAULT_OUTPUT_DIR)
    run: str = reuse(Everywhere, "run", default="all", note=SEVERAL_RUNS)
    update_matrix_only: bool = reuse(Everywhere, "update_matrix_only", default=False, note="No table printed.")


@dataclass(frozen=True)
class Predict:
    model: str | None = reuse(Shared, "model", default=None, note="Or a model spec (`accelharness models`).")
    model_path: Path | None = reuse(Everywhere, "model_path", default=None)
    model_family: str | None = reuse(Shared, "model_family", default=None, note="That of a --model-path model.")
    hardware: str | None = reuse(Everywhere, "hardware", default=None, note="Comma-separated.")
    engines: str | None = option(None, flag="--engines", help="Only these engines, comma-separated.")
    precision: str = option(
        "fp32", flag="--precision", choices=PRECISIONS, noun="precision",
        help=f"The precision to predict for: one of {', '.join(PRECISIONS)}.",
    )  # fmt: skip
    mode: str = reuse(
        Shared, "mode", default="inference", choices=PREDICT_MODES,
        note="generate: TTFT, prefill and decode tokens/s at --depths from each target's ceilings (the roofline).",
    )  # fmt: skip
    evaluate: bool = option(
        False, flag="--evaluate",
        help="Print each method's held-out error per target (leave-one-model-out; generate: leave-one-target-out too).",
    )  # fmt: skip
    method: str = option(
        "any", flag="--method", choices=METHOD_CHOICES, noun="method",
        help="any: each target by the method with the lowest held-out error it has; operators, roofline: that "
        "method's targets only.",
    )  # fmt: skip
    max_error: str | None = option(
        None, flag="--max-error",
        help="Leave out targets whose held-out error is unknown or above this (e.g. 50%); none left: one line says "
        "why instead of a table.",
    )  # fmt: skip
    timeout: float = option(900.0, flag="--timeout", help="Seconds the graph's export and count may take.")
    machine: str | None = reuse(
        Shared, "machine", default=None,
        note="generate: its targets are predicted, and one known only by its ceilings learns from the same engine "
        "and EP on the other machines too.",
    )  # fmt: skip
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)
    as_json: bool = option(False, flag="--json", help="Print JSON instead of a table.")


@dataclass(frozen=True)
class Recommend:
    model: str | None = reuse(Shared, "model", default=None)
    model_family: str | None = reuse(Shared, "model_family", default=None, note="Its measured models.")
    task: str | None = option(None, flag="--task", help="HF task, e.g. text-generation (maps to a family).")
    batch_size: int = reuse(Shared, "batch_size", default=1, note="Recommend for it.")
    mode: str = reuse(Shared, "mode", default="inference", choices=MODES, note="generate: ranked by decode tokens/s.")
    min_agreement: float | None = option(
        None, flag="--min-agreement",
        help="generate: only targets whose top-1 agreement with the fp32 model is at least this (0-1).",
    )  # fmt: skip
    max_wer: float | None = option(
        None, flag="--max-wer",
        help="generate, speech: only targets whose word error rate is at most this (0.3: 30%; above 1 can be "
        "measured); the others are listed with their WER or why they have none.",
    )  # fmt: skip
    hardware: str | None = reuse(Everywhere, "hardware", default=None, note="Comma-separated: the hardware you have.")
    browser: str | None = option(
        None, flag="--browser", choices=PAGE_BROWSERS, noun="browser",
        help="Your users' browser: native targets and this browser's page rows only (chromium, firefox, safari).",
    )  # fmt: skip
    weights: str = option("0.4,0.3,0.1,0.2", flag="--weights", help="latency,throughput,memory,compatibility weights.")
    create_map: Path | None = option(None, flag="--create-map", help="Write the selection map JSON here.")
    one_line: bool = option(
        False, flag="--one-line", help="One sentence: the model's fastest target here and the browser's fastest."
    )
    machine: str | None = reuse(Shared, "machine", default=None)
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)


@dataclass(frozen=True)
class AbVerdict:
    """`ab`'s paired verdict after its rounds (the rest of ab's options are harness.ab.run.AbRequest's)."""

    threshold: str = reuse(Everywhere, "threshold", default="5%")
    fail_on_regression: bool = reuse(Everywhere, "fail_on_regression", default=False)
    fmt: str = reuse(Everywhere, "fmt", default="md", choices=AB_FORMATS)
    out: Path | None = reuse(Everywhere, "out", default=None, note=TO_STDOUT)


@dataclass(frozen=True)
class Compare:
    baseline: str | None = reuse(Everywhere, "baseline", default=None, note="It is A (latest-on-main…): pass only B.")
    threshold: str = reuse(Everywhere, "threshold", default="5%")
    quantile: float = option(0.5, flag="--quantile", help="Statistic: 0.5 = median; 0.25 resists load spikes.")
    fail_on_regression: bool = reuse(Everywhere, "fail_on_regression", default=False)
    fmt: str = reuse(Everywhere, "fmt", default="md", choices=COMPARE_FORMATS)
    out: Path | None = reuse(Everywhere, "out", default=None, note=TO_STDOUT)
    plot_comparison: Path | None = option(
        None, flag="--plot-comparison", help="Write a before/after plot (.png or .svg)."
    )
    across_machines: bool = option(
        False, flag="--across-machines",
        help="Compare runs of two hardware classes (refused otherwise); the table says so.",
    )  # fmt: skip
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)


@dataclass(frozen=True)
class History:
    model: str = reuse(Shared, "model")  # required: a history is one model's
    metric: str = option(
        "latency_p50_ms", flag="--metric", help="A numeric results column, or latency_pNN_ms from the samples."
    )
    hardware: str | None = reuse(Everywhere, "hardware", default=None, note="One platform.")
    engine: str | None = option(None, flag="--engine", help="Only this engine.")
    batch_size: int | None = reuse(Shared, "batch_size", default=None, note="Only rows of it.")
    threshold: str = reuse(Everywhere, "threshold", default="10%", note="Here: a step between points.")
    window: int = option(
        5, flag="--window", low=1, high=MAX_WINDOW, help="Previous points whose median is the baseline."
    )
    fmt: str = reuse(Everywhere, "fmt", default="md", choices=HISTORY_FORMATS)
    out: Path | None = reuse(Everywhere, "out", default=None, note=TO_STDOUT)
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)


@dataclass(frozen=True)
class Query:
    report: str | None = option(
        None, flag="--report", choices=REPORTS, help=f"A canned report: {', '.join(REPORTS)} (ops: --profile runs)."
    )
    sql: str | None = option(
        None, flag="--sql", help="One read-only SELECT over runs/hardware/results/samples/operators."
    )
    run: str = reuse(Everywhere, "run", default="latest")
    threshold: str = reuse(Everywhere, "threshold", default="5%", note="For the regressions report.")
    fmt: str = reuse(Everywhere, "fmt", default="md", choices=TABLE_FORMATS)
    out: Path | None = reuse(Everywhere, "out", default=None, note=TO_STDOUT)
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)


@dataclass(frozen=True)
class Export:
    out: Path | None = reuse(Everywhere, "out", default=None, note="A directory: <table>.parquet / <table>.csv.")
    fmt: str = reuse(Everywhere, "fmt", default="parquet", choices=EXPORT_FORMATS)
    table: str = option(
        "all", flag="--table", choices=(*EXPORT_TABLES, "all"), help=f"{', '.join(EXPORT_TABLES)} or all."
    )
    bundle: Path | None = option(
        None, flag="--bundle", help="One file another store can `import`: the runs' rows as Parquet and a manifest."
    )
    run: str | None = reuse(Everywhere, "run", default=None, note=f"--bundle: {SEVERAL_RUNS[:-1]} (default all).")
    since: str | None = option(None, flag="--since", help="--bundle: the runs started at or after this date (UTC).")
    redact: str | None = option(
        None, flag="--redact", help="--bundle: public drops hostnames, user names, paths, addresses, user agents."
    )
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)


# --- the store's own commands (models, db init, import, merge): the store they read or write -----------------


@dataclass(frozen=True)
class Models:
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB, note="Each engine's statuses, if it exists.")


@dataclass(frozen=True)
class DbInit:
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB)
    overwrite: bool = option(False, flag="--overwrite", help="Delete the existing file first.")


@dataclass(frozen=True)
class Import:
    db_path: Path = reuse(Everywhere, "db_path", default=DEFAULT_DB, note="The store the bundles' runs are added to.")


@dataclass(frozen=True)
class Merge:
    db_path: Path = reuse(Everywhere, "db_path", note="The store they are merged into (created if missing).")
