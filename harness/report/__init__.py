"""Reports regenerated from the store: JSON, Markdown (the seeds' shape, plus plot PNGs), CSV and HTML."""

from __future__ import annotations

import json
from pathlib import Path

from harness.analysis.machines import across, machine_name
from harness.analysis.options import REPORT_FORMATS
from harness.analysis.tables import render_table
from harness.core.labels import details_of
from harness.core.paths import inside, safe_name
from harness.report.data import RunReport, load_run_report, load_run_reports
from harness.report.formats import write_csv, write_json, write_markdown
from harness.report.html import write_html, write_html_page
from harness.store import ALL_RUNS

# the names declared with report --format (harness.analysis.options), each with its writer
FORMATS = dict(zip(REPORT_FORMATS, (write_json, write_markdown, write_csv, write_html), strict=True))
ALL_RUNS_STEM = "all-runs"


def _write_many(name: str, reports: list[RunReport], path: Path) -> None:
    """One file covering several runs (`--run all`), grouped by run; from several machines, the HTML and
    Markdown open with each case side by side across the machines."""
    runs = [(report.run, report.results) for report in reports]
    machines = {machine_name(run) for run, _ in runs}
    if name == "html":
        write_html_page(reports, path)
    elif name == "csv":
        merged = RunReport(reports[0].run, [], [row for r in reports for row in r.results])
        write_csv(merged, path)
    elif name == "json":
        documents = [
            {
                "run": dict(r.run, host=r.host),
                "hardware": r.hardware,
                "results": [dict(row, details=details_of(row)) for row in r.results],
            }
            for r in reports
        ]
        path.write_text(json.dumps({"runs": documents}, indent=2, default=str))
    else:  # md: each run's report in turn (plots under <run_id>-plots/ next to the file)
        parts = [render_table(across(runs, "machine"), "md")] if len(machines) > 1 else []
        for report in reports:
            write_markdown(report, path)
            parts.append(path.read_text())
        path.write_text("\n---\n\n".join(parts))


def write_reports(
    db_path: Path,
    run_selector: str,
    output_dir: Path,
    formats: list[str] | None = None,
    out: Path | None = None,
) -> list[Path]:
    """Write the reports of a run (RUN_ID, 'latest'), of several ('RUN,RUN,…') or of every run ('all').

    Files are <run_id>.<format> (<run_id>-<run_id>… for several, all-runs.<format> for 'all') in
    output_dir, or `out` when exactly one format is asked for. Markdown also writes its plots as PNG
    files under <run_id>-plots/ next to it. A run id may come from another store: the names are its
    safe_name, and a name that would leave output_dir is refused (UnsafePathError).
    """
    formats = formats or list(FORMATS)
    if out is not None and len(formats) != 1:
        raise ValueError("an output file path needs exactly one format")
    reports = load_run_reports(db_path, run_selector)
    many = run_selector == ALL_RUNS or "," in run_selector  # 'all', or RUN,RUN,… aggregated in one file
    stem = ALL_RUNS_STEM if run_selector == ALL_RUNS else safe_name("-".join(r.run["run_id"] for r in reports))
    # every name checked before the first file is written: a refusal writes nothing
    paths = {name: Path(out) if out is not None else inside(Path(output_dir), f"{stem}.{name}") for name in formats}
    for name, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if many:
            _write_many(name, reports, path)
        else:
            FORMATS[name](reports[0], path)
    return list(paths.values())


__all__ = ["FORMATS", "RunReport", "load_run_report", "load_run_reports", "write_reports"]
