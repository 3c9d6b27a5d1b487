"""A graph's counted work (harness.core.graph_cost), remembered on disk per file content and workload.

Counting runs onnx's shape inference, and ONNX Runtime's symbolic inference where onnx's leaves shapes unknown:
seconds per row on a tiny model, longer on a real one, and the same answer every time for the same file at
the same shapes. A count is a pure function of the graph file's bytes (weights are counted from their dims;
external data is never read), the workload, and the counting code: the key hashes all three, so an edited
file, another workload or another version of graph_cost/onnx computes afresh. A damaged or foreign entry is
recomputed, never trusted: entries are written by this process's code, read back only if they parse to the
expected shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from harness.prepare.cache import cache_root

MEMO_DIR = "graph-work"  # cache_root()/graph-work/<key>.json
MAX_ENTRY_BYTES = 1 << 20  # a counted row's fields and facts are a few hundred bytes; a bigger file is not ours
Work = tuple[dict[str, Any], dict[str, Any]]


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


def _read(path: Path) -> Work | None:
    try:
        if path.stat().st_size > MAX_ENTRY_BYTES:
            return None
        fields, facts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    return (fields, facts) if isinstance(fields, dict) and isinstance(facts, dict) else None


def _write(path: Path, work: Work) -> None:
    """Atomically (a temporary file renamed into place): a reader never sees half an entry."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(list(work), out)
        os.replace(temporary, path)
    except OSError:  # a read-only or full cache only costs the next run a recount
        pass


def remembered_work(graph: Path, workload: dict[str, Any], count: Callable[[], Work]) -> Work:
    """`count()`'s answer for this graph file and workload, from the memo when the same count was made before.
    Only a counted answer is remembered (one whose fields are not all NULL): a failure is counted again."""
    path = cache_root() / MEMO_DIR / f"{memo_key(graph, workload)}.json"
    found = _read(path)
    if found is not None:
        return found
    work = count()
    if any(value is not None for value in work[0].values()):
        _write(path, work)
    return work
