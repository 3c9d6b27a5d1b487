"""Issue 25 items 0-2: the precision that ran read from the engine, q4 / q4f16 natively and in the page,
and ONNX files with external data, on real ONNX Runtime, OpenVINO and Chromium (tiny graphs built here)."""

from __future__ import annotations

import json
import platform
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from int4_models import matmul_model

from harness.browser.execute import run_web
from harness.browser.run import WebRequest
from harness.core.labels import marks
from harness.core.parity import TOLERANCES
from harness.native.base import LoadRequest
from harness.prepare.specs import spec_from_path
from harness.run.native import BenchmarkRequest, run_native
from harness.store import open_store

CHROMIUM = Path("/usr/lib/chromium/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's Chromium at /usr/lib/chromium")
QUICK = {
    "iterations": 3,
    "min_duration_s": 0.0,
    "warmup": 0,
    "max_iterations": 50,
    "output_dir": None,
    "timeout_s": 120,
}


def rows_of(db: Path) -> list[dict[str, Any]]:
    """Every run's results (a native run, then a web run, in one store)."""
    with open_store(db, read_only=True) as store:
        runs = [run["run_id"] for run in store.query("SELECT run_id FROM runs ORDER BY started_at")]
        return [r | {"details": json.loads(r["details"])} for run_id in runs for r in store.results(run_id)]


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["engine"], r["requested_precision"]): r for r in rows}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ORT's CPU EP has fp16 MatMuls off x86")
def test_fp16_matmul_is_marked_as_computed_in_fp32_and_what_runs_as_asked_is_not(tmp_path: Path) -> None:
    """One fixed-shape MatMul: ORT's optimized fp16 graph casts the weights back (fp32 compute: marked);
    the int8 (MatMulInteger) and q4f16 (MatMulNBits on fp16 activations) copies compute as asked. The
    file's case is labelled by its real shape ([1, 64]: b1, no sequence) whatever sizes were asked."""
    model = matmul_model(tmp_path / "mm.onnx", widths=(64, 64), batch=1)
    request = BenchmarkRequest(model_path=model, engines=["onnxruntime"], hardware=["cpu"], batch_sizes=[4],
                               precision="fp16,int8,q4f16", db_path=tmp_path / "m.duckdb", **QUICK)  # fmt: skip
    run_native(request)
    rows = by_key(rows_of(request.db_path))
    fp16, int8, q4f16 = (rows["onnxruntime", p] for p in ("fp16", "int8", "q4f16"))
    assert all(r["status"] == "ok" for r in (fp16, int8, q4f16)), [r["error"] for r in rows.values()]
    assert (fp16["batch_size"], fp16["seq_len"]) == (1, None)
    assert fp16["details"]["compute_precision"] == {"fp32": 1}
    assert ("precision", "fp16 weights, fp32 compute: 1 of 1 MatMul") in marks(fp16)
    assert "optimized_model_filepath" in fp16["details"]["compute_precision_source"]
    assert int8["details"]["compute_precision"] == {"int8": 1} and not any(k == "precision" for k, _ in marks(int8))
    assert q4f16["details"]["compute_precision"] == {"fp16": 1} and not any(k == "precision" for k, _ in marks(q4f16))


def test_torch_has_no_int4_and_says_why() -> None:
    from harness.core.records import Target, UnsupportedError
    from harness.native.torch_backend import BACKEND
    from harness.prepare.specs import load_specs

    for precision in ("q4", "q4f16"):
        request = LoadRequest(load_specs()["bert-tiny"], None, precision, None)
        with pytest.raises(
            UnsupportedError, match=re.escape("int4 weight-only MatMuls (MatMulNBits) are an ONNX Runtime format")
        ):
            BACKEND.load(request, Target("cpu", "torch", "cpu"))


@needs_chromium
def test_q4_and_external_data_natively_and_in_the_page(tmp_path: Path) -> None:
    """An .onnx whose weights live in mm.onnx.data: fp32, q4 and q4f16 on ONNX Runtime, OpenVINO, wasm
    and webgpu (software here), int4 rows within the stated int4 tolerance, block size and symmetry recorded."""
    model = matmul_model(tmp_path / "mm.onnx", external=True)
    assert spec_from_path(model, None).case_shapes([2], [32]) == [(2, None)]
    db = tmp_path / "q4.duckdb"
    common = {"model_path": model, "batch_sizes": [2], "precision": "fp32,q4,q4f16", "db_path": db, **QUICK}
    run_native(BenchmarkRequest(engines=["onnxruntime", "openvino"], hardware=["cpu", "openvino"], **common))
    run_web(WebRequest(hardware=["wasm", "webgpu"], **common))
    native = by_key(rows_of(db))
    page = {(r["hardware"], r["requested_precision"]): r for r in rows_of(db) if r["engine"] == "onnxruntime-web"}
    int4_rows = [native["onnxruntime", "q4"], native["onnxruntime", "q4f16"], native["openvino", "q4"],
                 page["wasm", "q4"], page["wasm", "q4f16"], page["webgpu", "q4"]]  # fmt: skip
    for row in [native["onnxruntime", "fp32"], page["wasm", "fp32"], page["webgpu", "fp32"], *int4_rows]:
        assert row["status"] == "ok", (row["hardware"], row["requested_precision"], row["error"])
    for row in int4_rows:
        assert row["precision"] == row["requested_precision"]
        assert row["details"]["parity_tolerance"] >= TOLERANCES["q4"][0]
        assert row["max_abs_diff"] <= row["details"]["parity_tolerance"]
        assert row["max_abs_diff"] > 1e-4  # int4 weights really ran: not the fp32 file
        assert (row["details"]["block_size"], row["details"]["is_symmetric"]) == (32, True)
        assert "MatMulNBitsQuantizer" in row["details"]["conversion"]
    assert native["onnxruntime", "q4"]["details"]["compute_precision"] == {"fp32": 3}
    openvino = native["openvino", "q4"]["details"]  # the execution graph's FullyConnected layers
    assert (
        sum(openvino["compute_precision"].values()) == 3 and "get_runtime_model" in openvino["compute_precision_source"]
    )
    assert page["wasm", "fp32"]["details"]["model_bytes"] > (64 * 256 + 256 * 256 + 256 * 64) * 4  # data file counted
    webgpu_q4f16 = page["webgpu", "q4f16"]
    if "shader-f16" not in (webgpu_q4f16["details"].get("adapter_features") or []):
        assert webgpu_q4f16["status"] == "unsupported" and "shader-f16" in webgpu_q4f16["error"]


@needs_chromium
def test_a_truncated_external_data_file_is_an_error_row_not_a_hang(tmp_path: Path) -> None:
    model = matmul_model(tmp_path / "mm.onnx", external=True)
    data = tmp_path / "mm.onnx.data"
    data.write_bytes(data.read_bytes()[:100_000])
    db = tmp_path / "t.duckdb"
    common = {"model_path": model, "db_path": db, **QUICK}
    run_native(BenchmarkRequest(engines=["onnxruntime"], hardware=["cpu"], **common))
    run_web(WebRequest(hardware=["wasm"], **common))
    rows = {r["engine"]: r for r in rows_of(db)}
    assert rows["onnxruntime"]["status"] == "error" and "out of bounds" in rows["onnxruntime"]["error"]
    page = rows["onnxruntime-web"]
    assert page["status"] == "error"
    assert "external data file 'mm.onnx.data' is 100000 bytes" in page["error"] and "truncated" in page["error"]


@needs_chromium
def test_a_model_over_the_browsers_4_gib_is_refused_with_its_size(tmp_path: Path) -> None:
    """The data file grown (sparse) past wasm32's 4 GiB: the page is never handed it."""
    model = matmul_model(tmp_path / "mm.onnx", external=True)
    with (tmp_path / "mm.onnx.data").open("r+b") as data:
        data.truncate(4 * 2**30 + 2**20)
    request = WebRequest(model_path=model, hardware=["wasm"], db_path=tmp_path / "big.duckdb", **QUICK)
    run_web(request)
    (row,) = rows_of(request.db_path)
    assert row["status"] == "unsupported"
    assert "4.00 GiB" in row["error"] and "at most 4 GiB" in row["error"], row["error"]
    assert "ort_web_version" not in row["details"]  # no page ran


def test_a_model_file_is_keyed_by_its_external_data(tmp_path: Path) -> None:
    """Two models with the same graph file and different external data get different cached q4 copies
    and different reference outputs."""
    from harness.prepare.prepared import PrepareJob, prepare_model
    from harness.prepare.variants import precision_variant

    (tmp_path / "a").mkdir()
    first = matmul_model(tmp_path / "a" / "mm.onnx", external=True)
    second_dir = tmp_path / "b"
    shutil.copytree(tmp_path / "a", second_dir)
    with (second_dir / "mm.onnx.data").open("r+b") as data:  # other weights, same size
        data.write(b"\x00" * 1024)
    assert precision_variant(first, "q4").path != precision_variant(second_dir / "mm.onnx", "q4").path
    references = []
    for model in (first, second_dir / "mm.onnx"):
        prepared = next(prepare_model(PrepareJob(spec_from_path(model, None), [(2, None)])))
        references.append(prepared.load_case((2, None))[1][0])
    assert not (references[0] == references[1]).all()


def test_conversions_past_the_protobuf_limit_are_written_with_external_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the limit lowered to nothing, every converted copy keeps its weights in model.onnx.data and runs."""
    import numpy as np
    import onnxruntime as ort

    from harness.prepare import external
    from harness.prepare.variants import precision_variant

    monkeypatch.setattr(external, "EXTERNAL_ABOVE_BYTES", 0)
    model = matmul_model(tmp_path / "mm.onnx", external=True)
    feeds = {"x": np.ones((2, 64), dtype=np.float32)}
    (want,) = ort.InferenceSession(str(model)).run(None, feeds)
    for precision in ("fp16", "int8", "q4", "q4f16"):
        variant = precision_variant(model, precision).path
        assert external.external_locations(variant), precision
        assert external.external_data_problem(variant) is None
        (got,) = ort.InferenceSession(str(variant)).run(None, feeds)
        assert np.abs(got - want).max() <= 0.1 + 0.2 * np.abs(want).max(), precision
