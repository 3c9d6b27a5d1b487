"""Reports regenerated from the store: JSON, Markdown (the seeds' shape) and CSV per run."""

from __future__ import annotations

from pathlib import Path

from harness.report.data import RunReport, load_run_report
from harness.report.formats import write_csv, write_json, write_markdown

FORMATS = {"json": write_json, "md": write_markdown, "csv": write_csv}


def write_reports(db_path: Path, run_selector: str, output_dir: Path, formats: list[str] | None = None) -> list[Path]:
    """Write the run's reports into output_dir; returns the files written."""
    report = load_run_report(db_path, run_selector)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in formats or list(FORMATS):
        path = output_dir / f"{report.run['run_id']}.{name}"
        FORMATS[name](report, path)
        written.append(path)
    return written


__all__ = ["FORMATS", "RunReport", "load_run_report", "write_reports"]
