"""ONNX files whose weights live in external data files (`model.onnx` + `model.onnx.data`, `_data`,
`_data_1`…): which files a model is made of, whether they hold every byte the graph points at, and
writing a model over protobuf's 2 GB limit with its weights outside."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# protobuf cannot serialize a message of 2 GB or more: a model whose initializers come near it is
# written with external data (with room for the graph itself).
PROTOBUF_LIMIT_BYTES = 2**31
EXTERNAL_ABOVE_BYTES = PROTOBUF_LIMIT_BYTES - 2**27


def tensors(graph: Any) -> Iterator[Any]:
    """Every initializer, subgraphs' (If / Loop bodies) included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:
                yield from tensors(sub)


def nodes(graph: Any) -> Iterator[Any]:
    """Every node, subgraphs' (If / Loop bodies: a merged decoder's branches) included."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:
                yield from nodes(sub)


def _external_spans(path: Path) -> dict[str, list[tuple[str, int]]]:
    """Per external file (its location as written in the .onnx): (tensor, end offset) of each tensor in it."""
    import onnx

    spans: dict[str, list[tuple[str, int]]] = {}
    for tensor in tensors(onnx.load(str(path), load_external_data=False).graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entry = {item.key: item.value for item in tensor.external_data}
        end = int(entry.get("offset", 0)) + int(entry.get("length", 0))
        spans.setdefault(entry["location"], []).append((tensor.name, end))
    return spans


def external_locations(path: Path) -> list[str]:
    """The external data files a .onnx points at, as written in it (relative to its folder)."""
    return sorted(_external_spans(path))


def content_key(path: Path) -> str:
    """A cache key for a model file: a hash of the .onnx and of its external data files' names, sizes and
    modification times (hashing gigabytes of weights per run is not worth it)."""
    digest = hashlib.sha256(path.read_bytes())
    for location in external_locations(path):
        stat = (path.parent / location).stat()
        digest.update(f"{location}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def model_bytes(path: Path) -> int:
    """The .onnx file and every external data file it names, in bytes (missing files count 0)."""
    files = [path.parent / location for location in external_locations(path)]
    return path.stat().st_size + sum(f.stat().st_size for f in files if f.is_file())


def external_data_problem(path: Path) -> str | None:
    """Why the model's external data cannot be read (a file missing or shorter than a tensor in it
    needs), or None. Checked before a browser is handed the files: a page given short data fails
    deep inside ORT-web, or waits."""
    for location, spans in _external_spans(path).items():
        file = path.parent / location
        if not file.resolve().is_relative_to(path.parent.resolve()):  # ../x, absolute, a symlink leading out
            return f"{path.name}: external data location '{location}' is outside the model's folder"
        if not file.is_file():
            return f"{path.name}: external data file '{location}' is missing (expected at {file})"
        size = file.stat().st_size
        name, end = max(spans, key=lambda span: span[1])
        if end > size:
            return (
                f"{path.name}: external data file '{location}' is {size} bytes but tensor '{name}' ends at "
                f"byte {end}: the file is truncated"
            )
    return None


def initializer_bytes(model: Any) -> int:
    return sum(len(t.raw_data) for t in tensors(model.graph))


def save_model(model: Any, target: Path) -> dict[str, Any]:
    """Write `model` to target (model.onnx); with its weights in model.onnx.data when they would take
    it over protobuf's limit. Returns the fact for the row."""
    import onnx

    if initializer_bytes(model) < EXTERNAL_ABOVE_BYTES:
        onnx.save(model, str(target))
        return {"external_data": []}
    location = f"{target.name}.data"
    onnx.save(model, str(target), save_as_external_data=True, all_tensors_to_one_file=True, location=location)
    return {"external_data": [location]}
