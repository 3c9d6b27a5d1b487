"""The runtimes people ship in the browser, side by side and checked (issue 43): one real run of llama-tiny natively
(ONNX Runtime, llama.cpp on the GGUF the harness wrote of the same weights) and in Chromium through three page
runtimes (our own loop over onnxruntime-web, transformers.js on the same graph laid out as its folder, llama.cpp
through wllama on the same GGUF) at 1 and 2 wasm threads; each row timed, its threads read back, its runtime's
version said, its tokens checked, and one report ranking them. Then a page runtime that hangs: its row a timeout
within the job's limit, and the run goes on. (The planted-weight mismatch of each runtime: test_token_checks.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import run_cli
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.browser.both import native_beside
from harness.browser.execute import run_web
from harness.browser.run import WebRequest
from harness.native import DEFAULT_ENGINES
from harness.run.plan import BenchmarkRequest
from harness.web import runtime_dist

pytestmark = [
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium"),
    pytest.mark.skipif(any(runtime_dist.problem(r) for r in ("transformers.js", "llama.cpp")),
                       reason="the page runtimes' npm files are not installed (make setup)"),
    pytest.mark.skipif(shutil.which("node") is None, reason="native llama.cpp runs in node"),
]  # fmt: skip
QUICK = ("--iterations", "2", "--warmup", "0", "--min-duration", "0", "--new-tokens", "6", "--sequence-lengths", "8")
RUNTIMES = ("onnxruntime-web", "transformers.js", "llama.cpp")


def rows_of(db: Path) -> list[dict[str, Any]]:
    with duckdb.connect(str(db), read_only=True) as connection:
        cursor = connection.execute("SELECT * FROM results")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) | {"details": json.loads(row[names.index("details")])}
                for row in cursor.fetchall()]  # fmt: skip


@pytest.fixture(scope="module")
def side_by_side(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:  # noqa: F811
    out = tmp_path_factory.mktemp("runtimes")
    db = out / "r.duckdb"
    done = run_cli("run", "--mode", "generate", "--model", "llama-tiny", "--hardware", "cpu", "--web-hardware",
                   "wasm", "--threads", "1,2", "--web-runtimes", ",".join(RUNTIMES), "--engines",
                   "onnxruntime,llama.cpp", "--native-threads", "1", "--no-ceilings", *QUICK, "--db", str(db),
                   "--output-dir", str(out / "reports"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {(r["hardware"], r["engine"], r["provider"]): r for r in rows_of(db)}
    return rows, out / "reports"


def test_every_runtime_is_timed_threads_read_back_and_tokens_checked(side_by_side: tuple) -> None:
    rows, _ = side_by_side
    for runtime in RUNTIMES:
        for threads in (1, 2):
            row = rows["wasm", runtime, f"wasm:threads={threads}"]
            details = row["details"]
            assert row["status"] == "ok", row["error"]
            assert row["decode_tokens_per_s"] > 0 and row["ttft_ms"] > 0 and row["prefill_tokens_per_s"] > 0
            assert details["threads_effective"] == threads  # read back from the runtime
            assert details["token_parity"].startswith("all 6 tokens"), details["token_parity"]
            assert details["step_logit_max_diff"] <= details["step_logit_tolerance"][0]  # the top-k compared too
            if runtime != "onnxruntime-web":  # the version the page read, of the package served
                assert details["page_runtime_version"] in runtime_dist.versions(runtime).values()
    tjs = rows["wasm", "transformers.js", "wasm:threads=1"]["details"]
    assert tjs["runtime"]["ort_web_version"] and tjs["runtime"]["pipeline"] == "text-generation"
    assert tjs["runtime"]["prompt"]["pipeline_ids_equal"] is True and tjs["tokenizer_served"].startswith("synthetic")
    assert rows["wasm", "llama.cpp", "wasm:threads=1"]["details"]["model_file"].endswith(".gguf")


def test_run_adds_a_page_runtimes_native_build_to_the_default_engines() -> None:
    web = WebRequest(runtimes=list(RUNTIMES))
    assert native_beside(BenchmarkRequest(), web).engines == [*DEFAULT_ENGINES, "llama.cpp"]
    assert native_beside(BenchmarkRequest(engines=["onnxruntime"]), web).engines == ["onnxruntime"]  # as named
    assert native_beside(BenchmarkRequest(), WebRequest()).engines is None


def test_native_llama_cpp_runs_the_same_gguf_beside_it(side_by_side: tuple) -> None:
    rows, _ = side_by_side
    native = rows["cpu", "llama.cpp", "cpu:threads=1"]
    page = rows["wasm", "llama.cpp", "wasm:threads=1"]
    assert native["status"] == "ok" and native["details"]["native_threads"] == 1
    assert (
        native["generated_tokens"]
        == page["generated_tokens"]
        == rows["cpu", "onnxruntime", "CPUExecutionProvider:threads=1"]["generated_tokens"]
    )
    assert native["details"]["model_file"] == page["details"]["model_file"]


def test_one_report_ranks_them(side_by_side: tuple) -> None:
    _, reports = side_by_side
    markdown = next(p for p in reports.glob("*.md") if p.name != "compatibility_matrix.md").read_text()
    ranking = markdown.split("## Which runtime?")[1].split("\n## ")[0]
    for runtime in RUNTIMES:
        assert f"wasm/{runtime}:wasm:threads=2" in ranking
    assert "cpu/llama.cpp" in ranking and "= native ORT (6/6 equal)" in ranking


def test_a_hung_page_runtime_is_a_timeout_and_the_run_goes_on(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    request = WebRequest(models=["llama-tiny"], hardware=["wasm"], runtimes=["transformers.js", "llama.cpp"],
                         modes=["generate"], new_tokens=4, sequence_lengths=[8], iterations=2, warmup=0,
                         min_duration_s=0, timeout_s=20, no_ceilings=True, db_path=tmp_path / "h.duckdb",
                         output_dir=None)  # fmt: skip
    summary = run_web(request, faults={"transformers.js/wasm:threads=1": "hang"})
    assert summary.counts == {"timeout": 1, "ok": 1}
    rows = {r["engine"]: r for r in rows_of(request.db_path)}
    assert rows["transformers.js"]["status"] == "timeout" and rows["llama.cpp"]["status"] == "ok"


@pytest.mark.slow  # ~25 s: a run of its own (the cheap check: test_which_page_runtimes_run_at_a_depth)
def test_llama_cpp_in_the_page_fills_its_cache_to_a_depth_untimed(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """--depths 16 through wllama: the filler cached untimed (llama.cpp's own timings say it reused exactly the
    filler and processed exactly the prompt), its top-8 log-probabilities checked against native ORT after the same
    filler (checked from an empty cache instead, they are 500x further apart: the check sees a wrong depth);
    transformers.js fills a DynamicCache untimed and generates after it, checked on its graph after the same filler."""
    db = tmp_path / "d.duckdb"
    done = run_cli("web", "--mode", "generate", "--model", "llama-tiny", "--hardware", "wasm", "--threads", "1",
                   "--runtimes", "llama.cpp,transformers.js", "--depths", "16", "--no-ceilings", *QUICK, "--db",
                   str(db), "--no-reports")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["engine"]: r for r in rows_of(db)}
    deep = rows["llama.cpp"]
    assert deep["status"] == "ok" and deep["depth"] == 16, deep["error"]
    timings = deep["details"]["runtime"]["llama_cpp_timings"]
    assert (timings["cache_n"], timings["prompt_n"]) == (16, 8), timings
    assert deep["details"]["step_logit_max_diff"] <= deep["details"]["step_logit_tolerance"][0]
    tjs = rows["transformers.js"]
    assert tjs["status"] == "ok" and tjs["depth"] == 16, tjs["error"]
    assert tjs["details"]["runtime"]["depth_fill"]["cache_length"] == 16
    assert tjs["details"]["step_logit_max_diff"] <= tjs["details"]["step_logit_tolerance"][0]


@pytest.mark.slow  # ~10 s: a run of its own (the cheap check: test_which_page_runtimes_run_at_a_depth)
def test_transformers_js_filled_with_another_filler_is_a_mismatch(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """Planted: transformers.js's cache filled with the filler reversed (the same 16 tokens, another order): its
    logits after it are checked against native ORT's after the harness's filler, and the row is a mismatch."""
    request = WebRequest(models=["llama-tiny"], hardware=["wasm"], runtimes=["transformers.js"], modes=["generate"],
                         new_tokens=6, sequence_lengths=[8], depths=[16], iterations=2, warmup=0, min_duration_s=0,
                         no_ceilings=True, db_path=tmp_path / "f.duckdb", output_dir=None)  # fmt: skip
    summary = run_web(request, faults={"transformers.js/wasm:threads=1": "tjs_wrong_filler"})
    assert summary.counts == {"mismatch": 1}
    row = rows_of(request.db_path)[0]
    assert row["details"]["step_logit_max_diff"] > 10 * row["details"]["step_logit_tolerance"][0]


def test_which_page_runtimes_run_at_a_depth() -> None:
    """Which page runtime runs a case at --depths, decided before any page opens: llama.cpp on the fp32 GGUF of the
    model's weights, transformers.js's text generation on wasm (each checked after the same filler), nothing else,
    each refusal saying why."""
    from types import SimpleNamespace

    from harness.browser.runtimes import _depth_refusal

    def why(runtime: str, precision: str = "fp32", gguf_given: bool = False, ep: str = "wasm",
            speech: bool = False) -> str | None:  # fmt: skip
        prepared = SimpleNamespace(spec=SimpleNamespace(is_gguf_file=gguf_given, is_encoder_decoder=speech))
        return _depth_refusal(prepared, runtime, SimpleNamespace(depth=64, precision=precision), ep)  # type: ignore[arg-type]

    assert why("llama.cpp") is None and why("transformers.js") is None and why("transformers.js", "q4") is None
    assert "fp32 GGUF" in str(why("llama.cpp", "q4")) and "fp32 GGUF" in str(why("llama.cpp", gguf_given=True))
    assert "on wasm only" in str(why("transformers.js", ep="webgpu"))
    assert "speech pipeline" in str(why("transformers.js", speech=True)) and why("webllm") is not None
