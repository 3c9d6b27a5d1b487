"""A graph's counted work (harness.core.graph_cost), remembered on disk per file content and workload.

Counting runs onnx's shape inference, and ONNX Runtime's symbolic inference where onnx's leaves shapes unknown:
seconds per row on a tiny model, longer on a real one, and the same answer every time for the same file at
the same shapes. A count is a pure function of the graph file's bytes (weights are counted from their dims;
external data is never read), the workload, and the counting code: the key hashes all three, so an edited
file, another workload or another version of graph_cost/onnx computes afresh.

An entry is data: a damaged or foreign one is counted again, never trusted. It is read (a regular file, bounded,
never waited on) and kept only when it holds exactly what a count answers: one kind's work fields and facts by
name (generation_work's or inference_work's), each number finite, not negative and within harness.core.bounds;
its work_counted text is the code's own, never stored. Only what reads back as the same answer is written. A
rewritten entry once made an ok row report 10^15 bytes and FLOPs per token beside planted text, and one holding
a Result's other names (memory_load_mb, variant) turned a good measurement into an error row: only_work is what
a row takes of an answer, its work fields and facts by name, so nothing in an entry reaches another field.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from harness.core.bounds import MAX_GRAPH_NODES, MAX_WORK_POSITIONS, WORK_BYTES_BOUND, WORK_FLOPS_BOUND
from harness.core.records import WORK_FIELDS
from harness.prepare.cache import cache_root
from harness.prepare.folder_checks import read_regular

MEMO_DIR = "graph-work"  # cache_root()/graph-work/<key>.json
MAX_ENTRY_BYTES = 1 << 20  # a counted row's fields and facts are a few hundred bytes; a bigger file is not ours
Work = tuple[dict[str, Any], dict[str, Any]]
WEIGHT_KINDS = frozenset({"int4", "fp32", "fp16", "bf16", "int8", "other"})  # graph_cost.weight_bytes' keys
COUNTED = "work_counted"  # the facts' text: how the count was made (graph_cost's words, never an entry's)
STEP_FACTS = ("step_nodes", "step_activation_bytes")  # a decode step's dispatched nodes and the bytes they move
# every fact a count gives
FACT_NAMES = ("weight_bytes", "kv_bytes_per_step", "kv_mean_positions", *STEP_FACTS, COUNTED)


@dataclass(frozen=True)
class Kind:
    """What one counting function answers: its work fields, its facts besides the text, and the text."""

    fields: frozenset[str]
    facts: frozenset[str]
    text: str


@cache
def kinds() -> dict[str, Kind]:
    """What a count answers in each mode (the workload's "mode"): generation_work's, inference_work's
    (graph_cost imported only when a count is read: onnx)."""
    from harness.core.graph_cost import GENERATION_COUNTED, INFERENCE_COUNTED

    generation = Kind(
        frozenset(("bytes_per_token", "flops_per_token", "prefill_flops_per_token")),
        frozenset(("weight_bytes", "kv_bytes_per_step", "kv_mean_positions", *STEP_FACTS)),
        GENERATION_COUNTED,
    )
    inference = Kind(frozenset(("bytes_per_item", "flops_per_item")), frozenset(("weight_bytes",)), INFERENCE_COUNTED)
    return {"generate": generation, "inference": inference}


@cache
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """SHA-256 of a graph file's bytes (once per file version in a process: several cases share a file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@cache
def _code_version() -> str:
    """The counting code and the shape inference it relies on: a change to either is another count."""
    import onnx

    from harness.core import graph_cost

    sources = [Path(graph_cost.__file__).read_bytes(), Path(__file__).read_bytes(), onnx.__version__.encode()]
    return hashlib.sha256(b"\0".join(sources)).hexdigest()


def memo_key(graph: Path, workload: dict[str, Any]) -> str:
    stat = graph.stat()
    content = _file_digest(str(graph), stat.st_size, stat.st_mtime_ns)
    parts = [content, _code_version(), json.dumps(workload, sort_keys=True)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _number(value: Any, bound: float) -> bool:
    """A JSON number from 0 to `bound` (a bool is none; NaN fails both comparisons, infinity the bound)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= bound


def _field_bound(name: str) -> float:
    return WORK_BYTES_BOUND if name.startswith("bytes") else WORK_FLOPS_BOUND


def _fact_valid(name: str, value: Any) -> bool:
    if name == "weight_bytes":  # bytes per stored type
        return (
            isinstance(value, dict)
            and set(value) <= WEIGHT_KINDS
            and all(_number(v, WORK_BYTES_BOUND) for v in value.values())
        )
    if name == "step_nodes":
        return _number(value, MAX_GRAPH_NODES)
    if name == "step_activation_bytes":  # None: a node's shapes unknown, as a field may be
        return value is None or _number(value, WORK_BYTES_BOUND)
    return _number(value, MAX_WORK_POSITIONS if name == "kv_mean_positions" else WORK_BYTES_BOUND)


def as_work(entry: Any, kind: Kind) -> Work | None:
    """A stored entry ([fields, facts without the text]) as the answer of a count of this kind, the text the
    code's own; None unless it holds exactly the kind's names, each value within its bound, a field counted."""
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, dict) for part in entry)):
        return None
    fields, facts = entry
    if set(fields) != kind.fields or set(facts) != kind.facts or all(value is None for value in fields.values()):
        return None
    if not all(value is None or _number(value, _field_bound(name)) for name, value in fields.items()):
        return None
    if not all(_fact_valid(name, value) for name, value in facts.items()):
        return None
    return dict(fields), {**facts, COUNTED: kind.text}


def stored(work: Work) -> list[dict[str, Any]]:
    """What an entry holds of an answer: its fields and facts, less the text (the code's own when read back)."""
    fields, facts = work
    return [dict(fields), {name: value for name, value in facts.items() if name != COUNTED}]


def only_work(work: Work) -> Work:
    """What a row takes of an answer: its work fields (harness.core.records.WORK_FIELDS) and facts (FACT_NAMES),
    each by name, so no answer can add or replace another field of a Result or key of its details."""
    fields, facts = work
    return {n: fields[n] for n in WORK_FIELDS if n in fields}, {n: facts[n] for n in FACT_NAMES if n in facts}


def _read(path: Path, kind: Kind) -> Work | None:
    try:
        entry = json.loads(read_regular(path, MAX_ENTRY_BYTES, "a graph-work entry takes").decode("utf-8"))
        return as_work(entry, kind)
    except (ValueError, RecursionError):  # FolderError (missing, no regular file, too big), bad UTF-8 or JSON
        return None


def _write(path: Path, entry: list[dict[str, Any]]) -> None:
    """Atomically (a temporary file renamed into place): a reader never sees half an entry."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(entry, out)
        os.replace(temporary, path)
    except OSError:  # a read-only or full cache, a directory in the entry's place: the next run counts again
        if temporary is not None:
            with suppress(OSError):
                os.unlink(temporary)


# Where a row's work came from (its details' `work_source`): a row says whether it was counted or remembered.
FROM_MEMO = "remembered: the graph-work memo's entry for this file, workload and counting code"
COUNTED_NOW = "counted: no memo entry for this file, workload and counting code"
COUNTED_OVER_ENTRY = "counted: the memo's entry was refused (not what a count answers) and written again"


def remembered_work(graph: Path, workload: dict[str, Any], count: Callable[[], Work]) -> tuple[Work, str]:
    """`count()`'s answer for this graph file and workload, from the memo when the same count was made before and
    its entry holds what a count answers (as_work); else counted now. Only an answer that reads back as itself is
    remembered (a field counted, every value within its bound): a failure, or a count past a bound, is counted
    again. The workload's "mode" says which kind of answer an entry must hold (a generation's, an inference's).
    Returns the answer and where it came from (FROM_MEMO, COUNTED_NOW or COUNTED_OVER_ENTRY), for the row to say."""
    kind = kinds().get(workload.get("mode"))
    if kind is None:  # no kind of answer known for it: nothing is remembered
        return count(), COUNTED_NOW
    path = cache_root() / MEMO_DIR / f"{memo_key(graph, workload)}.json"
    found = _read(path, kind)
    if found is not None:
        return found, FROM_MEMO
    source = COUNTED_OVER_ENTRY if os.path.lexists(path) else COUNTED_NOW
    work = count()
    if as_work(stored(work), kind) == work:
        _write(path, stored(work))
    return work, source
