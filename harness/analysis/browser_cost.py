"""The browser's own cost: page ÷ native for one case run on the same kernels, natively and in the page.

The one definition of a pair (the report's "Browser cost" section, `compare` and the matrix read it):
- native WebGPU (ONNX Runtime's WebGPU plugin EP) ↔ the page's WebGPU EP: the same WebGPU kernels, on
  the same adapter (its vendor, architecture and device name, as each side records it);
- native ORT's CPU EP ↔ the page's wasm EP: the same MLAS-derived kernels, at the same thread count
  (the native row's `native_threads` column or `intra_op_threads` fact, the page's effective threads).
Rows pair within one machine (its machine id; the run where none is recorded) on the same model,
batch, sequence length, precision that ran, mode and new tokens, both `ok`. A pair the rule refuses
(another adapter, another thread count, a count not recorded) is listed as unpaired with the reason.
Figures: latency p50, TTFT and decode tokens/s, page ÷ native (above 1 for time: the page is slower;
below 1 for tokens/s: the page is slower).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.analysis.tables import Table
from harness.core.labels import BROWSER_ENGINE, case_label, details_of, mode_of, served, target_label
from harness.core.threads import threads_part

# (page hardware, native provider) → the kernels both sides run, and what must be equal for a pair
PAIRS = {
    ("webgpu", "WebGpuExecutionProvider"): (
        "ONNX Runtime's WebGPU EP kernels (onnxruntime-web ↔ onnxruntime-ep-webgpu)", "adapter"),
    ("wasm", "CPUExecutionProvider"): ("ONNX Runtime's CPU kernels (wasm build ↔ native CPU EP)", "threads"),
}  # fmt: skip
NATIVE_PROVIDERS = {provider for _, provider in PAIRS}  # ORT's EP names: only ORT's rows carry them
CASE = ("model", "batch_size", "seq_len", "precision", "new_tokens")
ADAPTER_FIELDS = ("vendor", "architecture", "device")


@dataclass(frozen=True)
class BrowserCost:
    model: str
    case: str
    pair: str  # e.g. "webgpu/onnxruntime-web ↔ webgpu/onnxruntime:WebGpuExecutionProvider"
    kernels: str
    same: str  # the adapter or thread count both ran on
    latency_ratio: float | None  # page p50 ÷ native p50
    ttft_ratio: float | None
    decode_ratio: float | None  # page decode tokens/s ÷ native decode tokens/s
    page_result: str
    native_result: str


@dataclass(frozen=True)
class Unpaired:
    model: str
    case: str
    pair: str
    why: str


def adapter_key(row: dict[str, Any]) -> tuple[str, ...] | None:
    """The adapter a WebGPU row ran on (vendor, architecture, device), lower case; None if not recorded."""
    info = details_of(row).get("probed_adapter")
    if not isinstance(info, dict) or not any(info.get(k) for k in ADAPTER_FIELDS):
        return None
    return tuple(str(info.get(k) or "").strip().lower() for k in ADAPTER_FIELDS)


def thread_count(row: dict[str, Any]) -> int | None:
    """The threads a CPU row ran with: the page's effective wasm threads, native ORT's recorded count."""
    details = details_of(row)
    for value in (row.get("native_threads"), details.get("intra_op_threads"), details.get("threads_effective")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _same(kind: str, page: dict[str, Any], native: dict[str, Any]) -> tuple[str | None, str | None]:
    """What both ran on (None) or why they do not pair."""
    if kind == "adapter":
        a, b = adapter_key(page), adapter_key(native)
        if a is None or b is None:
            return None, "an adapter is not recorded"
        if a[0] != b[0] or a[2] != b[2] or (a[1] and b[1] and a[1] != b[1]):
            return None, f"different adapters ({' '.join(filter(None, a))} ↔ {' '.join(filter(None, b))})"
        return f"adapter {' '.join(filter(None, b))}", None
    t_page, t_native = thread_count(page), thread_count(native)
    if t_page is None or t_native is None:
        return None, "a thread count is not recorded (native: --native-threads)"
    if t_page != t_native:
        return None, f"different thread counts (page {t_page}, native {t_native})"
    return f"{t_native} thread{'s' if t_native != 1 else ''}", None


def base_provider(row: dict[str, Any]) -> str:
    """The EP a row ran, without the `:threads=N` its provider carries under --native-threads."""
    provider = row.get("provider") or ""
    part = threads_part(provider)
    return provider[: -len(part)] if part else provider


def _ratio(page: Any, native: Any) -> float | None:
    return page / native if isinstance(page, int | float) and isinstance(native, int | float) and native else None


def _group(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row.get("machine_id") or row["run_id"], mode_of(row), *(row.get(k) for k in CASE))


def browser_costs(rows: list[dict[str, Any]]) -> tuple[list[BrowserCost], list[Unpaired]]:
    """Every page row with its native twin on the same kernels: the pairs, and those the rule refuses."""
    native_by: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        if row["engine"] != BROWSER_ENGINE and base_provider(row) in NATIVE_PROVIDERS and row["status"] == "ok":
            native_by.setdefault(_group(row), []).append(row)
    paired, unpaired = [], []
    for page in rows:
        if page["engine"] != BROWSER_ENGINE or page["status"] != "ok" or served(page):
            continue
        for native in native_by.get(_group(page), []):
            spec = PAIRS.get((page["hardware"], base_provider(native)))
            if spec is None:
                continue
            kernels, kind = spec
            pair = f"{target_label(page)} ↔ {target_label(native)}"
            same, why = _same(kind, page, native)
            if same is None:
                unpaired.append(Unpaired(page["model"], case_label(page), pair, why or ""))
                continue
            paired.append(BrowserCost(
                page["model"], case_label(page), pair, kernels, same,
                _ratio(page.get("latency_p50_ms"), native.get("latency_p50_ms")),
                _ratio(page.get("ttft_ms"), native.get("ttft_ms")),
                _ratio(page.get("decode_tokens_per_s"), native.get("decode_tokens_per_s")),
                page["result_id"], native["result_id"],
            ))  # fmt: skip
    return paired, unpaired


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "—"


COLUMNS = ["model", "case", "pair", "same", "latency page÷native", "TTFT page÷native", "decode tok/s page÷native",
           "kernels (the same on both sides)"]  # fmt: skip
NOTE = ("page ÷ native on the same kernels: latency and TTFT above 1x, decode tokens/s below 1x are the "
        "browser's own cost")  # fmt: skip


def browser_cost_table(rows: list[dict[str, Any]]) -> Table | None:
    """The pairs in these rows as a table (page ÷ native), or None where they hold none (nor any refused)."""
    return cost_table(*browser_costs(rows))


def cost_table(paired: list[BrowserCost], unpaired: list[Unpaired]) -> Table | None:
    if not paired and not unpaired:
        return None
    body = [[c.model, c.case, c.pair, c.same, _x(c.latency_ratio), _x(c.ttft_ratio), _x(c.decode_ratio), c.kernels]
            for c in paired]  # fmt: skip
    body += [[u.model, u.case, u.pair, f"not paired: {u.why}", "—", "—", "—", "—"] for u in unpaired]
    return Table("Browser cost", COLUMNS, [dict(zip(COLUMNS, line, strict=True)) for line in body], notes=[NOTE])
