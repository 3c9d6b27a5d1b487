"""A speech row's word error rate read back from a real DuckDB store (issue 45): `recommend --mode generate
--max-wer X` leaves out the rows above X and those without a WER, each listed with why, and `compare` shows each
side's WER beside its real-time factor. Rows are written through the store's own writer; nothing is run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from harness.core.records import Case, Result, Target
from harness.store import open_store

CASE = Case(1, 8, "fp32", "generate", 4, 0)
NATIVE = Target("cpu", "onnxruntime", "CPUExecutionProvider")
TORCH = Target("cpu", "torch", "cpu")
WASM = Target("wasm", "onnxruntime-web", "wasm:threads=1")


def _row(target: Target, wer: float | None, tg_ms: float, tokens: list[int], model: str = "whisper-x") -> Result:
    details = {"wer": wer, "audio_seconds": 30.0, "real_time_factor": 30_000.0 / (10 + 4 * tg_ms)}
    if wer is None:
        details["wer_not_measured"] = "no decoded text (details.output_text says why)"
    return Result(model=model, family="audio", weights="random", target=target, case=CASE, status="ok",
                  samples_ms=[10 + 4 * tg_ms] * 5, ttft_samples_ms=[10.0] * 5, step_samples_ms=[[tg_ms] * 3] * 5,
                  tpot_samples_ms=[tg_ms] * 5, generated_tokens=[tokens], output_text="some words",
                  details=details)  # fmt: skip


def _store(db: Path, rows: list[Result]) -> str:
    with open_store(db) as store:
        run_id = store.start_run("test", {}, {"git_sha": "abc"})
        for row in rows:
            store.add_result(run_id, row, "abc")
        store.finish_run(run_id, "completed")
    return run_id


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Native ORT WER 0.25 (the fastest decode), torch the same tokens and WER, the page a token off (WER 1.5,
    more words than said) and a row with no text: its WER not measured."""
    path = tmp_path / "s.duckdb"
    untexted = _row(Target("cpu", "openvino", "CPU"), None, 3.0, [])
    _store(path, [_row(NATIVE, 0.25, 2.0, [1, 2, 3, 4]), _row(TORCH, 0.25, 4.0, [1, 2, 3, 4]),
                  _row(WASM, 1.5, 1.0, [1, 2, 3, 5]), untexted])  # fmt: skip
    return path


def test_recommend_leaves_out_the_rows_above_the_wer_and_says_why(db: Path) -> None:
    from harness.analysis.recommend import fastest_generation, within_wer

    choice = fastest_generation(db, "whisper-x", 1)
    assert choice.ranked[0]["engine"] == "onnxruntime-web"  # the fastest, without a floor
    within_wer(choice, 0.3)
    assert [(r["engine"], r["wer"]) for r in choice.ranked] == [("onnxruntime", 0.25), ("torch", 0.25)]
    assert any(line.endswith("WER 1.500 above 0.3") and line.startswith("wasm/") for line in choice.excluded)
    assert any("its WER was not measured (no decoded text" in line for line in choice.excluded)
    shown = run_cli("recommend", "--mode", "generate", "--model", "whisper-x", "--max-wer", "0.3", "--db", str(db))
    said = " ".join(shown.stdout.split())
    assert shown.returncode == 0 and "WER <= 0.3" in said and "WER 1.500 above 0.3" in said, shown.stderr
    for value, why in {"-1": "--max-wer takes a word error rate of 0 or more", "nan": "of 0 or more"}.items():
        refused = run_cli("recommend", "--mode", "generate", "--model", "whisper-x", "--max-wer", value, "--db",
                          str(db))  # fmt: skip
        assert refused.returncode == 2 and why in refused.stderr and "Traceback" not in refused.stderr
    refused = run_cli("recommend", "--model", "whisper-x", "--max-wer", "0.3", "--db", str(db))  # --mode inference
    assert refused.returncode == 2 and "--max-wer ranks a speech model's generate targets" in refused.stderr


def test_compare_shows_each_sides_wer_beside_its_real_time_factor(db: Path) -> None:
    """Run B's page row writes other tokens (WER 1.5 → 0.25): the comparison shows both WERs and notes the change."""
    from harness.analysis.compare import compare_runs, comparison_table

    with open_store(db, read_only=True) as store:
        run_a = store.resolve_run("latest")
    _store(db, [_row(WASM, 0.25, 1.0, [1, 2, 3, 4])])
    comparison = compare_runs(db, run_a, "latest")
    table = comparison_table(comparison)
    assert table.columns[-6:] == ["rtf_a", "rtf_b", "wer_a", "wer_b", "verdict", "note"]
    page = next(r for r in comparison.rows if r.engine == "onnxruntime-web")
    assert (page.wer_a, page.wer_b) == (1.5, 0.25) and page.rtf_a == pytest.approx(30_000.0 / 14)
    assert "WER 1.500 → 0.250" in page.note
