"""Generation in the browser (web/page/generate.mjs) against the real thing: Chromium, onnxruntime-web 1.30,
native ONNX Runtime on the same `-past` graphs. Tiny models, a few tokens, two timed generations."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, run_cli_process
from test_web import SHELL_INSTALLED, stored, web_cache  # noqa: F401 (the session's export cache)

from harness.browser.both import run_both
from harness.browser.execute import run_web
from harness.browser.run import WebRequest, validate_web
from harness.prepare.prepared import PrepareJob, prepare_model
from harness.prepare.specs import load_specs
from harness.run.plan import BenchmarkRequest
from harness.run.recording import resume_point

pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
QUICK = {"iterations": 2, "min_duration_s": 0.0, "warmup": 0, "max_iterations": 10}
TOKENS = 6
GENERATE = {"modes": ["generate"], "new_tokens": TOKENS, "sequence_lengths": [8], **QUICK}


def results(db: Path) -> list[dict[str, Any]]:
    from harness.store import open_store

    with open_store(db, read_only=True) as store:
        run_id = store.resolve_run("latest")
        rows = store.results(run_id)
        return [r | {"details": json.loads(r["details"]), "steps": store.steps(r["result_id"])} for r in rows]


@pytest.fixture(scope="module")
def side_by_side(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:  # noqa: F811
    """gpt2-tiny and llama-tiny at batch 2: native ORT CPU and the browser's wasm, as one run."""
    out = tmp_path_factory.mktemp("generate")
    shared = {"models": ["gpt2-tiny", "llama-tiny"], "batch_sizes": [2], "db_path": out / "g.duckdb", **GENERATE}
    native = BenchmarkRequest(hardware=["cpu"], engines=["onnxruntime"], output_dir=out / "reports", **shared)
    summary = run_both(native, WebRequest(hardware=["wasm"], output_dir=None, **shared))
    assert summary.counts == {"ok": 4}, summary
    return results(out / "g.duckdb")


@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-tiny"])
def test_wasm_generates_the_tokens_native_ort_generates(side_by_side: list[dict[str, Any]], model: str) -> None:
    native, browser = (next(r for r in side_by_side if r["model"] == model and r["engine"] == e)
                       for e in ("onnxruntime", "onnxruntime-web"))  # fmt: skip
    tokens = json.loads(browser["generated_tokens"])
    assert len(tokens) == 2 and all(len(row) == TOKENS for row in tokens)
    assert tokens == json.loads(native["generated_tokens"])
    assert browser["tokens_matched"] == TOKENS and browser["status"] == "ok"
    assert browser["details"]["token_parity"].startswith(f"all {TOKENS} tokens")
    assert browser["max_abs_diff"] <= browser["details"]["parity_tolerance"]  # the prefill logits
    for row in (native, browser):  # the same figures on both sides, by phase, all measured
        assert row["ttft_ms"] > 0 and row["prefill_tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0
        assert 0 < row["tpot_ms"] <= row["tpot_p90_ms"] and row["tokens_per_s"] is None
        assert len(row["steps"]) == row["iterations"] == 2 and all(len(s) == TOKENS - 1 for s in row["steps"])
    if SHELL_INSTALLED:  # no page memory figure, and a wasm cache never reaches the GPU process: no verdict
        assert browser["details"]["memory_growth"].startswith("not measured: ")
        assert "page_memory_before_mb" not in browser["details"]
    else:
        assert browser["details"]["memory_growth_flag"] is False and browser["details"]["page_memory_before_mb"] > 0
    assert browser["details"]["output_locations"] == "cpu"  # wasm: every output on the CPU
    # issue 45: the page forces the passage on its own session; a genuine page's perplexity is native ORT's
    ppl = [row["details"]["perplexity"] for row in (native, browser)]
    assert ppl[1] == pytest.approx(ppl[0], rel=1e-6) and browser["details"]["passage_agreement_top1"] == 1.0


def test_the_reports_name_the_phase_of_every_rate(side_by_side: list[dict[str, Any]], tmp_path: Path) -> None:
    run_id = side_by_side[0]["run_id"]
    reports = next(p for p in Path(tmp_path).parent.glob("generate*/reports"))
    markdown = (reports / f"{run_id}.md").read_text()
    assert "pp tokens/s" in markdown and "tg tokens/s" in markdown and "| tokens/s |" not in markdown
    html = (reports / f"{run_id}.html").read_text()
    assert "Generation: gpt2-tiny" in html and "Generation: llama-tiny" in html and "tg tokens/s" in html
    assert 'aria-label="decode step time per generated position"' in html  # the step-time curve
    matrix = (reports / "compatibility_matrix.md").read_text()  # a generate column per browser EP
    assert "wasm/onnxruntime-web (generate)" in matrix and "cpu/onnxruntime (generate)" in matrix


@pytest.fixture(scope="module")
def webgpu_and_crash(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:  # noqa: F811
    """gpt2-tiny generating in the page's WebGPU and in two wasm settings, the first's page crashing: one run."""
    db = tmp_path_factory.mktemp("generate-faults") / "f.duckdb"
    request = WebRequest(models=["gpt2-tiny"], hardware=["webgpu", "wasm"], threads=[1, 2], db_path=db,
                         output_dir=None, **GENERATE)  # fmt: skip
    summary = run_web(request, faults={"wasm:threads=1": "throw"})
    assert summary.counts == {"error": 1, "ok": 2}
    return {r["provider"]: r for r in results(db)}


def test_webgpu_generates_on_swiftshader_and_says_it_is_software(webgpu_and_crash: dict[str, dict[str, Any]]) -> None:
    row = webgpu_and_crash["webgpu"]
    assert row["status"] == "ok", row["error"]
    assert row["details"]["adapter_class"] == "software" and row["details"]["fallback_adapter"] is True
    assert row["tokens_matched"] == TOKENS and row["decode_tokens_per_s"] > 0
    locations = row["details"]["output_locations"]  # present.* stay on the GPU, only logits come back
    assert locations["logits"] == "cpu" and set(locations.values()) == {"cpu", "gpu-buffer"}


@pytest.fixture(scope="module")
def resumed(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """An ONNX file with past inputs (gpt2-tiny's export with past, copied out of the cache) generating in the
    page at two prompt lengths, Ctrl-C once the first case is stored, then resumed: one run."""
    out = tmp_path_factory.mktemp("generate-resume")
    prepared = next(prepare_model(PrepareJob(load_specs()["gpt2-tiny"], [(1, 8)], with_past=True)))
    assert prepared.onnx_past_path is not None
    model = out / "decoder-with-past.onnx"
    shutil.copyfile(prepared.onnx_past_path, model)
    request = WebRequest(model_path=model, hardware=["wasm"], db_path=out / "r.duckdb", output_dir=None,
                         **GENERATE | {"sequence_lengths": [4, 8]})  # fmt: skip

    def interrupt(result: Any, result_id: str) -> None:
        raise KeyboardInterrupt  # Ctrl-C once the first case is stored

    with pytest.raises(KeyboardInterrupt):
        run_web(request, interrupt)
    plan = validate_web(request)
    run_id = resume_point(request.db_path, "web", asdict(request), [plan])
    left = plan.total_results
    ran: list[str] = []
    summary = run_web(request, lambda result, _: ran.append(result.key), plan, resume_run_id=run_id)
    return {"run_id": run_id, "left": left, "ran": ran, "counts": summary.counts, "rows": results(request.db_path)}


def test_an_onnx_file_with_past_inputs_generates(resumed: dict[str, Any]) -> None:
    assert resumed["counts"] == {"ok": 1}  # the resumed run's one case; the first was stored before Ctrl-C
    for row in resumed["rows"]:
        assert row["model"] == "decoder-with-past" and row["mode"] == "generate" and row["tokens_matched"] == TOKENS


def test_new_tokens_past_the_context_are_refused_before_anything_runs(tmp_path: Path) -> None:
    db = tmp_path / "refused.duckdb"
    done = run_cli_process("web", "--mode", "generate", "--model", "gpt2-tiny", "--hardware", "wasm",
                           "--sequence-lengths", "32", "--new-tokens", "1000", "--db", str(db))  # fmt: skip
    assert done.returncode == 2 and "gpt2-tiny takes 1024 positions" in done.stderr and not db.exists()
    done = run_cli("run", "--mode", "generate", "--model", "llama-tiny", "--hardware", "cpu",
                              "--web-hardware", "wasm", "--new-tokens", "100000", "--db", str(db))  # fmt: skip
    said = " ".join(done.stderr.split())  # the app's console wraps at the runner's width
    assert done.returncode == 2 and "--new-tokens takes a whole number from 1 to 4,096" in said and not db.exists()


def test_a_page_that_crashes_mid_generation_leaves_an_error_row_and_the_run_goes_on(
    webgpu_and_crash: dict[str, dict[str, Any]],
) -> None:
    assert "fault injected by the test suite" in webgpu_and_crash["wasm:threads=1"]["error"]
    assert webgpu_and_crash["wasm:threads=2"]["tokens_matched"] == TOKENS


def test_resume_runs_only_the_missing_generate_cases(resumed: dict[str, Any]) -> None:
    run_id = resumed["run_id"]
    assert run_id is not None and resumed["left"] == 1
    assert resumed["ran"] == ["decoder-with-past|wasm|onnxruntime-web|wasm:threads=1|b1_s8_fp32_gen6"]
    rows = resumed["rows"]
    assert sorted(r["seq_len"] for r in rows) == [4, 8] and {r["run_id"] for r in rows} == {run_id}
