"""How a stored result is named and qualified wherever it is shown: target and case labels, the
marks (mismatch, noise, precision changes, fallbacks) that travel with a number, and the baseline
speedups are relative to. Reports, the analyses and the CLI's summary all print these."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.threads import THREADS_MARK, threads_part

BASELINE = ("cpu", "torch")  # (hardware, engine): speedups are relative to torch eager on the CPU
BASELINE_LABEL = "/".join(BASELINE)
# Engines whose provider is the device the hardware already names: their labels leave it out.
DEVICE_PROVIDER_ENGINES = ("torch",)
BROWSER_ENGINE = "onnxruntime-web"  # the page's own runtime: our loop over onnxruntime-web
# Every runtime the page runs (web/page/runtimes.json, checked equal by tests/test_page_runtime_plan.py): a row's
# engine is its runtime. llama.cpp is also a native engine; a page row is told apart by its browser hardware.
PAGE_ENGINES = (BROWSER_ENGINE, "transformers.js", "llama.cpp", "webllm")
PAGE_HARDWARE = ("wasm", "webgpu", "webnn")  # web/page/eps.json's EPs, in its order (the same test)
ENGINE_ABBREVIATIONS = {"onnxruntime": "ort", BROWSER_ENGINE: "ort-web", "transformers.js": "tjs"}


# Native runtimes that run a GGUF and no ONNX file, so no calibration graph of their own: on the CPU at a stated thread
# count their rows are held against the ceilings ONNX Runtime's CPU EP measured at that count in the same run, as a
# page runtime's are against onnxruntime-web's on its EP. The limit is the machine's at those threads; how close
# each runtime comes is its own. At a runtime's default thread count there is no such pairing, and no fraction.
CPU_CEILING_BORROWERS = ("llama.cpp", "llama-cpp-python")
GGUF_CPU_PROVIDER = "cpu"  # their provider on the CPU (`cpu:threads=N` at a stated count)
CPU_CEILING_OWNER = ("onnxruntime", "CPUExecutionProvider")  # whose CPU ceilings they are held against


def ceiling_owner(hardware: str, engine: str, provider: str | None) -> tuple[str, str | None]:
    """The (engine, provider) whose ceilings, measured on the same hardware in the same run, a row is held against."""
    if engine in PAGE_ENGINES and hardware in PAGE_HARDWARE:
        return BROWSER_ENGINE, provider
    if (
        hardware == "cpu"
        and engine in CPU_CEILING_BORROWERS
        and (provider or "").startswith(GGUF_CPU_PROVIDER + THREADS_MARK)
    ):
        return CPU_CEILING_OWNER[0], CPU_CEILING_OWNER[1] + (provider or "")[len(GGUF_CPU_PROVIDER) :]
    return engine, provider


def ceiling_owner_sql(prefix: str = "") -> tuple[str, str]:
    """ceiling_owner in SQL: (engine, provider) expressions over the columns hardware, engine and provider of the
    table `prefix` names ("results." or "" for bare names)."""
    hardware, engine, provider = (f"{prefix}{column}" for column in ("hardware", "engine", "provider"))

    def among(column: str, names: tuple[str, ...]) -> str:
        return f"{column} IN ({', '.join(repr(name) for name in names)})"

    page = f"{among(engine, PAGE_ENGINES)} AND {among(hardware, PAGE_HARDWARE)}"
    borrowed = (f"{hardware} = 'cpu' AND {among(engine, CPU_CEILING_BORROWERS)} "
                f"AND starts_with({provider}, '{GGUF_CPU_PROVIDER}{THREADS_MARK}')")  # fmt: skip
    owner_engine = (f"CASE WHEN {page} THEN '{BROWSER_ENGINE}' WHEN {borrowed} THEN '{CPU_CEILING_OWNER[0]}' "
                    f"ELSE {engine} END")  # fmt: skip
    owner_provider = (f"CASE WHEN {borrowed} THEN '{CPU_CEILING_OWNER[1]}' || substr({provider}, "
                      f"{len(GGUF_CPU_PROVIDER) + 1}) ELSE {provider} END")  # fmt: skip
    return owner_engine, owner_provider


# Browsers the harness launches outside Playwright (harness.browser.launched): their rows' device is the browser's
# name, where a served device's is its id and this harness's Chromium leaves it empty. Either is this machine's.
LAUNCHED_BROWSERS = ("firefox", "safari")
PAGE_BROWSERS = ("chromium", *LAUNCHED_BROWSERS)  # the browser a page row names (`browser_of`)


def served(row: Mapping[str, Any]) -> bool:
    """Whether a row ran on a device served by `web --serve` (another machine's browser), not on this one."""
    device = row.get("device")
    return bool(device) and device not in LAUNCHED_BROWSERS


def browser_of(row: Mapping[str, Any]) -> str | None:
    """The browser a page row of this machine ran in: chromium (the Chromium family the harness drives), firefox,
    safari; None for a native row or a served device's."""
    if not in_page(row) or served(row):
        return None
    return row.get("device") or "chromium"


def in_page(row: Mapping[str, Any]) -> bool:
    """Whether a row was measured in a browser page (any page runtime), not by a native engine (native ORT's
    WebGPU EP has hardware webgpu too; native llama.cpp shares the page's engine name)."""
    return row["engine"] in PAGE_ENGINES and row["hardware"] in PAGE_HARDWARE


# What names a target: a result's (hardware, engine, provider) and, for a device served by `web --serve`,
# that device. Every grouping "per target" (compare, history, matrix, recommend, query) uses these.
TARGET_FIELDS = ("hardware", "engine", "provider", "device")


def target_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(name) for name in TARGET_FIELDS)


def on_device(label: str, row: Mapping[str, Any]) -> str:
    """A label with the served device it ran on, if any: wasm/onnxruntime-web:wasm:threads=4 @ chrome141-android-3f."""
    return f"{label} @ {row['device']}" if row.get("device") else label


def target_label(row: Mapping[str, Any]) -> str:
    """Column name for a target, e.g. cpu/onnxruntime:CPUExecutionProvider (and `@ device` for a served one)."""
    label = f"{row['hardware']}/{row['engine']}"
    if row["engine"] in DEVICE_PROVIDER_ENGINES:  # the device is the hardware's; a thread count is kept
        return on_device(label + threads_part(row.get("provider") or ""), row)
    return on_device(f"{label}:{row['provider']}", row)


def short_target(row: Mapping[str, Any]) -> str:
    """A compact target label for plots: cpu/ort:CPU, openvino:CPU, wasm/ort-web:threads=1, webgpu/ort-web."""
    engine = ENGINE_ABBREVIATIONS.get(row["engine"], row["engine"])
    label = row["hardware"] if row["engine"] == row["hardware"] else f"{row['hardware']}/{engine}"
    provider = (row.get("provider") or "").replace("ExecutionProvider", "")
    if row["engine"] in DEVICE_PROVIDER_ENGINES or not provider or provider == row["hardware"]:
        return on_device(label + threads_part(provider), row)
    return on_device(f"{label}:{provider.removeprefix(row['hardware'] + ':')}", row)


def threads_text(row: Mapping[str, Any]) -> str:
    """A native row's intra-op threads as reports show them, "2 threads, not spinning" ('' where the row says
    none: a browser row, whose count is its provider's, or a row stored before the columns existed)."""
    count = row.get("native_threads")
    if count is None:
        return ""
    spin = {True: ", spinning", False: ", not spinning"}.get(row.get("spinning"), "")
    return f"{count} thread{'s' * (count != 1)}{spin}"


def is_baseline(row: Mapping[str, Any]) -> bool:
    return (row["hardware"], row["engine"]) == BASELINE


def generation_label(new_tokens: int | None, depth: int | None) -> str:
    """A generate row's decode phase in llama-bench's terms: tg16 @ d512 (at that KV-cache depth); a row
    stored before depths existed (depth NULL) keeps its old name, gen16."""
    return f"gen{new_tokens}" if depth is None else f"tg{new_tokens} @ d{depth}"


def case_label(row: Mapping[str, Any]) -> str:
    label = f"b{row['batch_size']}" + (f" s{row['seq_len']}" if row["seq_len"] else "")
    mode = row.get("mode") or "inference"
    if mode == "generate":
        audio = f" @ {row['audio_seconds']} s audio" if row.get("audio_seconds") is not None else ""
        return f"{label} {generation_label(row['new_tokens'], row.get('depth'))}{audio}"
    return label if mode == "inference" else f"{label} {mode}"


def mode_of(row: Mapping[str, Any]) -> str:
    return row.get("mode") or "inference"  # stores before schema 2 have no mode column


def details_of(row: Mapping[str, Any]) -> dict[str, Any]:
    details = row.get("details")
    if isinstance(details, dict):
        return details
    return json.loads(details) if details else {}


def marks(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(kind, text) for everything that qualifies a number: a mismatch, noise, precision changes, fallbacks.

    Kinds: mismatch, noisy, precision, cpu_fallback, fallback_adapter, threads_dropped, budget_stopped,
    baseline_tier, memory_growth (see MARK_STYLES).
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
    elif details.get("compute_precision_differs"):  # the engine's own graph (harness.core.precision)
        found.append(("precision", details["compute_precision_differs"]))
    if details.get("cpu_fallback"):
        found.append(("cpu_fallback", f"{details.get('cpu_fallback_nodes')} nodes fell back to CPU"))
    if details.get("fallback_adapter"):
        found.append(("fallback_adapter", "WebGPU on a software (fallback) adapter"))
    if details.get("threads_dropped"):
        found.append(("threads_dropped", f"threads dropped (ran {details.get('threads_effective', '?')})"))
    if details.get("budget_stopped"):
        found.append(("budget_stopped", f"--max-time {details.get('max_time_s')}s stopped the loop"))
    tier = details.get("wasm_tier")
    if isinstance(tier, dict) and tier.get("tiered") is False:  # web/page/tier.mjs: no tier-up seen in this page
        found.append(("baseline_tier", f"wasm did not tier up (cold ÷ warm {tier.get('ratio', 0):.2f})"))
    if details.get("memory_growth_flag"):
        found.append(("memory_growth", f"memory grew {details.get('memory_growth_mb', 0):.1f} MB over the repeats"))
    return found


def flags(row: Mapping[str, Any]) -> list[str]:
    """Warnings a reader must see next to the number: noise, precision changes, fallbacks."""
    return [text for kind, text in marks(row) if kind != "mismatch"]


def case_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a baseline is matched on: the same model, the same inputs and the same mode, on the same
    machine (rows read with their run's machine_id: a speedup never divides one machine by another)."""
    return (row["model"], row["batch_size"], row["seq_len"] or 0, mode_of(row), row.get("new_tokens"),
            row.get("depth") or 0, row.get("audio_seconds"), row.get("machine_id"))  # fmt: skip


def baselines(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The cpu/torch ok row per case_key (the latest when a case ran more than once)."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: str(r.get("created_at"))):
        if is_baseline(row) and row["status"] == "ok" and row["latency_p50_ms"]:
            found[case_key(row)] = row
    return found


def speedup(row: Mapping[str, Any], base: dict[tuple[Any, ...], dict[str, Any]]) -> float | None:
    """cpu/torch p50 ÷ this row's p50 for the same model and inputs; None without a measured pair."""
    reference = base.get(case_key(row))
    if reference is None or row["status"] != "ok" or not row["latency_p50_ms"]:
        return None
    return reference["latency_p50_ms"] / row["latency_p50_ms"]


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
    "budget_stopped": MarkStyle("B", "B: the time budget (--max-time) stopped the loop", "--"),
    "memory_growth": MarkStyle("G", "G: memory grew over repeated generations (a KV cache not freed?)", "oo"),
    "baseline_tier": MarkStyle("W", "W: the page's wasm did not tier up (a baseline-only browser?)", "||"),
    "noisy": MarkStyle("~", "~: noisy (cv > 10%), faded", ""),
}
