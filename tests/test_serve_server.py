"""web --serve's server over real HTTP, driven as a device page would (and as a hostile one might):
token on every route, answers bounded, validated and stored once, leases that expire and pass on,
loopback by default, TLS. The end-to-end run with real browsers is tests/test_serve.py."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import logging
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil
import pytest

from harness.cli.serve import ServeDisplay
from harness.web import device_server
from harness.web.device_server import Device, DeviceServer, Page, ServeError, ServeJob, answer_limit, serve_until
from harness.web.page_job import GenerateJob, PageInput, PageJob, StopRule

UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/141.0.0.0 Safari/537.36"
OTHER_UA = "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/141.0 Mobile"
OUTPUT = np.arange(4, dtype=np.float32)
MAX_ITERATIONS = 10
# a page job (harness.browser.run.page_job) whose stop rule gives 3 timed samples, at most MAX_ITERATIONS
STOP = StopRule(1, iterations=3, min_duration_ms=0, max_iterations=MAX_ITERATIONS, min_iterations=3, max_time_ms=None)
PROMPT = [PageInput(n, f"job/m.{i}.bin", "int64", [1, 8]) for i, n in enumerate(("input_ids", "attention_mask"))]
JOB = PageJob("job/m.onnx", PROMPT, "wasm", 1, STOP, "b1_s8")


class Source:
    """Two jobs per device; keeps what the server hands it (nothing else stores anything)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, dict[str, Any]]] = []  # (device, key, answer)
        self.missing: list[tuple[str, str, str, str]] = []  # (device, key, status, why)

    def describe(self) -> dict[str, Any]:
        return {"models": ["m"], "cases": ["b1"], "hardware": ["wasm"], "measuring": "3 iterations"}

    def jobs(self, device: Device, _files: Any) -> list[ServeJob]:
        limit = answer_limit(OUTPUT.nbytes, MAX_ITERATIONS)
        return [ServeJob(f"{device.id}|{n}", "wasm:threads=1", f"job {n}", JOB, limit) for n in range(2)]

    def answered(self, device: Device, job: ServeJob, answer: dict[str, Any], _page: Page) -> dict[str, Any]:
        self.rows.append((device.id, job.key, answer))
        return {"status": answer["status"]} | ({"error": answer["error"]} if "error" in answer else {})

    def unanswered(self, device: Device, job: ServeJob, status: str, why: str) -> dict[str, Any]:
        self.missing.append((device.id, job.key, status, why))
        return {"status": status, "error": why}


class Served:
    """serve_until running in a loop thread, as the CLI runs it; stop() cancels it (Ctrl-C)."""

    def __init__(
        self, source: Source, timeout_s: float = 60.0, devices: int | None = None, max_devices: int = 8, **server: Any
    ) -> None:
        self.source = source
        self.server = DeviceServer(source, timeout_s, max_devices=max_devices, **server)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        ready: Future[str] = Future()
        self.done = asyncio.run_coroutine_threadsafe(
            serve_until(self.server, devices, None, ready.set_result), self.loop
        )
        self.url = ready.result(timeout=10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.done.cancel)
        time.sleep(0.3)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
        connection.close()
        try:
            return response.status, json.loads(raw)
        except json.JSONDecodeError:
            return response.status, {"raw": raw.decode(errors="replace")}

    def api(self, route: str, data: Any, token: str | None = None) -> tuple[int, dict[str, Any]]:
        body = json.dumps(data).encode()
        return self.request("POST", f"/{token or self.server.token}/api/{route}", body)


@pytest.fixture
def served() -> Iterator[Served]:
    running = Served(Source())
    yield running
    running.stop()


def facts(user_agent: str = UA) -> dict[str, Any]:
    return {
        "user_agent": user_agent,
        "platform": "Linux x86_64",
        "origin": "http://127.0.0.1",
        "hardware_concurrency": 2,
        "cross_origin_isolated": True,
        "secure_context": True,
        "device_memory": 8,
        "adapter": {"available": False, "error": "navigator.gpu.requestAdapter() returned null"},
        "webnn": {"cpu": {"available": False, "error": "no"}},
    }


def answer(user_agent: str = UA, **changes: Any) -> dict[str, Any]:
    output = {"name": "y", "dtype": "float32", "dims": [1, 4], "data_b64": base64.b64encode(OUTPUT).decode()}
    found = {
        "status": "ok",
        "samples_ms": [1.0, 1.1, 1.2],
        "first_run_ms": 2.0,
        "load_ms": 3.0,
        "outputs": [output],
        "facts": {"user_agent": user_agent},
    }
    return found | changes


def page_id(n: int) -> str:
    return f"test-page-{n:08d}-xxxxxxxx"


def take_job(served: Served, page: str, user_agent: str = UA) -> dict[str, Any]:
    status, hello = served.api("hello", {"page_id": page, "facts": facts(user_agent)})
    assert status == 200 and hello["holding"], hello
    status, found = served.api("next", {"page_id": page})
    assert status == 200 and found["job"], found
    return found["job"]


def post_answer(served: Served, job: dict[str, Any], page: str, result: Any) -> tuple[int, dict[str, Any]]:
    return served.api(f"result/{job['id']}", {"page_id": page, "answer": result})


def test_binds_loopback_by_default(served: Served) -> None:
    listening = [
        c.laddr
        for c in psutil.Process().net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == served.server.port
    ]
    assert [address.ip for address in listening] == ["127.0.0.1"]
    assert served.url.startswith(f"http://127.0.0.1:{served.server.port}/{served.server.token}/page/device.html")
    assert device_server.exposure_warning("127.0.0.1", tls=False) is None
    warning = device_server.exposure_warning("0.0.0.0", tls=False)
    assert warning and "not a secure context" in warning and "--certfile" in warning


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/{bad}/page/device.html"),
        ("POST", "/{bad}/api/hello"),
        ("POST", "/{bad}/api/next"),
        ("POST", "/{bad}/api/heartbeat"),
        ("POST", "/{bad}/api/result/{job}"),
        ("PUT", "/{bad}/api/hello"),
        ("POST", "/api/hello"),
        ("GET", "/"),
    ],
)
def test_wrong_token_is_403_on_every_route_and_stores_nothing(served: Served, method: str, path: str) -> None:
    job = take_job(served, page_id(1))
    bad = served.server.token[:-1] + ("A" if served.server.token[-1] != "A" else "B")
    body = json.dumps({"page_id": page_id(1), "facts": facts(), "answer": answer()}).encode()
    status, _ = served.request(method, path.format(bad=bad, job=job["id"]), body)
    assert status == 403
    assert served.source.rows == [] and served.source.missing == []


def test_answers_that_are_malformed_oversized_out_of_schema_or_duplicate_get_4xx_and_store_nothing(
    served: Served,
) -> None:
    page = page_id(1)
    job = take_job(served, page)
    route = f"/{served.server.token}/api/result/{job['id']}"
    limit = answer_limit(OUTPUT.nbytes, MAX_ITERATIONS)
    huge = json.dumps({"page_id": page, "answer": answer(padding="x" * limit)}).encode()
    assert served.request("POST", route, huge)[0] == 413  # Content-Length over the job's bound
    chunked = {"Transfer-Encoding": "chunked"}  # no length given: refused once the bound is passed
    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=10)
    pieces = iter([huge[i : i + 65536] for i in range(0, len(huge), 65536)])
    connection.request("POST", route, body=pieces, headers=chunked, encode_chunked=True)
    assert connection.getresponse().status == 413
    connection.close()
    assert served.request("POST", route, b"{not json")[0] == 400
    assert served.request("POST", route, b"[1, 2]")[0] == 400
    assert served.api(f"result/{job['id']}", {"answer": answer()})[0] == 400  # no page id
    bad_answers = [
        answer(status="great"),
        answer(samples_ms=[-1.0]),
        answer(samples_ms=[1.0] * (MAX_ITERATIONS + 1)),
        answer(load_ms=0),
        answer(outputs=[]),
        answer(outputs=[answer()["outputs"][0] | {"dims": [1, 5]}]),  # 16 bytes are not 5 float32
        answer(outputs=[{"name": "y", "dtype": "float32", "dims": [1, 4], "data_b64": "!!not base64!!"}]),
        answer(facts={"user_agent": UA, "hardware_concurrency": "many"}),
        answer(user_agent="another browser"),  # not the device that holds the job
        "ok",
    ]
    for bad in bad_answers:
        status, said = post_answer(served, job, page, bad)
        assert status == 422, (bad, status, said)
    assert served.source.rows == []
    status, stored = post_answer(served, job, page, answer())
    assert status == 200 and stored["stored"] == {"status": "ok"} and stored["progress"]["done"] == 1
    status, said = post_answer(served, job, page, answer())
    assert status == 409 and "stored once" in said["error"]
    assert len(served.source.rows) == 1


def test_timings_the_page_clock_cannot_have_measured_are_422_and_the_job_stays_open(served: Served) -> None:
    """Issue 23, item 4: 1e-300 ms samples (~1e302 items/s, first in `recommend`), 1e300 ms, one sample
    where the job gives at least three. Each is refused with its reason; the same page may still answer."""
    page = page_id(1)
    job = take_job(served, page)
    refused = [
        (answer(samples_ms=[1e-300] * 3), "samples_ms[0] is 1e-300 ms, less than one step of the page's timer"),
        (answer(samples_ms=[1e300] * 3), "samples_ms[0] is 1e+300 ms, longer than the job's --timeout (60 s)"),
        (answer(load_ms=1e300), "load_ms is 1e+300 ms, longer than the job's --timeout"),
        (answer(samples_ms=[1.0]), "result has 1 samples; this job's stop rule gives 3..10"),
        (answer(browser_memory={"memory_peak_mb": 1e-300}), "result.browser_memory is measured by the harness"),
    ]
    for bad, reason in refused:
        status, said = post_answer(served, job, page, bad)
        assert status == 422 and reason in said["error"], said
    assert served.source.rows == []
    status, stored = post_answer(served, job, page, answer())
    assert status == 200 and stored["stored"] == {"status": "ok"}
    assert [row[2]["samples_ms"] for row in served.source.rows] == [[1.0, 1.1, 1.2]]


# A generate job as harness.browser.run.page_job builds it (generate_job): 4 new tokens for a prompt of batch 1,
# logits 16 wide. Its answer: per timed generation a TTFT and 3 decode steps inside the whole generation.
NEW_TOKENS, VOCAB = 4, 16
GENERATE_JOB = replace(JOB, generate=GenerateJob(NEW_TOKENS, VOCAB, top_k=2))


class GenerateSource(Source):
    """One generate job per device."""

    def jobs(self, device: Device, _files: Any) -> list[ServeJob]:
        limit = answer_limit(VOCAB * 4 * 8, MAX_ITERATIONS)
        return [ServeJob(f"{device.id}|generate", "wasm:threads=1", "generate", GENERATE_JOB, limit)]


def generate_answer(**changes: Any) -> dict[str, Any]:
    generation = {
        "ttft_samples_ms": [0.4, 0.4, 0.5],
        "step_samples_ms": [[0.2, 0.2, 0.2]] * 3,
        "tokens": [[3, 1, 4, 15]],
        "prefill_logits": {"dims": [1, 1, VOCAB], "values": [0.5] * VOCAB},
        "step_top": {"ids": [[[3, 0]] * 4], "values": [[[0.5, 0.25]] * 4]},  # the page's top-2 at each step
        "memory_before": None,
        "memory_after": None,
        "tokens_stable": True,
    }
    found = {k: v for k, v in answer().items() if k != "outputs"}
    return found | {"generation": generation | changes}


def test_impossible_served_generations_are_422_and_the_job_stays_open() -> None:
    """Issue 30, item 12: a 4-token generate job answered with 1 or 200 decode steps, or a TTFT longer than
    the whole generation, was stored `ok` at 100,000 tokens/s. Steps are new_tokens - 1, TTFT and steps fit
    in the whole, token ids are integers inside the job's vocabulary, one row per batch row; each is a 422
    with its reason, nothing stored, and the same page's genuine answer is then stored."""
    running = Served(GenerateSource())
    try:
        page = page_id(1)
        job = take_job(running, page)
        assert job["run"]["vocab_size"] == VOCAB
        refused = [
            (generate_answer(step_samples_ms=[[0.2]] * 3), "step_samples_ms[0] holds 1 decode steps; a generation"),
            (generate_answer(step_samples_ms=[[0.001] * 200] * 3), "step_samples_ms[0] holds 200 decode steps"),
            (generate_answer(ttft_samples_ms=[5.0] * 3), "ttft_samples_ms[0] is 5 ms, longer than the whole"),
            (generate_answer(step_samples_ms=[[0.5] * 3] * 3), "its TTFT and decode steps add up to 1.9 ms, longer"),
            (generate_answer(ttft_samples_ms=[1e-300] * 3), "ttft_samples_ms[0] is 1e-300 ms, less than one step"),
            (generate_answer(step_samples_ms=[[1e300] * 3] * 3), "step_samples_ms[0][0] is 1e+300 ms, longer than"),
            (generate_answer(tokens=[[3, 1, 4, VOCAB]]), f"tokens[0][3] is {VOCAB}; token ids are integers 0..15"),
            (generate_answer(tokens=[[3, 1, -4, 1]]), "tokens[0][2] is -4; token ids are integers 0..15"),
            (generate_answer(tokens=[[3, 1.5, 4, 1]]), "tokens[0][1] is 1.5; token ids are integers"),
            (generate_answer(tokens=[[3, 1, 4]]), "must hold 1 rows (the job's batch) of 4 token ids each"),
            (generate_answer(tokens=[[3, 1, 4, 1]] * 2), "must hold 1 rows (the job's batch) of 4 token ids each"),
            (
                generate_answer(prefill_logits={"dims": [1, 1, 2 * VOCAB], "values": [0.5] * 2 * VOCAB}),
                "prefill_logits.dims are [1, 1, 32]; this job's are [1, 1, the vocabulary (16)]",
            ),
            (
                generate_answer(step_top={"ids": [[[3, 0]] * 4], "values": [[[0.5]] * 4]}),
                "step_top.values must hold [1][4][2]",
            ),
            (
                generate_answer(step_top={"ids": [[[3, VOCAB]] * 4], "values": [[[0.5, 0.25]] * 4]}),
                "step_top.ids must be token ids 0..15",
            ),
            (
                generate_answer(step_top={"ids": [[[3, 0]] * 4], "values": [[["x", 0.25]] * 4]}),
                "step_top.values must be numbers",
            ),
            (answer(), "result lacks 'generation'"),  # an inference answer to a generate job
        ]
        for bad, reason in refused:
            status, said = post_answer(running, job, page, bad)
            assert status == 422 and reason in said["error"], (reason, said)
        assert running.source.rows == [] and running.source.missing == []
        status, stored = post_answer(running, job, page, generate_answer())
        assert status == 200 and stored["stored"] == {"status": "ok"}, stored
        assert running.source.rows[0][2]["generation"]["tokens"] == [[3, 1, 4, 15]]
    finally:
        running.stop()


def test_a_generation_answering_an_inference_job_is_422(served: Served) -> None:
    page = page_id(1)
    job = take_job(served, page)
    status, said = post_answer(served, job, page, answer(generation=generate_answer()["generation"]))
    assert status == 422 and "this job is not a generate job" in said["error"], said
    assert served.source.rows == []


@pytest.mark.parametrize("route", ["hello", "result"])
def test_nested_or_non_standard_json_is_a_400_with_one_log_line(
    served: Served, caplog: pytest.LogCaptureFixture, route: str
) -> None:
    """Issue 23, item 5: ~60 KB of [[[…]]] (under the body limit) answered 500 and printed a 35-line
    RecursionError traceback per request. Now: a 400, one line each, nothing stored."""
    page = page_id(1)
    job = take_job(served, page)
    path = f"/{served.server.token}/api/" + ("hello" if route == "hello" else f"result/{job['id']}")
    deep = 40  # parses, but deeper than any page's post
    bodies = {
        b"[" * 30_000 + b"]" * 30_000: "deeper than 32 levels",
        b'{"page_id": "' + page.encode() + b'", "x": ' + b"[" * deep + b"]" * deep + b"}": "deeper than 32 levels",
        b'{"page_id": "' + page.encode() + b'", "x": NaN}': "NaN is not a JSON value",
        b'{"page_id": "' + page.encode() + b'", "x": 1e999}': "number 1e999 is out of range",
    }
    caplog.clear()
    for body, reason in bodies.items():
        assert len(body) < device_server.SMALL_BODY
        status, said = served.request("POST", path, body)
        assert status == 400 and reason in said["error"], said
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in lines] == ["harness.web.device_server"] * len(bodies)
    assert all(r.exc_info is None and "\n" not in r.getMessage() and " 400 " in r.getMessage() for r in lines)
    assert served.source.rows == [] and len(served.server.devices) == 1


def test_device_text_reaches_the_terminal_without_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, item 6: a model name holding ESC [31m was printed raw in the "device … arrived" line.
    Every line showing what a device sent (its name, GPU, error messages) is stripped of escapes."""
    display = ServeDisplay(SimpleNamespace(devices=None, host="127.0.0.1", certfile=None))
    running = Served(Source(), on_event=display.on_event)
    try:
        page = page_id(1)
        hostile = facts() | {
            "user_agent_data": {"model": "\x1b[31mPixel\x1b[0m \u202eevil\u202c \x9b2J8"},
            "adapter": {"available": True, "info": {"vendor": "\x1b]0;owned\x07gpu\x1b[2J\x1b[H\x07"}},
        }
        assert running.api("hello", {"page_id": page, "facts": hostile})[0] == 200
        job = running.api("next", {"page_id": page})[1]["job"]
        said = {"status": "error", "error": "\x1b[2Jboom \x1b[1A\x1b[K\u202efaked line", "facts": {"user_agent": UA}}
        assert post_answer(running, job, page, said)[0] == 200
    finally:
        running.stop()
    shown = capsys.readouterr().out
    assert "arrived (chrome 141 on linux (Pixel evil 8), GPU gpu)" in shown, shown
    assert ": error: boom faked line [1/2]" in shown, shown
    assert not any(c in shown for c in "\x1b\x07\x9b\u202e\u202c\u2028"), repr(shown)


def test_a_flood_of_hellos_is_bounded_by_the_rate_limit_and_max_devices(served: Served) -> None:
    """Issue 23, item 7: 1,000 hellos with distinct user agents in 3.5 s all got 200 (1,000 devices, +16 MB).
    Now: --max-devices devices at most (8 here), HELLO_BURST hellos per address at once, then HELLO_PER_S a
    second; the rest a 429 saying which. Loopback only, one kept-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=10)
    path = f"/{served.server.token}/api/hello"
    answers: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + 60
    for n in range(1000):
        body = json.dumps({"page_id": page_id(n), "facts": facts(f"{UA} flood/{n}")})
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answers.append((response.status, json.loads(response.read())))
        assert time.monotonic() < deadline
    connection.close()
    took = time.monotonic() - (deadline - 60)
    assert {status for status, _ in answers} == {200, 429}
    assert [status for status, _ in answers[:8]] == [200] * 8 and len(served.server.devices) == 8
    refused = [said for status, said in answers if status == 429]
    assert "this run takes at most 8 devices (--max-devices 8)" in refused[0]["error"]
    limited = [said for said in refused if "too many hellos from 127.0.0.1" in said["error"]]
    assert limited and all(said["retry_s"] == 1 / device_server.HELLO_PER_S for said in limited)
    passed = sum(status != 429 or "too many hellos" not in said["error"] for status, said in answers)
    assert (
        passed <= device_server.HELLO_BURST + device_server.HELLO_PER_S * took + 1
    )  # the bucket, refilled while it ran
    assert sum(len(device.pages) for device in served.server.devices.values()) == 8
    time.sleep(1.2 / device_server.HELLO_PER_S)  # the bucket refills: an admitted device's page may say hello again
    status, again = served.api("hello", {"page_id": page_id(0), "facts": facts(f"{UA} flood/0")})
    assert status == 200 and again["holding"]


def test_a_device_past_its_page_bound_is_refused(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_server, "MAX_PAGES", 3)
    statuses = [served.api("hello", {"page_id": page_id(n), "facts": facts()})[0] for n in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert served.api("hello", {"page_id": page_id(0), "facts": facts()})[0] == 200  # a known page reloads


def test_a_device_cannot_post_for_another_device_or_another_run(served: Served) -> None:
    mine = take_job(served, page_id(1))
    theirs = take_job(served, page_id(2), OTHER_UA)
    assert len(served.server.devices) == 2
    status, said = post_answer(served, mine, page_id(2), answer(OTHER_UA))
    assert status == 409 and "does not hold the lease" in said["error"]
    assert post_answer(served, theirs, page_id(1), answer())[0] == 409
    assert served.api("result/no-such-job", {"page_id": page_id(1), "answer": answer()})[0] == 404
    assert served.api("next", {"page_id": page_id(9)})[0] == 409  # never said hello
    other = Served(Source())  # another run: its own token and its own jobs
    try:
        foreign = take_job(other, page_id(3))
        assert served.api(f"result/{foreign['id']}", {"page_id": page_id(3), "answer": answer()})[0] == 404
        wrong_run = served.api(f"result/{mine['id']}", {"page_id": page_id(1), "answer": answer()}, other.server.token)
        assert wrong_run[0] == 403
        assert other.source.rows == []
    finally:
        other.stop()
    assert served.source.rows == []


def test_one_page_per_device_and_an_expired_lease_passes_the_job_on(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_server, "LEASE_S", 1.0)
    first, second = page_id(1), page_id(2)
    job = take_job(served, first)
    status, hello = served.api("hello", {"page_id": second, "facts": facts()})  # the same browser, another tab
    assert status == 200 and not hello["holding"] and "one page per device" in hello["why"]
    assert served.api("next", {"page_id": second})[1].get("job") is None
    assert served.api("heartbeat", {"page_id": first}) == (200, {"ok": True})
    time.sleep(1.5)  # the first page goes silent: no heartbeat
    status, taken = served.api("next", {"page_id": second})
    assert status == 200 and taken["holding"] and taken["job"]["id"] == job["id"]  # offered again
    assert served.api("heartbeat", {"page_id": first})[0] == 409
    assert post_answer(served, job, first, answer())[0] == 409  # the late answer of the page that lost it
    assert post_answer(served, job, second, answer())[0] == 200
    lost = served.server.devices[next(iter(served.server.devices))].jobs[0].lost
    assert len(lost) == 1 and first in lost[0] and "without a heartbeat" in lost[0]
    assert [key for _, key, _ in served.source.rows] == [job_key(served, job)]


def job_key(served: Served, job: dict[str, Any]) -> str:
    return next(j.key for d in served.server.devices.values() for j in d.jobs if j.id == job["id"])


def test_a_job_held_past_the_timeout_is_a_timeout_row(monkeypatch: pytest.MonkeyPatch) -> None:
    running = Served(Source(), timeout_s=0.5)
    try:
        page = page_id(1)
        job = take_job(running, page)
        deadline = time.monotonic() + 5
        while not running.source.missing and time.monotonic() < deadline:
            running.api("heartbeat", {"page_id": page})  # the page is alive, but never answers
            time.sleep(0.1)
        [(_, key, status, why)] = running.source.missing
        assert key == job_key(running, job) and status == "timeout" and "--timeout 0.5s" in why
        assert post_answer(running, job, page, answer())[0] == 409
    finally:
        running.stop()


def test_a_lost_job_nobody_takes_up_is_recorded_as_device_disconnected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_server, "LEASE_S", 0.5)
    running = Served(Source())
    page = page_id(1)
    job = take_job(running, page)
    time.sleep(1.0)
    running.stop()  # serving ends (Ctrl-C): the lost job gets its row, the untouched one none
    [(_, key, status, why)] = running.source.missing
    assert key == job_key(running, job) and status == "error" and why.startswith("device disconnected: ")
    assert running.source.rows == []


def test_devices_end_serving_once_every_job_is_answered() -> None:
    running = Served(Source(), devices=1)
    try:
        page = page_id(1)
        for _ in range(2):
            job = take_job(running, page)
            assert post_answer(running, job, page, answer())[0] == 200
        assert running.done.result(timeout=5) == "devices"
    finally:
        running.stop()


def test_device_identity() -> None:
    first, name = device_server.device_identity(facts())
    assert first.startswith("chrome141-linux-") and name == "chrome 141 on linux"
    assert device_server.device_identity(facts())[0] == first  # the same browser is the same device
    pixel = facts(OTHER_UA) | {"user_agent_data": {"model": "Pixel 8"}}
    assert device_server.device_identity(pixel)[1] == "chrome 141 on android (Pixel 8)"
    gpu = facts() | {"adapter": {"available": True, "info": {"vendor": "nvidia", "description": "RTX 4090"}}}
    gpu_id, gpu_name = device_server.device_identity(gpu)
    assert gpu_id != first and gpu_id.startswith("chrome141-linux-") and gpu_name.endswith("GPU RTX 4090")
    edge = UA + " Edg/141.0.0.0"
    assert device_server.device_identity(facts(edge))[0].startswith("edge141-linux-")


def test_bind_and_tls_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ServeError, match="go together"):
        device_server.tls_context(tmp_path / "cert.pem", None)
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ServeError, match="cannot load them as PEM"):
        device_server.tls_context(tmp_path / "junk.pem", tmp_path / "junk.pem")
    with pytest.raises(ServeError, match="--port 70000"):
        device_server.check_bind("127.0.0.1", 70000)
    with pytest.raises(ServeError, match="not an address"):
        device_server.check_bind("no-such-host.invalid", 0)
    with pytest.raises(ServeError, match="cannot listen"):
        device_server.check_bind("192.0.2.1", 0)  # TEST-NET-1: never an address of this machine


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_serves_https_only(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    running = Served(Source(), ssl_context=device_server.tls_context(cert, key))
    try:
        assert running.url.startswith("https://127.0.0.1:")
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        connection = http.client.HTTPSConnection("127.0.0.1", running.server.port, timeout=10, context=insecure)
        connection.request("GET", f"/{running.server.token}/page/device.html")
        response = connection.getresponse()
        assert response.status == 200 and response.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        connection.close()
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            running.request("GET", f"/{running.server.token}/page/device.html")  # plain HTTP to a TLS port
    finally:
        running.stop()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the manual's recipe, docs/devices.md)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_qr_code_is_text_of_the_right_size() -> None:
    text = device_server.qr_text("http://127.0.0.1:1234/" + "t" * 32 + "/page/device.html")
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # a square of half-block characters
    assert set("".join(lines)) <= {"█", "▀", "▄", " "}
    assert len(lines[0]) == 33 + 8  # version 4: 33 modules, 4 of border each side


def test_a_model_folder_is_served_as_laid_out_beside_earlier_jobs(tmp_path: Path) -> None:
    """transformers.js's folder (config.json, onnx/model.onnx) keeps its layout under one folder of its own, the
    earlier jobs' files stay (every device's jobs are open at once), and a name that climbs out is refused."""
    server = DeviceServer(Source(), 60.0, max_devices=1)
    model = tmp_path / "model.onnx"
    model.write_bytes(b"onnx bytes")
    earlier = server.set_job_files({"m.onnx": model})["m.onnx"]
    urls = server.set_job_files({"config.json": b"{}", "onnx/model.onnx": model, "p.0.bin": b"\x01"})
    base = urls["onnx/model.onnx"].removesuffix("onnx/model.onnx")
    assert urls["config.json"] == base + "config.json" and urls["p.0.bin"] == base + "p.0.bin"
    assert server._lookup(urls["onnx/model.onnx"]) == (200, model)
    assert server._lookup(urls["config.json"]) == (200, b"{}")
    assert server._lookup(earlier) == (200, model)
    assert server._lookup(base + "model.onnx")[0] == 404  # the layout kept: not flattened
    other = server.set_job_files({"config.json": b'{"a": 1}', "onnx/model.onnx": model})
    assert other["config.json"] != urls["config.json"]  # another layout, another folder
    for bad in ("../x", "onnx/../x", "a/b/c"):
        with pytest.raises(ValueError):
            server.set_job_files({bad: b"", "onnx/model.onnx": model})
