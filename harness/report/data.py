"""Everything a report shows about one run, read from the store in one place."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.store import Store, open_store

ALL_RUNS = "all"
BASELINE = ("cpu", "torch")  # speedups are relative to torch eager on the CPU
ENGINE_ABBREVIATIONS = {"onnxruntime": "ort", "onnxruntime-web": "ort-web"}


@dataclass
class RunReport:
    run: dict[str, Any]
    hardware: list[dict[str, Any]]
    results: list[dict[str, Any]]
    samples: dict[str, list[float]] = field(default_factory=dict)  # result_id -> raw latencies (ms)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # rendered plots, shared by the writers

    @property
    def host(self) -> dict[str, Any]:
        return json.loads(self.run["host"]) if self.run.get("host") else {}


def target_label(row: dict[str, Any]) -> str:
    """Column name for a (hardware, engine, provider) triple, e.g. cpu/onnxruntime:CPUExecutionProvider."""
    label = f"{row['hardware']}/{row['engine']}"
    return label if row["engine"] == "torch" else f"{label}:{row['provider']}"


def short_target(row: dict[str, Any]) -> str:
    """A compact target label for plots: cpu/ort:CPU, openvino:CPU, wasm/ort-web:threads=1, webgpu/ort-web."""
    engine = ENGINE_ABBREVIATIONS.get(row["engine"], row["engine"])
    label = row["hardware"] if row["engine"] == row["hardware"] else f"{row['hardware']}/{engine}"
    provider = (row.get("provider") or "").replace("ExecutionProvider", "")
    if row["engine"] == "torch" or not provider or provider == row["hardware"]:
        return label
    return f"{label}:{provider.removeprefix(row['hardware'] + ':')}"


def case_label(row: dict[str, Any]) -> str:
    label = f"b{row['batch_size']}" + (f" s{row['seq_len']}" if row["seq_len"] else "")
    mode = row.get("mode") or "inference"
    if mode == "generate":
        return f"{label} gen{row['new_tokens']}"
    return label if mode == "inference" else f"{label} {mode}"


def mode_of(row: dict[str, Any]) -> str:
    return row.get("mode") or "inference"  # stores before schema 2 have no mode column


def details_of(row: dict[str, Any]) -> dict[str, Any]:
    details = row.get("details")
    if isinstance(details, dict):
        return details
    return json.loads(details) if details else {}


def marks(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(kind, text) for everything that qualifies a number: a mismatch, noise, precision changes, fallbacks.

    Kinds: mismatch, noisy, precision, cpu_fallback, fallback_adapter, threads_dropped (see MARK_STYLES).
    """
    details = details_of(row)
    found = []
    if row["status"] == "mismatch":
        found.append(
            ("mismatch", f"mismatch (max |diff| {row['max_abs_diff']:.3g})" if row.get("max_abs_diff") else "mismatch")
        )
    if row.get("noisy"):
        found.append(("noisy", f"noisy (cv {row['latency_cv']:.0%})"))
    if row["precision"] != row["requested_precision"] and row["requested_precision"] != "auto":
        found.append(("precision", f"ran {row['precision']} (asked {row['requested_precision']})"))
    elif row["requested_precision"] == "auto" and row["precision"] != "fp32":
        found.append(("precision", f"engine chose {row['precision']}"))
    elif details.get("precision_changed"):
        found.append(("precision", f"precision changed (hint {details.get('inference_precision_hint')})"))
    if details.get("cpu_fallback"):
        found.append(("cpu_fallback", f"{details.get('cpu_fallback_nodes')} nodes fell back to CPU"))
    if details.get("fallback_adapter"):
        found.append(("fallback_adapter", "WebGPU on a software (fallback) adapter"))
    if details.get("threads_dropped"):
        found.append(("threads_dropped", f"threads dropped (ran {details.get('threads_effective', '?')})"))
    return found


def flags(row: dict[str, Any]) -> list[str]:
    """Warnings a reader must see next to the number: noise, precision changes, fallbacks."""
    return [text for kind, text in marks(row) if kind != "mismatch"]


def case_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a baseline is matched on: the same model, the same inputs and the same mode."""
    return (row["model"], row["batch_size"], row["seq_len"] or 0, mode_of(row), row.get("new_tokens"))


def baselines(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The cpu/torch ok row per case_key (the latest when a case ran more than once)."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: str(r.get("created_at"))):
        if (row["hardware"], row["engine"]) == BASELINE and row["status"] == "ok" and row["latency_p50_ms"]:
            found[case_key(row)] = row
    return found


def speedup(row: dict[str, Any], base: dict[tuple[Any, ...], dict[str, Any]]) -> float | None:
    """cpu/torch p50 ÷ this row's p50 for the same model and inputs; None without a measured pair."""
    reference = base.get(case_key(row))
    if reference is None or row["status"] != "ok" or not row["latency_p50_ms"]:
        return None
    return reference["latency_p50_ms"] / row["latency_p50_ms"]


def _samples(store: Store, run_id: str) -> dict[str, list[float]]:
    rows = store.connection.execute(
        "SELECT s.result_id, s.latency_ms FROM samples s JOIN results r USING (result_id) "
        "WHERE r.run_id = ? ORDER BY s.result_id, s.iteration",
        [run_id],
    ).fetchall()
    grouped: dict[str, list[float]] = defaultdict(list)
    for result_id, latency in rows:
        grouped[result_id].append(latency)
    return dict(grouped)


def _load(store: Store, run_id: str) -> RunReport:
    return RunReport(
        store.run_info(run_id), store.hardware_rows(run_id), store.results(run_id), _samples(store, run_id)
    )


def load_run_report(db_path: Path, run_selector: str) -> RunReport:
    with open_store(db_path, read_only=True) as store:
        return _load(store, store.resolve_run(run_selector))


def load_run_reports(db_path: Path, run_selector: str) -> list[RunReport]:
    """One RunReport for RUN_ID or 'latest', one per run for 'RUN,RUN,…'; for 'all', every run, oldest first."""
    with open_store(db_path, read_only=True) as store:
        if run_selector != ALL_RUNS:
            return [_load(store, store.resolve_run(selector)) for selector in run_selector.split(",")]
        run_ids = [r["run_id"] for r in store.query("SELECT run_id FROM runs ORDER BY started_at")]
        if not run_ids:
            store.resolve_run("latest")  # raises the usual "has no runs yet"
        return [_load(store, run_id) for run_id in run_ids]


@dataclass(frozen=True)
class MarkStyle:
    code: str  # printed next to a bar, point or box
    legend: str
    hatch: str  # matplotlib hatch pattern ("" = none)


MARK_STYLES = {
    "mismatch": MarkStyle("M", "M: output mismatch", "xx"),
    "fallback_adapter": MarkStyle("F", "F: software (fallback) adapter", "//"),
    "cpu_fallback": MarkStyle("C", "C: nodes fell back to CPU", "\\\\"),
    "precision": MarkStyle("P", "P: precision changed (e.g. bf16)", ".."),
    "threads_dropped": MarkStyle("T", "T: wasm threads dropped", "++"),
    "noisy": MarkStyle("~", "~: noisy (cv > 10%), faded", ""),
}
