"""What each precision means in ONNX terms, and how a row says the engine computed in another one.

A precision names two things: how the weights are stored and what the MatMuls compute in. An engine
may keep the weights asked for and compute in something else (ONNX Runtime's CPU EP casts an fp16
MatMul's weights back to fp32 on x86); the engine's own graph says so, and the row carries it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.core.terminal import terminal_text

# requested precision → (weights, MatMul compute). q4 / q4f16 are transformers.js's names: int4
# weight-only MatMulNBits with fp32 (q4) or fp16 (q4f16) activations.
MEANINGS: dict[str, tuple[str, str]] = {
    "fp32": ("fp32", "fp32"),
    "fp16": ("fp16", "fp16"),
    "bf16": ("bf16", "bf16"),
    "int8": ("int8", "int8"),
    "q4": ("int4", "fp32"),
    "q4f16": ("int4", "fp16"),
}
AUTO = "auto"  # the engine's default: no conversion asked for
INT4_PRECISIONS = tuple(name for name, (weights, _) in MEANINGS.items() if weights == "int4")


def compute_facts(requested: str, computed: Mapping[str, int], source: str) -> dict[str, Any]:
    """The details a row carries about what its engine computed in: weight MatMul nodes per compute
    precision, read from the engine (`source` says how), and the text of the P mark when some of them
    do not compute in what the requested precision means."""
    facts: dict[str, Any] = {"compute_precision": dict(computed), "compute_precision_source": source}
    weights, wanted = MEANINGS.get(requested, (requested, requested))
    total = sum(computed.values())
    other = {kind: count for kind, count in computed.items() if kind not in (wanted, "unknown")}
    if requested != AUTO and total and other:
        ran = ", ".join(f"{kind} compute: {count} of {total} MatMul" for kind, count in sorted(other.items()))
        facts["compute_precision_differs"] = f"{weights} weights, {ran}"
    return facts


def graph_compute_facts(label: str, computed: Mapping[str, Mapping[str, int]], source: str) -> dict[str, Any]:
    """compute_facts over an encoder–decoder's graphs (`computed`: each graph's weight MatMul nodes per compute
    precision, read from the engine): the counts summed and per graph (graph_compute_precision), and the P mark's
    text naming each graph that computed in other than its own precision (graph_precision of `label`)."""
    total: dict[str, int] = {}
    differs = []
    for graph, counts in computed.items():
        for kind, count in counts.items():
            total[kind] = total.get(kind, 0) + count
        found = compute_facts(graph_precision(label, graph), counts, source)
        if "compute_precision_differs" in found:
            differs.append(f"{graph}: {found['compute_precision_differs']}")
    facts = compute_facts(AUTO, total, source) | {"graph_compute_precision": {g: dict(c) for g, c in computed.items()}}
    return facts | ({"compute_precision_differs": "; ".join(differs)} if differs else {})


# An encoder–decoder's graphs, as a precision names them apart (transformers.js's per-file dtype,
# {encoder_model: "fp32", decoder_model_merged: "q4"}): `--precision encoder=fp32,decoder=q4`. The decoder
# covers every decoder file of the layout (the first step's and the later steps', or the merged one).
GRAPHS = ("encoder", "decoder")
PER_GRAPH_FORM = ",".join(f"{graph}=<precision>" for graph in GRAPHS)
PER_GRAPH_HELP = f"An encoder–decoder's graphs apart: {PER_GRAPH_FORM} (a plain precision is every graph's)."


def per_graph(label: str) -> dict[str, str] | None:
    """A per-graph precision label's precision of each graph ({"encoder": "fp32", "decoder": "q4"}), or None for
    a plain precision (every graph's). The label is one parse_precisions made: canonical, checked."""
    if "=" not in label:
        return None
    return dict(part.split("=", 1) for part in label.split(","))


def graph_precision(label: str, graph: str) -> str:
    """The precision `graph` (one of GRAPHS) runs at under a label: its own part, or the plain precision."""
    parts = per_graph(label)
    return label if parts is None else parts[graph]


def graph_label(precisions: Mapping[str, str]) -> str:
    """The label of a precision per graph: the one name where every graph shares it (encoder=q4,decoder=q4 is
    q4), else each graph's part in GRAPHS order."""
    found = [precisions[graph] for graph in GRAPHS]
    return found[0] if len(set(found)) == 1 else ",".join(f"{g}={p}" for g, p in zip(GRAPHS, found, strict=True))


def parse_precisions(values: Iterable[str]) -> list[str]:
    """--precision's values (comma-separated items, a list of them) as labels, in order without duplicates:
    each plain precision one, and each run of graph=precision items (every graph named once) one per-graph label.
    The one parse and check of the option: a ValueError says what was wrong and what is valid."""
    labels: list[str] = []
    group: dict[str, str] = {}
    for item in (part.strip() for value in values for part in str(value).split(",")):
        if not item:
            continue
        graph, named, precision = item.rpartition("=")[0].strip(), "=" in item, item.rpartition("=")[2].strip()
        if precision not in (*MEANINGS, AUTO):
            valid = ", ".join((*MEANINGS, AUTO))
            raise ValueError(f"unknown precision '{_quoted(precision)}'; valid: {valid}")
        if not named:
            _close(group, labels)
            labels.append(precision)
            continue
        if graph not in GRAPHS:
            raise ValueError(f"unknown graph '{_quoted(graph)}' in '{_quoted(item)}'; an encoder–decoder's "
                             f"graphs: {', '.join(GRAPHS)} ({PER_GRAPH_FORM})")  # fmt: skip
        if graph in group:  # a graph named again starts the next label
            _close(group, labels)
        group[graph] = precision
    _close(group, labels)
    if not labels:
        raise ValueError(f"needs at least one of: {', '.join((*MEANINGS, AUTO))}")
    return list(dict.fromkeys(labels))


def _close(group: dict[str, str], labels: list[str]) -> None:
    """The per-graph label of the items gathered so far (each graph named), appended; the group emptied."""
    if not group:
        return
    missing = [graph for graph in GRAPHS if graph not in group]
    if missing:
        given = ",".join(f"{g}={p}" for g, p in group.items())
        raise ValueError(f"'{given}' names no precision for the {' and '.join(missing)}; a per-graph precision "
                         f"names each graph: {PER_GRAPH_FORM}")  # fmt: skip
    labels.append(graph_label(group))
    group.clear()


def _quoted(text: str) -> str:
    """A user's text as an error message quotes it: one safe line, at most 40 characters."""
    return terminal_text(text)[:40]
