"""The one step after every run (native, web, both, a suite): its reports and the compatibility
matrix, written from the store. record_run calls it once the run is closed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Outputs:
    """What the after-run step writes, and where."""

    directory: Path
    reports: bool = True  # the run's reports (False: --no-reports, the matrix only)
    html: bool = True  # the self-contained HTML report with its plots (a suite's generate_plots)
    matrix: bool = True  # compatibility_matrix.json/.md rebuilt from every measured outcome


def write_outputs(db_path: Path, run_id: str, outputs: Outputs) -> list[Path]:
    """The run's reports, and the compatibility matrix rebuilt from every measured outcome."""
    from harness.analysis.matrix import update_matrix  # matplotlib and scipy: only once a run is done
    from harness.report import FORMATS, write_reports

    formats = [f for f in FORMATS if f != "html" or outputs.html] if outputs.reports else []
    written = write_reports(db_path, run_id, outputs.directory, formats) if formats else []
    if outputs.matrix:
        written += update_matrix(db_path, outputs.directory)
    return written
