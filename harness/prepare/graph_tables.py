"""The tables a graph's integer inputs index: each input that feeds a Gather's indices (through casts and
reshapes) and the rows of that table, read from the ONNX proto with the weights not loaded. What keeps a
drawn input inside its table (token_type_ids: 2 rows) and a model's prompt ids inside its vocabulary."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

# Ops an index passes through unchanged on its way to the table it indexes (exporters cast and reshape ids).
INDEX_PASSTHROUGH = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten")
GATHERS = ("Gather", "GatherBlockQuantized")  # GatherBlockQuantized: the genai builder's int4 embedding


@cache
def index_tables(path: Path) -> dict[str, int]:
    """Each graph input that indexes a table (a Gather's indices, through casts and reshapes) and the rows of
    the smallest table it indexes (the initializer's first dimension), read from the proto, weights not loaded."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    rows = {t.name: t.dims[0] for t in graph.initializer if t.dims}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    tables = {}
    for graph_input in graph.input:
        found = _table_rows(graph_input.name, consumers, rows)
        if found:
            tables[graph_input.name] = min(found)
    return tables


def _table_rows(name: str, consumers: dict[str, list[Any]], rows: dict[str, int]) -> list[int]:
    """The rows of every table `name` indexes, following it through INDEX_PASSTHROUGH ops."""
    found, stack, seen = [], [name], set()
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        for node in consumers.get(value, ()):
            if node.op_type in GATHERS and len(node.input) > 1 and node.input[1] == value:
                found += _gathered_rows(node, rows)
            elif node.op_type in INDEX_PASSTHROUGH and node.input[0] == value:
                stack.extend(node.output)
    return found


def _gathered_rows(node: Any, rows: dict[str, int]) -> list[int]:
    """The rows of the table a Gather reads: its data initializer's first dimension or, for the genai
    builder's GatherBlockQuantized over embeddings shared with the LM head (its data a Reshape of the head's
    weights), its scales' first dimension: one row of scales per table row."""
    if node.input[0] in rows:
        return [rows[node.input[0]]]
    if node.op_type == "GatherBlockQuantized" and len(node.input) > 2 and node.input[2] in rows:
        return [rows[node.input[2]]]
    return []
