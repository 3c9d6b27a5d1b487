"""What the roofline predictor reads from the store: each target's measured rows of work and time, and its ceilings.

A target here is a machine's target at a precision class: (machine, hardware, engine, provider, device, class),
since a ceiling is a machine's and a compute ceiling a precision class's (harness.core.roofline). Its ceiling is
the median of the values stored for it on that machine (a run's fastest sample, itself noisy on a shared machine:
the median of several runs' is steadier than the latest). A term of bytes is held against the bandwidth the step's
bytes see (harness.core.roofline.effective_bandwidth): the in-cache bandwidth ceiling up to its graph's working set,
the bandwidth_large one (live tensors well past any last-level cache) from its own, interpolated in log(bytes) in
between; a target with no bandwidth_large (an older store, a bundle without it) the bandwidth ceiling alone, as
before. A row is held against the ceilings the store's fractions hold it against (harness.core.labels.ceiling_owner):
a page runtime other than onnxruntime-web against onnxruntime-web's on its EP, a native GGUF runtime on the CPU at N
threads against ONNX Runtime's CPU EP's at N threads.

A decode step is priced two ways (harness.analysis.roofline_predict): "decode", its bytes per token at the bandwidth
ceiling plus a fixed overhead; and "step", a cost per dispatched node plus the weights, the KV cache and the
activations the step moves, each its own term at the bandwidth ceiling, all four counted from the graph and stored
in the row's details (harness.core.graph_cost.generation_work). "step_median" is the same law held against the
row's median decode step (TPOT p50) rather than its mean: what the law reaches where a row's slow first
generations (a page's code still compiling) are left out. A row's details may come from another machine's bundle:
each count is read only as a finite number within its bound (harness.core.bounds), else the row has none.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis.machines import machine_name
from harness.analysis.roofline_fit import Point
from harness.core.bounds import MAX_GRAPH_NODES, WORK_BYTES_BOUND
from harness.core.labels import ceiling_owner, target_label
from harness.core.roofline import (
    BANDWIDTH_CLASS,
    BANDWIDTH_KINDS,
    effective_bandwidth,
    precision_class,
    working_set_bytes,
)
from harness.core.threads import THREADS_MARK
from harness.store import open_store

# The phases a mode is fitted in, and the ceilings each phase's terms are held against (harness.analysis.roofline_fit);
# None: a count (a step's nodes) priced per unit, not a time at a ceiling
PHASES = {"generate": ("decode", "prefill"), "inference": ("inference",)}
STEP_TERMS = (None, "bandwidth", "bandwidth", "bandwidth")  # nodes, weights, KV cache, activations
TERMS: dict[str, tuple[str | None, ...]] = {"decode": ("bandwidth",), "step": STEP_TERMS, "step_median": STEP_TERMS,
                                            "prefill": ("compute",), "inference": ("compute", "bandwidth")}  # fmt: skip
NO_OVERHEAD = frozenset({"step", "step_median"})  # its nodes are the step's fixed cost
STEP_FIELDS = ("step_nodes", "weight_bytes", "kv_bytes_per_step", "step_activation_bytes")  # the step's terms' work

ROWS_SQL = """
SELECT r.result_id, r.model, r.hardware, r.engine, r.provider, r.device, r.precision, r.batch_size, r.seq_len,
       r.depth, r.new_tokens, r.ttft_ms, r.prefill_tokens_per_s, r.decode_tokens_per_s, r.bytes_per_token,
       r.prefill_flops_per_token, r.bytes_per_item, r.flops_per_item, r.latency_p50_ms, r.tpot_ms,
       json_extract_string(r.details, '$.step_nodes') AS step_nodes,
       json_extract_string(r.details, '$.step_activation_bytes') AS step_activation_bytes,
       json_extract_string(r.details, '$.kv_bytes_per_step') AS kv_bytes_per_step,
       CAST(json_extract(r.details, '$.weight_bytes') AS VARCHAR) AS weight_bytes,
       u.machine_id, u.machine_label, u.started_at
FROM results r JOIN runs u USING (run_id)
WHERE r.status = 'ok' AND r.mode = ? AND r.variant IS NULL
ORDER BY u.started_at, r.result_id
"""
# a ceiling reused by later runs (harness.run.ceiling_reuse) is one measurement: counted once, where it was taken
CEILINGS_SQL = """
SELECT u.machine_id, any_value(u.machine_label) AS machine_label, c.hardware, c.engine, c.provider, c.device, c.kind,
       c.precision, list(c.value) AS values, list(c.amount) AS amounts
FROM ceilings c JOIN runs u USING (run_id) WHERE c.value > 0 AND c.reused_from IS NULL GROUP BY ALL
"""


@dataclass(frozen=True, order=True)
class Where:
    """A target on a machine at a precision class: what one law is fitted for."""

    machine: str  # the machine id ('' for a run that recorded none)
    hardware: str
    engine: str
    provider: str
    device: str  # '' for this machine's own targets, else the served device
    precision_class: str

    @property
    def family(self) -> tuple[str, str, str, str]:
        """What a target known only by its ceilings learns from: the same engine and EP, at another thread count,
        on another machine or device (the provider without its `:threads=N`)."""
        return self.hardware, self.engine, self.provider.partition(THREADS_MARK)[0], self.precision_class

    def label(self) -> str:
        return target_label({"hardware": self.hardware, "engine": self.engine, "provider": self.provider,
                             "device": self.device or None})  # fmt: skip

    def ceiling_key(self, kind: str) -> tuple[str, ...]:
        engine, provider = ceiling_owner(self.hardware, self.engine, self.provider)
        cls = BANDWIDTH_CLASS if kind in BANDWIDTH_KINDS else self.precision_class
        return self.machine, self.hardware, engine, provider or "", self.device, kind, cls


def where_of(row: Mapping[str, Any]) -> Where | None:
    cls = precision_class(row["precision"])
    if cls is None:
        return None
    return Where(row["machine_id"] or "", row["hardware"], row["engine"], row["provider"] or "", row["device"] or "",
                 cls)  # fmt: skip


@dataclass
class Book:
    """A store read once: its rows of one mode by target, its ceilings, the machines' names."""

    mode: str
    rows: dict[Where, list[dict[str, Any]]]
    ceilings: dict[tuple[str, ...], float]  # Where.ceiling_key -> GB/s or GFLOP/s (the median on that machine)
    machines: dict[str, str]  # machine id -> its name in reports
    working_sets: dict[tuple[str, ...], float] = field(default_factory=dict)  # a bandwidth graph's live bytes (median)

    def ceiling(self, where: Where, kind: str) -> float | None:
        return self.ceilings.get(where.ceiling_key(kind))

    def bandwidth(self, where: Where, nbytes: float) -> tuple[float, str] | None:
        """(GB/s, which ceiling, in words) that a step moving `nbytes` sees on the target (effective_bandwidth);
        None without a bandwidth ceiling."""
        small, large = (self._roof(where, kind) for kind in BANDWIDTH_KINDS)
        if small is None:
            return None
        gbps = effective_bandwidth(nbytes, small, large)
        if large is None:
            return gbps, "bandwidth (no bandwidth_large measured)"
        if nbytes <= small[0] or gbps == small[1]:
            return gbps, f"bandwidth ({nbytes / 1e6:.3g} MB within its {small[0] / 1e6:.3g} MB working set)"
        if nbytes >= large[0]:
            return gbps, f"bandwidth_large ({nbytes / 1e6:.3g} MB past its {large[0] / 1e6:.3g} MB working set)"
        return gbps, (f"bandwidth to bandwidth_large in log(bytes) ({nbytes / 1e6:.3g} MB between their "
                      f"{small[0] / 1e6:.3g} and {large[0] / 1e6:.3g} MB working sets)")  # fmt: skip

    def _roof(self, where: Where, kind: str) -> tuple[float, float] | None:
        key = where.ceiling_key(kind)
        value, working_set = self.ceilings.get(key), self.working_sets.get(key)
        return (working_set, value) if value and working_set else None

    def targets(self, cls: str) -> set[Where]:
        """Every target at a precision class that ran rows or measured ceilings (a machine measured with
        --ceilings-only too); whether a phase can be predicted on it is whether its ceilings are here (`has`)."""
        found = {Where(m, h, e, p, d, cls) for m, h, e, p, d, _, _ in self.ceilings}
        return found | {w for w in self.rows if w.precision_class == cls}

    def has(self, where: Where, phase: str) -> bool:
        return all(self.ceiling(where, kind) for kind in TERMS[phase] if kind)

    def ideal(self, where: Where, phase: str, work: tuple[float, ...]) -> tuple[float, ...] | None:
        """Each term's work as the seconds it takes at 100% of the target's ceiling (a count as it is): its bytes
        at the bandwidth the step's bytes (its byte terms summed) see."""
        terms = TERMS[phase]
        seen = self.bandwidth(where, bytes_moved(phase, work)) if "bandwidth" in terms else None
        ceilings = [seen[0] if seen and kind == "bandwidth" else self.ceiling(where, kind) if kind else None
                    for kind in terms]  # fmt: skip
        if any(kind and not c for kind, c in zip(TERMS[phase], ceilings, strict=True)):
            return None
        return tuple(w / (c * 1e9) if c else w for w, c in zip(work, ceilings, strict=True))

    def points(self, where: Where, phase: str, without: str | None = None, precision: str | None = None) -> list[Point]:
        """The target's rows as a phase's points (those with its work counted and its ceilings measured), the
        model `without` left out (and, given a precision, the rows of another precision of its class)."""
        if not self.has(where, phase):
            return []
        found = []
        for row in self.rows.get(where, []):
            if row["model"] == without or precision not in (None, row["precision"]):
                continue
            measured = phase_seconds(phase, row)
            work = phase_work(phase, row)
            ideal = self.ideal(where, phase, work) if work and all(w is not None for w in work) else None
            if measured and ideal:
                found.append(Point(row["model"], ideal, measured, row["result_id"]))
        return found


def bytes_moved(phase: str, work: Sequence[float | None]) -> float:
    """The bytes a phase's terms move (its terms at the bandwidth ceiling, summed): what a cache would have to hold."""
    return sum(w or 0.0 for w, kind in zip(work, TERMS[phase], strict=True) if kind == "bandwidth")


def phase_seconds(phase: str, row: Mapping[str, Any]) -> float | None:
    """A row's measured seconds for a phase: a decode step, the TTFT, an inference's latency."""
    if phase in ("decode", "step"):
        rate = row.get("decode_tokens_per_s")
        return row["batch_size"] / rate if rate else None
    names = {"step_median": "tpot_ms", "prefill": "ttft_ms"}
    value = row.get(names.get(phase, "latency_p50_ms"))
    return value / 1000.0 if value else None


def phase_work(phase: str, work: Mapping[str, Any]) -> tuple[float | None, ...] | None:
    """A phase's work per term (harness.core.graph_cost's fields of a row or a counted graph): bytes for a decode
    step, its nodes and the bytes of each kind it moves (counted at its batch), FLOPs for the prompt's prefill,
    FLOPs and bytes for an inference; None where a field is missing."""
    batch = work.get("batch_size") or 1
    if phase in ("step", "step_median"):
        return tuple(work.get(name) for name in STEP_FIELDS)
    if phase == "decode":
        return (_times(work.get("bytes_per_token"), batch),)
    if phase == "prefill":
        return (_times(work.get("prefill_flops_per_token"), batch * (work.get("seq_len") or 0) or None),)
    return _times(work.get("flops_per_item"), batch), _times(work.get("bytes_per_item"), batch)


def _times(value: float | None, factor: float | None) -> float | None:
    return value * factor if value is not None and factor else None


def read_book(db_path: Path, mode: str) -> Book:
    with open_store(db_path, read_only=True) as store:
        rows = store.query(ROWS_SQL, [mode])
        ceilings = store.query(CEILINGS_SQL)
        runs = store.query("SELECT DISTINCT machine_id, machine_label FROM runs")
    by_target: dict[Where, list[dict[str, Any]]] = {}
    for row in rows:
        if (where := where_of(row)) is not None:
            by_target.setdefault(where, []).append(row | step_counts(row))
    keys = [(c["machine_id"] or "", c["hardware"], c["engine"], c["provider"] or "", c["device"] or "", c["kind"],
             c["precision"]) for c in ceilings]  # fmt: skip
    values = {key: statistics.median(c["values"]) for key, c in zip(keys, ceilings, strict=True)}
    working_sets = {key: working_set_bytes(statistics.median(c["amounts"])) for key, c in zip(keys, ceilings,
                    strict=True) if c["kind"] in BANDWIDTH_KINDS}  # fmt: skip
    machines = {r["machine_id"] or "": machine_name(r) for r in runs}
    return Book(mode, by_target, values, machines, working_sets)


def step_counts(row: Mapping[str, Any]) -> dict[str, float | None]:
    """A row's counted step facts (as stored text) as numbers: each finite and within its bound, else None; the
    weights the sum of their bytes by stored type (a small object of such numbers, else None)."""
    found = {name: _bounded(row.get(name), WORK_BYTES_BOUND) for name in STEP_FIELDS[2:]}
    return found | {"step_nodes": _bounded(row.get("step_nodes"), MAX_GRAPH_NODES),
                    "weight_bytes": _weights(row.get("weight_bytes"))}  # fmt: skip


def _bounded(value: Any, bound: float) -> float | None:
    try:
        number = float(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else math.nan
    except ValueError:
        return None
    return number if 0 <= number <= bound else None  # NaN and infinities fail


MAX_WEIGHTS_TEXT = 512  # {"int4": ..., "fp32": ..., ...}: six kinds of number; a longer text is not a count's


def _weights(text: Any) -> float | None:
    if not isinstance(text, str) or len(text) > MAX_WEIGHTS_TEXT:
        return None
    try:
        kinds = json.loads(text)
    except ValueError:
        return None
    if not isinstance(kinds, dict) or not kinds:
        return None
    values = [_bounded(v, WORK_BYTES_BOUND) for v in kinds.values()]
    if any(v is None for v in values):
        return None
    return _bounded(sum(v for v in values if v is not None), WORK_BYTES_BOUND)
