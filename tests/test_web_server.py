"""The page server: token, closed file set, traversal, MIME types, COOP/COEP; the page-answer validator."""

from __future__ import annotations

import asyncio
import http.client
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from harness.web.answers import PageResultError, validate_page_result
from harness.web.page_job import GenerateJob, PageInput, PageJob, StopRule
from harness.web.server import PageServer


def _serve(isolate: bool) -> Iterator[PageServer]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = PageServer(isolate=isolate)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[PageServer]:
    yield from _serve(isolate=True)


def get(server: PageServer, path: str) -> http.client.HTTPResponse:
    """A GET with the path sent exactly as given (no client-side normalisation of ../ or %2e)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_binds_loopback_on_a_random_port(server: PageServer) -> None:
    assert server.port > 0
    assert server.page_url.startswith(f"http://127.0.0.1:{server.port}/{server.token}/")
    assert len(server.token) >= 24
    assert PageServer().token != server.token  # a fresh token per server (per run)


@pytest.mark.parametrize("path", ["/", "/page/index.html", "/nottoken/page/index.html", "/{t}x/page/index.html"])
def test_missing_or_wrong_token_is_403(server: PageServer, path: str) -> None:
    assert get(server, path.format(t=server.token)).status == 403


@pytest.mark.parametrize(
    "path",
    [
        "/{t}/page/../../server.py",
        "/{t}/page/..%2f..%2fserver.py",
        "/{t}/page/%2e%2e/%2e%2e/server.py",
        "/{t}/page/%252e%252e%252fserver.py",
        "/{t}/../{t}/page/index.html",
        "/{t}/ort/../page/index.html",
        "/{t}/ort/ort.wasm.min.mjs.map",  # in dist, but not a file the page needs
        "/{t}/ort/package.json",
        "/{t}/job/model.onnx",  # no job files yet
        "/{t}/elsewhere/index.html",
    ],
)
def test_outside_the_served_set_is_404(server: PageServer, path: str) -> None:
    assert get(server, path.format(t=server.token)).status == 404


@pytest.mark.parametrize(
    ("path", "mime"),
    [
        ("page/index.html", "text/html"),
        ("page/runner.mjs", "text/javascript"),
        ("ort/ort.wasm.min.mjs", "text/javascript"),
        ("ort/ort-wasm-simd-threaded.wasm", "application/wasm"),
        ("ort/ort-wasm-simd-threaded.jsep.wasm", "application/wasm"),
    ],
)
def test_serves_mime_types_and_isolation_headers(server: PageServer, path: str, mime: str) -> None:
    response = get(server, f"/{server.token}/{path}")
    assert response.status == 200
    assert response.getheader("Content-Type").split(";")[0] == mime
    assert response.getheader("Cross-Origin-Opener-Policy") == "same-origin"
    assert response.getheader("Cross-Origin-Embedder-Policy") == "require-corp"


def test_isolation_headers_on_refusals_too(server: PageServer) -> None:
    for response in (get(server, "/"), get(server, f"/{server.token}/nothing")):
        assert response.getheader("Cross-Origin-Opener-Policy") == "same-origin"
        assert response.getheader("Cross-Origin-Embedder-Policy") == "require-corp"


def test_job_files_are_served_then_replaced(server: PageServer, tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx bytes")
    urls = server.set_job_files({"m.onnx": model, "m.0.bin": b"\x01\x02"})
    assert set(urls) == {"m.onnx", "m.0.bin"}
    assert get(server, f"/{server.token}/job/m.onnx").status == 200
    assert get(server, f"/{server.token}/job/m.0.bin").status == 200
    server.set_job_files({"n.onnx": model})
    assert get(server, f"/{server.token}/job/m.onnx").status == 404  # only the current job's files
    with pytest.raises(ValueError):
        server.set_job_files({"../x": b""})


def test_without_isolation_no_coop_coep() -> None:
    for plain in _serve(isolate=False):
        response = get(plain, f"/{plain.token}/page/index.html")
        assert response.status == 200
        assert response.getheader("Cross-Origin-Opener-Policy") is None
        assert response.getheader("Cross-Origin-Embedder-Policy") is None


# --- the page-answer validator ------------------------------------------------------------------------

# A page job (harness.browser.run.page_job) whose stop rule gives at least 3 samples, at most 10; --timeout 60 s.
STOP = StopRule(warmup=1, iterations=3, min_duration_ms=0, max_iterations=10, min_iterations=3, max_time_ms=None)
JOB = PageJob("job/m.onnx", [PageInput("input_ids", "job/m.0.bin", "int64", [2, 8])], "wasm", 1, STOP, "b2_s8")
TIMEOUT_S = 60.0


def answer(**changes: object) -> dict:
    base = {
        "status": "ok",
        "samples_ms": [1.0, 2.0, 1.5],
        "first_run_ms": 5.0,
        "load_ms": 20.0,
        "outputs": [{"name": "y", "dtype": "float32", "dims": [1, 2], "data_b64": "AACAPwAAAEA="}],
        "facts": {},
    }
    return base | changes


def test_valid_answers_pass() -> None:
    assert validate_page_result(answer(), JOB, TIMEOUT_S)["samples_ms"] == [1.0, 2.0, 1.5]
    assert validate_page_result({"status": "unsupported", "error": "no WebNN", "facts": {}}, JOB, TIMEOUT_S)["status"]


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        answer(status="great"),
        answer(samples_ms=[]),
        answer(samples_ms=[1.0] * 11),  # more than max_iterations
        answer(samples_ms=[1.0, math.nan]),
        answer(samples_ms=[1.0, math.inf]),
        answer(samples_ms=[1.0, -2.0]),
        answer(samples_ms=[1.0, True]),
        answer(samples_ms=[1.0, "2"]),
        answer(first_run_ms=None),
        answer(load_ms=math.inf),
        answer(outputs=[]),
        answer(outputs=[{"name": "y", "dtype": "object", "dims": [1], "data_b64": ""}]),
        answer(outputs=[{"name": "y", "dtype": "float32", "dims": [-1], "data_b64": ""}]),
        {"status": "error", "facts": {}},  # no message
        {k: v for k, v in answer().items() if k != "facts"},
    ],
)
def test_malformed_answers_are_rejected(bad: object) -> None:
    with pytest.raises(PageResultError):
        validate_page_result(bad, JOB, TIMEOUT_S)


@pytest.mark.parametrize(
    ("samples", "first_run_ms", "where"),
    [([1.0, 0.0, 1.2], 5.0, "samples_ms[1]"), ([1.0] * 3, 0, "first_run_ms"), ([0.0] * 3, 0.0, "samples_ms[0]")],
)
def test_zero_ms_durations_are_a_timer_fault(samples: list, first_run_ms: float, where: str) -> None:
    """performance.now() that did not advance across a run measured nothing: the row is an error saying so."""
    bad = answer(samples_ms=samples, first_run_ms=first_run_ms, facts={"timer_resolution_ms": 0.1})
    with pytest.raises(PageResultError, match=rf"{re.escape(where)} is 0 ms: a timer fault.*its step: 0.1 ms"):
        validate_page_result(bad, JOB, TIMEOUT_S)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"samples_ms": [1e-300] * 3}, "samples_ms[0] is 1e-300 ms, less than one step of the page's timer (0.005 ms)"),
        ({"load_ms": 1e-9}, "load_ms is 1e-09 ms, less than one step"),
        (  # the page's own step, when coarser than the finest any browser has
            {"samples_ms": [1.0, 0.05, 1.0], "facts": {"timer_resolution_ms": 0.1}},
            "samples_ms[1] is 0.05 ms, less than one step of the page's timer (0.1 ms)",
        ),
        (  # a page claiming a finer step than any browser gives is held to 5 µs
            {"samples_ms": [1e-4] * 3, "facts": {"timer_resolution_ms": 1e-9}},
            "less than one step of the page's timer (0.005 ms)",
        ),
        ({"samples_ms": [1e300] * 3}, "samples_ms[0] is 1e+300 ms, longer than the job's --timeout (60 s)"),
        ({"first_run_ms": 61_000.0}, "first_run_ms is 61000 ms, longer than the job's --timeout (60 s)"),
        ({"samples_ms": [25_000.0] * 3}, "the first run and the timed samples together is 75005 ms, longer than"),
        ({"facts": {"fetch_ms": 1e300}}, "facts.fetch_ms is 1e+300 ms, longer than the job's --timeout"),
        ({"samples_ms": [1.0]}, "result has 1 samples; this job's stop rule gives 3..10"),
        ({"browser_memory": {"memory_peak_mb": 1.0}}, "result.browser_memory is measured by the harness"),
        ({"profile": {"events": []}}, "result.profile: this job asked for no profile"),
        ({"facts": {"page_memory": {"bytes": "many"}}}, "facts.page_memory must be null or an object whose sizes"),
        ({"facts": {"page_memory": {"bytes": 1e300}}}, "facts.page_memory must be null or an object whose sizes"),
    ],
)
def test_durations_the_page_clock_cannot_have_measured_are_refused(changes: dict, message: str) -> None:
    """Below the timer's step, past the job's --timeout, fewer samples than the stop rule gives, figures
    only the harness measures (issue 23, item 4)."""
    with pytest.raises(PageResultError, match=re.escape(message)):
        validate_page_result(answer(**changes), JOB, TIMEOUT_S)


def test_durations_the_page_clock_can_measure_pass() -> None:
    step = 100.005 - 100.0  # two 5 µs-clamped readings: a rounding error under 0.005
    assert step < 0.005
    fine = answer(samples_ms=[step, 1.0, 20_000.0], facts={"timer_resolution_ms": 0.005})
    assert validate_page_result(fine, JOB, TIMEOUT_S)["samples_ms"][0] == step
    budget = replace(JOB, stop=replace(STOP, iterations=20, max_time_ms=1000.0))  # stopped by its budget at 3
    assert len(validate_page_result(answer(), budget, TIMEOUT_S)["samples_ms"]) == 3
    error = {"status": "error", "error": "boom", "facts": {"runtime_init_ms": 0.0}}  # a runtime not started
    assert validate_page_result(error, JOB, TIMEOUT_S)["status"] == "error"


# web/page/tier.mjs's answer, as Chromium gives it (warm wasm 4.5 times faster than first-call wasm)
TIER = {"cold_ms": 0.69, "warm_ms": 0.152, "ratio": 4.54, "calls": 394, "iterations": 131072, "tiered": True,
        "budget_ms": 300, "elapsed_ms": 81.3, "rounds": 10}  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        ({"node_placement": {"CPUExecutionProvider": "many"}}, "facts.node_placement must be an object of node counts"),
        ({"node_placement": [3]}, "facts.node_placement must be an object of node counts"),
        ({"console_warnings": "[warn] x"}, "facts.console_warnings must be a list of strings"),
        ({"console_warnings": [1, 2]}, "facts.console_warnings must be a list of strings"),
        ({"wasm_files": None}, "facts.wasm_files must be a list of strings"),
        ({"threads_effective": "4"}, "facts.threads_effective must be an integer >= 0"),
        ({"threads_dropped": 0}, "facts.threads_dropped must be a boolean"),
        ({"adapter": "SwiftShader"}, "facts.adapter must be an object or null"),
        ({"device_probe": "no progress"}, "facts.device_probe must be an object or null"),
        ({"timer_resolution_ms": -1}, "facts.timer_resolution_ms must be a number > 0 and <= 1000"),
        ({"timer_resolution_ms": 1e300}, "facts.timer_resolution_ms must be a number > 0 and <= 1000"),
        ({"ort_web_version": 1.3}, "facts.ort_web_version must be a string or null"),
        ({"wasm_tier": "tiered"}, "facts.wasm_tier must be null or an object of cold_ms"),
        ({"wasm_tier": {**TIER, "ratio": float("nan")}}, "facts.wasm_tier must be null or an object of cold_ms"),
        ({"wasm_tier": {**TIER, "warm_ms": -1.0}}, "facts.wasm_tier must be null or an object of cold_ms"),
        ({"wasm_tier": {**TIER, "tiered": 1}}, "facts.wasm_tier must be null or an object of cold_ms"),
        ({"wasm_tier": {k: v for k, v in TIER.items() if k != "calls"}}, "facts.wasm_tier must be null or an object"),
        ({"wasm_tier": {**TIER, "note": "x" * 10_000}}, "facts.wasm_tier must be null or an object of cold_ms"),
        ({"wasm_tier": None}, "facts.wasm_tier is null exactly when result.facts.wasm_tier_error says why"),
        ({"wasm_tier": TIER, "wasm_tier_error": "boom"}, "facts.wasm_tier is null exactly when"),
        ({"wasm_tier": None, "wasm_tier_error": "x" * 501}, "facts.wasm_tier_error must be a string of at most 500"),
    ],
)
def test_malformed_facts_fail_the_answer(facts: dict, message: str) -> None:
    """Facts are type-checked like the rest of the answer, an error answer's too (issue 11, item 11)."""
    for bad in (answer(facts=facts), {"status": "error", "error": "boom", "facts": facts}):
        with pytest.raises(PageResultError, match=re.escape(message)):
            validate_page_result(bad, JOB, TIMEOUT_S)


def test_well_formed_facts_and_unknown_keys_pass() -> None:
    facts = {
        "node_placement": {"WebGpuExecutionProvider": 40, "CPUExecutionProvider": 2},
        "console_warnings": ["[warn] x"],
        "adapter": None,
        "probed_adapter": {"vendor": "google", "isFallbackAdapter": True},
        "threads_effective": 4,
        "timer_resolution_ms": 0.005,
        "a_fact_added_later": {"anything": [1, "two"]},
        "wasm_tier": TIER,
    }
    assert validate_page_result(answer(facts=facts), JOB, TIMEOUT_S)["facts"] == facts
    failed = {"wasm_tier": None, "wasm_tier_error": "ReferenceError: WebAssembly is not defined"}
    assert validate_page_result(answer(facts=failed), JOB, TIMEOUT_S)["facts"] == failed


# --- generate answers (issue 30, item 12): the launched page's answers pass the same checks ---------------

GENERATE_JOB = replace(JOB, generate=GenerateJob(new_tokens=3, top_k=2))


def generated(**changes: object) -> dict:
    generation = {
        "ttft_samples_ms": [0.5] * 3,
        "step_samples_ms": [[0.25, 0.25]] * 3,
        "tokens": [[1, 2, 3], [4, 5, 6]],
        "prefill_logits": {"dims": [2, 1, 8], "values": [0.0] * 16},
        "step_top": {"ids": [[[1, 0]] * 3] * 2, "values": [[[0.5, None]] * 3] * 2},  # null: a non-finite logit
        "tokens_stable": True,
    }
    return {k: v for k, v in answer().items() if k != "outputs"} | {"generation": generation | changes}


def test_a_launched_page_generation_is_checked_against_its_job() -> None:
    """validate_page_result is the one check of a generate answer, the launched browser's (web/driver.py) and
    a served device's alike. Without a vocabulary in the job (a graph whose logits width is symbolic) token
    ids are bounded by the width of the prefill logits, which must be [batch, 1, width]."""
    job = replace(GENERATE_JOB, generate=GenerateJob(new_tokens=3, vocab_size=8, top_k=2))
    assert validate_page_result(generated(), job, TIMEOUT_S)["generation"]["tokens"][1] == [4, 5, 6]
    assert validate_page_result(generated(), GENERATE_JOB, TIMEOUT_S)["status"] == "ok"
    refused = [
        ({"step_samples_ms": [[0.25]] * 3}, "holds 1 decode steps; a generation of this job's 3 new tokens takes 2"),
        ({"ttft_samples_ms": [1.5] * 3}, "ttft_samples_ms[0] is 1.5 ms, longer than the whole generation"),
        ({"tokens": [[1, 2, 8], [4, 5, 6]]}, "tokens[0][2] is 8; token ids are integers 0..7"),
        ({"tokens": [[1, 2, 3]]}, "must hold 2 rows (the job's batch) of 3 token ids each"),
        ({"step_top": {"ids": [[[1, 0]] * 3], "values": [[[0.5, 0.5]] * 3] * 2}}, "step_top.ids must hold [2][3][2]"),
        ({"step_top": {"ids": [[[1, 8]] * 3] * 2, "values": [[[0.5, 0.5]] * 3] * 2}}, "step_top.ids must be token ids"),
        (
            {"step_top": {"ids": [[[1, 0]] * 3] * 2, "values": [[[0.5, True]] * 3] * 2}},
            "step_top.values must be numbers",
        ),
        ({"step_top": None}, "result.generation.step_top"),
    ]
    for changes, message in refused:
        with pytest.raises(PageResultError, match=re.escape(message)):
            validate_page_result(generated(**changes), job, TIMEOUT_S)
    wide = generated(prefill_logits={"dims": [2, 1, 1000], "values": [0.0] * 2000}, tokens=[[999] * 3] * 2)
    with pytest.raises(PageResultError, match=re.escape("prefill_logits.dims are [2, 1, 1000]; this job's are")):
        validate_page_result(wide, job, TIMEOUT_S)


def test_a_generation_shorter_than_its_job_is_taken_only_from_a_job_that_stops_at_eos() -> None:
    """Issue 32 item 5: fewer decode steps and tokens than new_tokens pass only where the job carries EOS ids
    (--stop-at-eos) and every row's tokens show the stop at the step they end; a page that stops early on a
    job that ignores EOS is refused."""
    short = {"step_samples_ms": [[0.25]] * 3, "tokens": [[1, 7], [7, 5]],  # both rows made EOS 7 by step 2
             "step_top": {"ids": [[[1, 0]] * 2] * 2, "values": [[[0.5, None]] * 2] * 2}}  # fmt: skip
    with pytest.raises(
        PageResultError, match=re.escape("takes 2 (the first token is the TTFT's; the job ignores EOS)")
    ):
        validate_page_result(
            generated(**short), replace(JOB, generate=GenerateJob(3, vocab_size=8, top_k=2)), TIMEOUT_S
        )
    stops = replace(JOB, generate=GenerateJob(new_tokens=3, vocab_size=8, eos_ids=[7], top_k=2))
    assert validate_page_result(generated(**short), stops, TIMEOUT_S)["generation"]["tokens"] == [[1, 7], [7, 5]]
    assert validate_page_result(generated(), stops, TIMEOUT_S)["status"] == "ok"  # no EOS made: all 3 tokens
    refused = [
        ({"tokens": [[1, 2], [7, 5]]}, "of 3 token ids each"),  # row 0 made no EOS: the page stopped early
        ({"step_samples_ms": [[0.25]] * 3, "tokens": [[7, 1, 2], [7, 5, 6]]}, "of 1 token ids each"),  # ran past it
    ]
    for changes, message in refused:
        with pytest.raises(PageResultError, match=re.escape(message)):
            validate_page_result(generated(**changes), stops, TIMEOUT_S)


def test_a_generate_job_carries_its_graphs_vocabulary(tmp_path: Path) -> None:
    """generate_job reads the logits width off the graph the page runs (weights not loaded)."""
    import onnx
    from onnx import TensorProto, helper

    from harness.browser.generate import generate_job
    from harness.core.records import Case

    for width, name in ((50, "fixed.onnx"), ("vocab", "symbolic.onnx")):
        ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])
        logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", width])
        node = helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)
        onnx.save(helper.make_model(helper.make_graph([node], "g", [ids], [logits])), tmp_path / name)
    case = Case(1, 8, "fp32", mode="generate", new_tokens=4)
    assert generate_job(tmp_path / "fixed.onnx", case, False).vocab_size == 50
    assert generate_job(tmp_path / "symbolic.onnx", case, False).vocab_size is None


def test_a_page_job_is_the_pages_json_in_one_place() -> None:
    """PageJob.page_json is what runner.mjs reads: the stop rule's and the generation's fields flat, a mode,
    a generation's unset facts left out (an inference job carries none)."""
    plain = JOB.page_json()
    assert plain["mode"] == "inference" and plain["iterations"] == 3 and plain["max_time_ms"] is None
    assert plain["inputs"] == [{"name": "input_ids", "url": "job/m.0.bin", "dtype": "int64", "dims": [2, 8]}]
    assert "new_tokens" not in plain and "stop" not in plain and "generate" not in plain
    generating = replace(GENERATE_JOB, generate=GenerateJob(new_tokens=3, vocab_size=8)).page_json()
    assert generating["mode"] == "generate" and generating["new_tokens"] == 3 and generating["vocab_size"] == 8
    assert "past_shape" not in generating and "session_options" not in generating
    assert JOB.stop.fewest_samples == 3 and replace(STOP, iterations=20, max_time_ms=1.0).fewest_samples == 3
