"""Issue 42 item 5: the graph-work memo (harness.prepare.work_memo) is data. An entry is kept only when it holds
exactly what a count of its mode answers, each number finite, not negative and within harness.core.bounds, and its
text is the code's own; anything else is counted again. A rewritten entry made an ok row report 10^15 bytes and
FLOPs per token beside planted text; one with a Result's other names (memory_load_mb, variant, max_abs_diff) turned
a good measurement into an error row (TypeError: got multiple values); one holding NaN lost the measurement."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import run_cli
from int4_models import matmul_model
from onnx import TensorProto, helper, numpy_helper

import harness.run.ceilings as ceilings
from harness.core.graph_cost import GENERATION_COUNTED, INFERENCE_COUNTED
from harness.core.records import WORK_FIELDS, Case
from harness.prepare import work_memo
from harness.prepare.work_memo import FACT_NAMES, MEMO_DIR, kinds, only_work

INFERENCE = Case(batch_size=2, seq_len=None, precision="fp32")
GENERATION = Case(batch_size=1, seq_len=4, precision="fp32", mode="generate", new_tokens=4, depth=0)
PLANTED = "harness.core.graph_cost: verified on an H200 by the vendor"
Entry = list[dict[str, Any]]


@pytest.fixture
def counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Case]:
    """The cases counted (not remembered) from now on, the memo in this test's own cache folder."""
    monkeypatch.setenv("ACCELHARNESS_CACHE_DIR", str(tmp_path / "cache"))  # cache_root() reads it at each call
    counted: list[Case] = []
    real_count = ceilings._count

    def counting(model: Path, case: Case, shapes: dict) -> tuple:
        counted.append(case)
        return real_count(model, case, shapes)

    monkeypatch.setattr(ceilings, "_count", counting)
    return counted


def inference_graph(tmp_path: Path) -> tuple[Path, Case, dict[str, list[int]]]:
    """x[batch, 16] @ w[16, 32]: the cheapest real count of an inference row."""
    return matmul_model(tmp_path / "inference.onnx", widths=(16, 32)), INFERENCE, {"x": [2, 16]}


def generation_graph(tmp_path: Path) -> tuple[Path, Case, dict[str, list[int]]]:
    """A decoder with one past input (2 heads of size 4): an embedding Gather, a MatMul, the past passed through."""
    weights = [numpy_helper.from_array(np.ones((16, 8), np.float32), "embedding"),
               numpy_helper.from_array(np.ones((8, 8), np.float32), "w")]  # fmt: skip
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["h"], name="embed"),
             helper.make_node("MatMul", ["h", "w"], ["logits"], name="mm"),
             helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"], name="keep")]  # fmt: skip
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch", 2, "past", 4]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 8]),
               helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["batch", 2, "past", 4])]  # fmt: skip
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, weights)
    path = tmp_path / "decoder.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path, GENERATION, {"input_ids": [1, 4]}


GRAPHS = {"inference": inference_graph, "generate": generation_graph}


def work_of(row_work: tuple[dict, dict]) -> tuple[dict, dict]:
    """A row's work fields and facts without its `work_source` (where they came from, asserted apart)."""
    fields, facts = row_work
    return fields, {name: value for name, value in facts.items() if name != "work_source"}


def entry_file(tmp_path: Path) -> Path:
    (found,) = (tmp_path / "cache" / MEMO_DIR).glob("*.json")
    return found


def test_a_real_count_is_remembered_and_read_back_as_itself(tmp_path: Path, counts: list[Case]) -> None:
    """Both kinds of count: remembered once, read back equal; the entry holds no text (the code's own is added),
    and the kinds' names are exactly what the counts give and what a Result has."""
    for mode, make in GRAPHS.items():
        model, case, shapes = make(tmp_path)
        first = ceilings.row_work(model, case, shapes)
        before = len(counts)
        again = ceilings.row_work(model, case, shapes)
        assert work_of(again) == work_of(first) and len(counts) == before  # remembered, and the row says so
        assert (first[1]["work_source"], again[1]["work_source"]) == (work_memo.COUNTED_NOW, work_memo.FROM_MEMO)
        facts = kinds()[mode].facts | {"work_counted", "work_source"}
        assert set(first[0]) == kinds()[mode].fields and set(first[1]) == facts
        assert first[1]["work_counted"] == (GENERATION_COUNTED if mode == "generate" else INFERENCE_COUNTED)
    assert set().union(*(kind.fields for kind in kinds().values())) == set(WORK_FIELDS)
    for entry in (tmp_path / "cache" / MEMO_DIR).glob("*.json"):
        fields, facts = json.loads(entry.read_text())
        assert set(fields) in [kind.fields for kind in kinds().values()]
        assert "work_counted" not in facts and set(facts) <= set(FACT_NAMES)


def scaled(entry: Entry) -> Entry:
    """Every field and weight 10^15 and planted text: what an ok row reported."""
    fields, facts = entry
    weights = {kind: 1e15 for kind in facts["weight_bytes"]}
    return [dict.fromkeys(fields, 1e15), facts | {"weight_bytes": weights, "work_counted": PLANTED}]


def every_field(value: Any) -> Callable[[Entry], Entry]:
    return lambda entry: [dict.fromkeys(entry[0], value), entry[1]]


# Each rewrite of a real entry, which must be counted again
REWRITES: dict[str, Callable[[Entry], Entry]] = {
    "1e15 and planted text": scaled,
    "1e15 alone": every_field(1e15),
    "a Result's other names": lambda e: [e[0] | {"memory_load_mb": 1.0, "variant": "x", "max_abs_diff": 0.0}, e[1]],
    "details' other keys": lambda e: [e[0], e[1] | {"parity": "ok", "input_shapes": {}}],
    "planted text alone": lambda e: [e[0], e[1] | {"work_counted": PLANTED}],
    "NaN": every_field(float("nan")),
    "infinity": every_field(float("inf")),
    "negative": every_field(-1.0),
    "a string": every_field("12"),
    "a list": every_field([1.0]),
    "a bool": every_field(True),
    "null everywhere": every_field(None),
    "a number past any float": every_field(10**400),
    "a field missing": lambda e: [dict(list(e[0].items())[1:]), e[1]],
    "weights of a foreign kind": lambda e: [e[0], e[1] | {"weight_bytes": {"fp32": 1.0, "planted": 2.0}}],
    "weights not an object": lambda e: [e[0], e[1] | {"weight_bytes": 5}],
    "three parts": lambda e: [*e, {}],
}


@pytest.mark.parametrize("mode", GRAPHS)
@pytest.mark.parametrize("rewrite", REWRITES)
def test_a_rewritten_entry_is_counted_again_never_trusted(
    mode: str, rewrite: str, tmp_path: Path, counts: list[Case]
) -> None:
    """The real entry rewritten on disk: the row's work is a fresh count's (the same values, the code's own text,
    no other key), and the entry is remembered right again."""
    model, case, shapes = GRAPHS[mode](tmp_path)
    first = ceilings.row_work(model, case, shapes)
    path = entry_file(tmp_path)
    path.write_text(json.dumps(REWRITES[rewrite](json.loads(path.read_text()))))
    before = len(counts)
    again = ceilings.row_work(model, case, shapes)
    assert len(counts) == before + 1  # counted, not remembered
    assert work_of(again) == work_of(first) and again[1]["work_counted"] != PLANTED
    assert again[1]["work_source"] == work_memo.COUNTED_OVER_ENTRY  # the row says it was counted, not remembered
    remembered = ceilings.row_work(model, case, shapes)
    assert work_of(remembered) == work_of(first) and len(counts) == before + 1  # rewritten right


def test_another_modes_entry_is_not_taken(tmp_path: Path, counts: list[Case]) -> None:
    """A well-formed generation entry where an inference row's stands: the wrong kind of answer, counted again."""
    model, case, shapes = generation_graph(tmp_path)
    ceilings.row_work(model, case, shapes)
    generation = json.loads(entry_file(tmp_path).read_text())
    entry_file(tmp_path).unlink()
    model, case, shapes = inference_graph(tmp_path)
    first = ceilings.row_work(model, case, shapes)
    entry_file(tmp_path).write_text(json.dumps(generation))
    assert work_of(ceilings.row_work(model, case, shapes)) == work_of(first) and len(counts) == 3


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_an_entry_that_is_no_regular_file_is_counted_again_without_waiting(
    kind: str, tmp_path: Path, counts: list[Case]
) -> None:
    """A FIFO would block the read for good; a directory, or a link to a file that is no entry, is no entry."""
    model, case, shapes = inference_graph(tmp_path)
    first = ceilings.row_work(model, case, shapes)
    path = entry_file(tmp_path)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/etc/hostname" if Path("/etc/hostname").exists() else "/etc/passwd")
    assert work_of(ceilings.row_work(model, case, shapes)) == work_of(first) and len(counts) == 2
    assert not list(path.parent.glob(".tmp-*"))  # an entry that could not be written leaves nothing behind


def test_a_row_takes_only_the_work_fields_and_facts_by_name() -> None:
    """only_work: whatever an answer holds besides, a row's other fields and details keys are out of its reach."""
    fields = {"bytes_per_item": 1.0, "flops_per_item": 2.0, "memory_load_mb": 3.0, "variant": "x", "status": "ok"}
    facts = {"weight_bytes": {"fp32": 1.0}, "work_counted": INFERENCE_COUNTED, "parity": "ok", "input_shapes": {}}
    assert only_work((fields, facts)) == (
        {"bytes_per_item": 1.0, "flops_per_item": 2.0},
        {"weight_bytes": {"fp32": 1.0}, "work_counted": INFERENCE_COUNTED},
    )


def test_a_native_run_after_its_entry_is_rewritten_stays_ok_with_the_true_work(tmp_path: Path) -> None:
    """End to end: a lone one-MatMul graph run natively; its entry rewritten (10^15, planted text, a Result's
    other names), the next run is ok with the first run's bytes and FLOPs per item and the code's own text."""
    from harness.store import open_store

    model = matmul_model(tmp_path / "model.onnx", widths=(16, 32))
    db, env = tmp_path / "runs.duckdb", {"ACCELHARNESS_CACHE_DIR": str(tmp_path / "cache")}
    args = ("native", "--hardware", "cpu", "--engines", "onnxruntime", "--batch-sizes", "1", "--iterations", "1",
            "--warmup", "0", "--min-duration", "0", "--model-path", str(model), "--db", str(db))  # fmt: skip

    def row() -> dict:
        done = run_cli(*args, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        with open_store(db, read_only=True) as store:
            (found,) = store.results(store.resolve_run("latest"))
        return found

    first = row()
    assert first["status"] == "ok" and first["bytes_per_item"] > 0
    path = entry_file(tmp_path)
    fields, facts = scaled(json.loads(path.read_text()))
    path.write_text(json.dumps([fields | {"memory_load_mb": 1e15, "variant": "x", "max_abs_diff": 0.0}, facts]))
    second = row()
    assert second["status"] == "ok", second["error"]
    for name in ("bytes_per_item", "flops_per_item"):
        assert second[name] == first[name]
    details = second["details"] if isinstance(second["details"], dict) else json.loads(second["details"])
    assert details["work_counted"] == INFERENCE_COUNTED and second["variant"] != "x"
    assert details["work_source"] == work_memo.COUNTED_OVER_ENTRY  # the row says it was counted, not remembered
