"""Everything a report shows about one run, read from the store in one place."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.store import open_store


@dataclass
class RunReport:
    run: dict[str, Any]
    hardware: list[dict[str, Any]]
    results: list[dict[str, Any]]

    @property
    def host(self) -> dict[str, Any]:
        return json.loads(self.run["host"]) if self.run.get("host") else {}


def target_label(row: dict[str, Any]) -> str:
    """Column name for a (hardware, engine, provider) triple, e.g. cpu/onnxruntime:CPUExecutionProvider."""
    label = f"{row['hardware']}/{row['engine']}"
    return label if row["engine"] == "torch" else f"{label}:{row['provider']}"


def case_label(row: dict[str, Any]) -> str:
    return f"b{row['batch_size']}" + (f" s{row['seq_len']}" if row["seq_len"] else "")


def flags(row: dict[str, Any]) -> list[str]:
    """Warnings a reader must see next to the number: noise, precision changes, fallbacks."""
    details = json.loads(row["details"]) if row.get("details") else {}
    marks = []
    if row.get("noisy"):
        marks.append(f"noisy (cv {row['latency_cv']:.0%})")
    if row["precision"] != row["requested_precision"] and row["requested_precision"] != "auto":
        marks.append(f"ran {row['precision']} (asked {row['requested_precision']})")
    elif row["requested_precision"] == "auto" and row["precision"] != "fp32":
        marks.append(f"engine chose {row['precision']}")
    if details.get("cpu_fallback"):
        marks.append(f"{details.get('cpu_fallback_nodes')} nodes fell back to CPU")
    return marks


def load_run_report(db_path: Path, run_selector: str) -> RunReport:
    with open_store(db_path, read_only=True) as store:
        run_id = store.resolve_run(run_selector)
        return RunReport(store.run_info(run_id), store.hardware_rows(run_id), store.results(run_id))
