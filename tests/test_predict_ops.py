"""`predict` from operators on a real profiled store: three tiny encoders profiled on ORT CPU through
the CLI, then a prediction for an ONNX file that was never measured, and `predict --evaluate`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import QUICK, run_cli, run_cli_process
from tiny_prepared import prepared

from harness.analysis.predict_model import compare_methods
from harness.store import open_store

PROFILED = ("bert-tiny", "distilbert-tiny", "roberta-tiny")
TARGET = "cpu/onnxruntime:CPUExecutionProvider"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 profiled results (3 models x 2 batches x 2 sequence lengths) and the target's ceilings (about a second of
    calibration; conftest turns ceilings off elsewhere): enough for every method, the demo's roofline too."""
    directory = tmp_path_factory.mktemp("predict-ops")
    db = directory / "p.duckdb"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("ACCELHARNESS_NO_CEILINGS")
        done = run_cli(
            "native", "--model", ",".join(PROFILED), "--engines", "onnxruntime", "--hardware", "cpu",
            "--batch-sizes", "1,2", "--sequence-lengths", "8,16", *QUICK, "--profile",
            "--db", str(db), "--no-reports", "--output-dir", str(directory / "out"),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return db


def test_unmeasured_onnx_file_is_predicted_from_its_operators(profiled: Path) -> None:
    """An .onnx file no run has seen (gpt2-tiny's export) is counted, not run, and predicted by operators
    on the profiled target, at each asked case, with the method and its held-out error named; without --method
    the target takes whichever method's held-out error is lowest (issue 46)."""
    onnx_file = prepared("gpt2-tiny").onnx_path
    assert onnx_file is not None
    ask = ("predict", "--model-path", str(onnx_file), "--batch-sizes", "1,4", "--sequence-lengths", "16")
    done = run_cli(*ask, "--method", "operators", "--db", str(profiled), "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout[done.stdout.index("{") :])
    rows = found["rows"]
    assert [(r["batch_size"], r["seq_len"]) for r in rows] == [(1, 16), (4, 16)]
    assert {f"{r['hardware']}/{r['engine']}:{r['provider']}" for r in rows} == {TARGET}
    assert all(r["method"] == "operators" and r["held_out_mape"] is not None for r in rows)
    assert 0 < rows[0]["predicted_latency_p50_ms"] < rows[1]["predicted_latency_p50_ms"]  # 4x the work
    assert "operators" in found["methods"]
    best = run_cli(*ask, "--db", str(profiled), "--json")
    assert best.returncode == 0, best.stderr
    chosen = json.loads(best.stdout[best.stdout.index("{") :])["rows"]
    assert len({r["method"] for r in chosen}) == 1 and chosen[0]["held_out_mape"] <= rows[0]["held_out_mape"]
    table = run_cli("predict", "--model-path", str(onnx_file), "--method", "operators", "--db", str(profiled))
    assert table.returncode == 0, table.stderr
    assert "operators" in table.stdout and "predictions, not measurements" in table.stdout


def test_evaluate_prints_both_methods_held_out_error(profiled: Path) -> None:
    """--evaluate scores each method by leave-one-model-out on the same profiled results, per target."""
    (errors,) = compare_methods(profiled)
    assert errors.rows == 12 and errors.models == 3
    assert errors.operators is not None and errors.log_linear is not None
    done = run_cli_process("predict", "--evaluate", "--db", str(profiled))
    assert done.returncode == 0, done.stderr
    assert f"{errors.operators:.1%}" in done.stdout and f"{errors.log_linear:.1%}" in done.stdout
    refused = run_cli("predict", "--evaluate", "--model", "bert-tiny", "--db", str(profiled))
    assert refused.returncode == 2 and "takes no --model" in refused.stderr


def demo_predict_options() -> list[str]:
    """The options `make demo` gives `predict` after its model and cases, with the Makefile's variables."""
    makefile = (Path(__file__).parents[1] / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^(\w+) \?= (\S+)$", makefile, re.MULTILINE))
    (line,) = [line for line in makefile.splitlines() if "accelharness predict" in line]
    options = line[line.index("--method") : line.index("--db")].split()
    return [re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], option) for option in options]


def test_the_demo_prediction_names_the_roofline_and_its_error_or_refuses_in_one_line(
    profiled: Path, tmp_path: Path
) -> None:
    """predict as `make demo` calls it (by the roofline, within the demo's error bound), on a profiled store with
    ceilings: a table whose rows name the roofline and its held-out error; or, when no row is believable, exactly
    one line saying why. A bound no error meets and a store without profiles both give that line (the operator
    method asked for); bad values of the options exit 2."""
    options = demo_predict_options()
    assert options[:2] == ["--method", "roofline"] and options[2:] == ["--max-error", "30%"], options
    ask = ("predict", "--model", "gpt2-tiny", "--batch-sizes", "1", "--sequence-lengths", "16")
    done = run_cli(*ask, *options, "--db", str(profiled))
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.strip().splitlines() if not line.startswith("counting gpt2-tiny's graph")]
    if said[0].startswith("no prediction for gpt2-tiny"):
        assert len(said) == 1 and "held-out error" in said[0], said
    else:
        shown = done.stdout.replace("\n", " ")
        assert re.search(rf"{TARGET[:20]}.*roofline.*\d+\.\d%", shown) and "operators" not in shown, done.stdout
    strict = run_cli(*ask, "--method", "operators", "--max-error", "0.0001", "--db", str(profiled))
    assert strict.returncode == 0, strict.stderr
    (line,) = [line for line in strict.stdout.strip().splitlines() if not line.startswith("counting")]
    assert line.startswith("no prediction for gpt2-tiny worth acting on here: ") and "is above 0%" in line
    empty = tmp_path / "empty.duckdb"
    with open_store(empty):
        pass
    unprofiled = run_cli("predict", "--model", "bert-tiny", "--method", "operators", "--db", str(empty))
    assert unprofiled.stdout.strip() == (
        "no prediction for bert-tiny worth acting on here: no target here has operator profiles of 2+ models "
        "at fp32 (run with --profile)"
    )
    for bad in (["--method", "best"], ["--max-error", "2"], ["--max-error", "much"]):
        refused = run_cli(*ask, *bad, "--db", str(profiled))
        assert refused.returncode == 2 and bad[0] in refused.stderr, refused.stderr
