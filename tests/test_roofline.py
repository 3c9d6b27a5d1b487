"""Issue 34: each target's measured ceilings, how close every row comes to them, decode at depth.

One real run (module-scoped): llama-tiny generating natively on ONNX Runtime's CPU EP and torch (issue 45: its
ceilings the same graphs as torch ops, its cache filled as ORT's is) and in Chromium's wasm, at two KV-cache
depths, with its reports; every test reads it. The bundle checks plant faults in its export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli_process
from test_bundle_hostile import craft, set_cell

from harness.browser.both import run_both
from harness.browser.run import WebRequest
from harness.bundle.export import export_bundle
from harness.bundle.fmt import BundleError
from harness.bundle.importer import import_bundles
from harness.core.graph_cost import weight_bytes
from harness.core.labels import case_label
from harness.core.roofline import ceiling_figures
from harness.run.ceilings import CEILING_BUDGET_MS
from harness.run.plan import BenchmarkRequest
from harness.store import open_store

pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
TOKENS, DEPTHS = 4, [0, 8]
TARGETS = {("cpu", "onnxruntime"), ("cpu", "torch"), ("wasm", "onnxruntime-web")}
SOFTWARE = {"onnxruntime": "onnxruntime_version=", "torch": "torch_version=", "onnxruntime-web": "onnxruntime-web "}


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("roofline")
    shared = {"models": ["llama-tiny"], "modes": ["generate"], "new_tokens": TOKENS, "depths": DEPTHS,
              "sequence_lengths": [8], "iterations": 2, "warmup": 0, "min_duration_s": 0.0,
              "db_path": out / "r.duckdb"}  # fmt: skip
    native = BenchmarkRequest(hardware=["cpu"], engines=["onnxruntime", "torch"], output_dir=out / "reports", **shared)
    with pytest.MonkeyPatch.context() as patch:  # conftest makes --no-ceilings the suite's default
        patch.delenv("ACCELHARNESS_NO_CEILINGS")
        patch.delenv("ACCELHARNESS_NO_BANDWIDTH_LARGE")  # and bandwidth_large, natively and in the page
        summary = run_both(native, WebRequest(hardware=["wasm"], output_dir=None, **shared))
    assert summary.counts == {"ok": 6}, summary
    with open_store(out / "r.duckdb", read_only=True) as store:
        rows = [r | {"details": json.loads(r["details"])} for r in store.results(summary.run_id)]
        ceilings = store.ceilings(summary.run_id)
    bundle = out / "run.bundle"
    export_bundle(out / "r.duckdb", bundle)
    return {"run_id": summary.run_id, "rows": rows, "ceilings": ceilings, "out": out, "bundle": bundle}


def ceiling(measured: dict[str, Any], row: dict[str, Any], kind: str, precision: str) -> dict[str, Any]:
    return next(c for c in measured["ceilings"] if (c["hardware"], c["engine"], c["kind"], c["precision"]) ==
                (row["hardware"], row["engine"], kind, precision))  # fmt: skip


def test_each_target_has_its_ceilings_measured_through_its_own_engine(measured: dict[str, Any]) -> None:
    found = {(c["hardware"], c["engine"], c["kind"], c["precision"]) for c in measured["ceilings"]}
    kinds = (("bandwidth", "bytes"), ("bandwidth_large", "bytes"), ("compute", "fp32"))
    assert found == {(*t, kind, cls) for t in TARGETS for kind, cls in kinds}
    for c in measured["ceilings"]:  # the figure is its samples' (harness.core.roofline), nothing looked up
        if c["kind"] == "bandwidth_large" and c["value"] is None:  # a loaded machine's rate: skipped, saying why
            assert c["error"].startswith("not measured: at the rate of the bandwidth ceiling's"), c["error"]
            continue
        assert c["error"] is None and c["iterations"] == len(c["samples_ms"]) >= 3 and not c["software_adapter"]
        assert (c["value"], c["spread"]) == pytest.approx(ceiling_figures(c["amount"], c["samples_ms"]))
        assert c["value"] > 0 and c["spread"] >= 0
        # sized by time (harness.run.ceilings.Sizing), natively and by the page's own loop, and saying so
        assert c["budget_ms"] == CEILING_BUDGET_MS and f"measured {c['workload']}" in c["sizing"]
        assert c["reused_from"] is None and c["calibration_s"] > 0
        assert SOFTWARE[c["engine"]] in c["software"], c["software"]
    large = {(c["workload"], c["sizing"].split(":")[0]) for c in measured["ceilings"] if c["kind"] == "bandwidth_large"}
    assert large == {("bandwidth-expand-add-256mib", "not probed")}  # sized at the bandwidth ceiling's rate
    # (on a machine so loaded that a target's bandwidth_large run would pass 4 budgets, that target skips it: above)


def test_every_generate_row_has_its_work_and_comes_within_its_ceilings(measured: dict[str, Any]) -> None:
    for row in measured["rows"]:
        bandwidth, compute = ceiling(measured, row, "bandwidth", "bytes"), ceiling(measured, row, "compute", "fp32")
        assert row["bytes_per_token"] > row["details"]["kv_bytes_per_step"] > 0  # weights + the KV cache it reads
        assert row["flops_per_token"] > 0 and row["prefill_flops_per_token"] > 0
        assert row["achieved_gbps"] == pytest.approx(row["bytes_per_token"] * row["decode_tokens_per_s"] / 1e9)
        assert row["bandwidth_fraction"] == pytest.approx(row["achieved_gbps"] / bandwidth["value"])
        assert row["compute_fraction"] == pytest.approx(row["achieved_gflops"] / compute["value"])
        # never above the ceiling by more than the ceiling's own spread
        assert 0 < row["bandwidth_fraction"] <= 1 + bandwidth["spread"]
        assert 0 < row["compute_fraction"] <= 1 + compute["spread"]


def test_each_depth_is_a_row_of_its_own_labelled_as_llama_bench_does(measured: dict[str, Any]) -> None:
    rows = measured["rows"]
    labels = {(r["hardware"], case_label(r)) for r in rows}
    assert labels == {(h, f"b1 s8 tg{TOKENS} @ d{d}") for h, _ in TARGETS for d in DEPTHS}
    assert len({r["result_key"] for r in rows}) == 6  # depth is part of the key (--resume)
    deeper = [r for r in rows if r["depth"] == DEPTHS[1]]
    assert deeper[0]["bytes_per_token"] > next(r for r in rows if r["depth"] == 0)["bytes_per_token"]
    # the page fills the cache as native ORT does: its tokens at depth 8 are native ORT's at depth 8
    native, page = (next(r for r in deeper if r["engine"] == e) for e in ("onnxruntime", "onnxruntime-web"))
    assert page["generated_tokens"] == native["generated_tokens"] and page["tokens_matched"] == TOKENS
    # torch fills its own cache alike: its tokens there too, checked on the fp32 export teacher-forced after the fill
    torch_row = next(r for r in deeper if r["engine"] == "torch")
    assert torch_row["generated_tokens"] == native["generated_tokens"] and torch_row["tokens_matched"] == TOKENS
    assert torch_row["details"]["token_parity"].startswith(f"all {TOKENS} tokens")
    assert torch_row["agreement_top1"] == 1.0 and torch_row["details"]["first_divergence"] is None


def test_the_html_report_draws_a_roofline_per_target(measured: dict[str, Any]) -> None:
    html = (measured["out"] / "reports" / f"{measured['run_id']}.html").read_text()
    section = html[html.index("Against the limit") :]
    assert "of bandwidth" in section and section.count("<figure><svg") == 3


def test_a_depth_past_the_model_context_is_refused_before_anything_runs(tmp_path: Path) -> None:
    db = tmp_path / "d.duckdb"
    generate = ["native", "--model", "llama-tiny", "--mode", "generate"]
    done = run_cli_process(*generate, "--depths", "0,2040", "--db", str(db))
    assert done.returncode == 2 and "a depth of 2040 (--depths)" in done.stderr and "2048 positions" in done.stderr
    assert "Traceback" not in done.stderr and not db.exists()


def test_a_bundle_s_ceilings_travel_and_its_figures_are_recomputed(measured: dict[str, Any], tmp_path: Path) -> None:
    import_bundles(tmp_path / "home.duckdb", [measured["bundle"]])
    with open_store(tmp_path / "home.duckdb", read_only=True) as store:
        assert len(store.ceilings(measured["run_id"])) == len(measured["ceilings"])
    planted = {
        "a fraction": ("results", "bandwidth_fraction", 0.999, "column bandwidth_fraction"),
        "a ceiling's value": ("ceilings", "value", 1e6, "column value"),
        "a ceiling's spread": ("ceilings", "spread", 0.0001, "column spread"),
        "an unknown kind": ("ceilings", "kind", "latency", "column kind"),
        "an unknown class": ("ceilings", "precision", "fp64", "column precision"),
        "no work": ("ceilings", "amount", 0.0, "column amount"),
        "more runs than samples": ("ceilings", "iterations", 99, "column samples_ms"),
        "a negative depth": ("results", "depth", -1, "column depth"),
        "negative bytes": ("results", "bytes_per_token", -1.0, "column bytes_per_token"),
    }
    for name, (table, column, value, needle) in planted.items():

        def plant(tables: Any, table: str = table, column: str = column, value: Any = value) -> None:
            set_cell(tables, table, column, 0, value)

        forged = craft(measured["bundle"], tmp_path / f"{column}.bundle", plant)
        with pytest.raises(BundleError, match=needle):
            import_bundles(tmp_path / f"{column}.duckdb", [forged])
        assert not (tmp_path / f"{column}.duckdb").exists(), name


def test_weights_are_counted_by_the_type_a_forward_reads_them_in(tmp_path: Path) -> None:
    """int4 blocks with their scales, fp32 left by a conversion (an output layer), a lookup table not at all."""
    from onnx import TensorProto, helper, numpy_helper, save

    table = numpy_helper.from_array(np.zeros((100, 8), np.float32), "table")
    blocks = numpy_helper.from_array(np.zeros((8, 1, 16), np.uint8), "blocks")
    scales = numpy_helper.from_array(np.zeros(8, np.float32), "scales")
    head = numpy_helper.from_array(np.zeros((8, 100), np.float32), "head")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["x"]),
             helper.make_node("MatMulNBits", ["x", "blocks", "scales"], ["h"], domain="com.microsoft", K=8, N=8,
                              bits=4, block_size=32),
             helper.make_node("MatMul", ["h", "head"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 100])],
                              [table, blocks, scales, head])  # fmt: skip
    save(helper.make_model(graph), tmp_path / "g.onnx")
    assert weight_bytes(tmp_path / "g.onnx") == {"int4": 8 * 16 + 8 * 4, "fp32": 8 * 100 * 4}
