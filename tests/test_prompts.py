"""Issue 32 items 4 and 5: inputs that respect the graph, one prompt per model whatever its layout, text in
and out through the model folder's tokenizer, and the EOS policy a row states."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import run_cli
from test_web import web_cache  # noqa: F401 (the session's export cache: bert-tiny is exported once)

from harness.prepare.prepared import PrepareJob, prepare_model
from harness.prepare.specs import load_specs
from harness.store import open_store

FAST = ("--iterations", "2", "--warmup", "0", "--min-duration", "0", "--batch-sizes", "1")


def latest_rows(db: Path) -> list[dict]:
    with open_store(db, read_only=True) as store:
        return store.results(store.resolve_run("latest"))


def test_the_harness_own_bert_export_given_back_as_a_file_runs_ok(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """token_type_ids index a table of 2 rows: zeros, as a tokenizer gives one text; input_ids stay below the
    word table's rows (read from the graph's Gather). Before: ids up to 99, "idx=32 must be within [-2,1]"."""
    from harness.prepare.graph_tables import index_tables

    prepared = next(prepare_model(PrepareJob(load_specs()["bert-tiny"], [(1, 8)])))
    assert prepared.onnx_path is not None
    for each in prepared.onnx_path.parent.iterdir():
        shutil.copy(each, tmp_path / each.name)
    model = tmp_path / prepared.onnx_path.name
    assert index_tables(model) == {"input_ids": 30522, "token_type_ids": 2}
    db = tmp_path / "b.duckdb"
    done = run_cli("native", "--model-path", str(model), "--engines", "onnxruntime", "--hardware", "cpu", *FAST,
                   "--sequence-lengths", "40", "--db", str(db), "--output-dir", str(tmp_path / "o"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = latest_rows(db)
    assert row["status"] == "ok", row["error"]
