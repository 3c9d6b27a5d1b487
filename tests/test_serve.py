"""`accelharness web --serve` end to end: the real CLI serving, real Chromium that the harness does not drive
(a plain `chromium --headless URL` this test launches), the real store. Also a device that is this test
itself, speaking the page's protocol over HTTP: it measures with ONNX Runtime and posts what a page posts,
so the server's refusals can be shown to store nothing in the real run's database."""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import psutil
import pytest
from conftest import CLI

from harness.web.driver import resolve_browser

CHROMIUM = Path("/usr/bin/chromium")
# what opens the URL: what a headless run launches (a device that is any browser; the headless shell where
# installed costs ~4 s of CPU less per launch than the full browser's UI)
DEVICE_BROWSER = resolve_browser("chromium", headless=True).binary if CHROMIUM.exists() else CHROMIUM
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium")
QUICK = ["--model", "bert-tiny", "--hardware", "wasm", "--iterations", "3", "--warmup", "0", "--min-duration", "0"]
CLIENT_UA = "accelharness-test-device/1.0 (a Python client speaking the device page's protocol)"
OTHER_UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/150.0.0.0 Safari/537.36"


class Serving:
    """`accelharness web --serve …` in the background; its stdout read line by line."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.db = tmp_path / "serve.duckdb"
        quick = QUICK[2:] if "--model-path" in args else QUICK  # a model file instead of bert-tiny
        quick = QUICK[2:4] if "--ceilings-only" in args else quick  # no model: wasm's ceilings only
        command = [*CLI, "web", "--serve", *quick, "--db", str(self.db), "--output-dir", str(tmp_path / "out"), *args]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self.wait_for(r"^https?://\S+$", timeout=240)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 120) -> str:
        """The first line (from now on) matching pattern."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if re.search(pattern, line):
                return line
        stderr = self.process.stderr.read() if self.process.poll() is not None and self.process.stderr else ""
        raise AssertionError(
            f"no line matching {pattern!r}; stdout so far: {self.seen[-30:]}; stderr: {stderr[-3000:]}"
        )

    def finish(self, timeout: float = 240) -> tuple[int, str]:
        """Wait for the CLI to exit; (exit code, its stderr)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise
        stderr = self.process.stderr.read() if self.process.stderr else ""
        return code, stderr

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def rows(self) -> list[dict[str, Any]]:
        with duckdb.connect(str(self.db), read_only=True) as connection:
            cursor = connection.execute("SELECT * FROM results ORDER BY device, provider, batch_size")
            names = [d[0] for d in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:
            row["details"] = json.loads(row["details"])
        return rows

    def runs(self) -> list[dict[str, Any]]:
        with duckdb.connect(str(self.db), read_only=True) as connection:
            found = connection.execute("SELECT run_id, status FROM runs").fetchall()
        return [{"run_id": run_id, "status": status} for run_id, status in found]


@pytest.fixture
def serving(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """serving(*args) starts the CLI; every one started is killed at the end if still running."""
    started: list[Serving] = []

    def start(*args: str) -> Serving:
        started.append(Serving(tmp_path, *args))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def launch_browser(profile: Path, url: str, *flags: str) -> subprocess.Popen:
    """A plain headless Chromium on the URL (no Playwright, no DevTools), its own process group."""
    command = [
        str(DEVICE_BROWSER), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        f"--user-data-dir={profile}", *flags, url,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.fixture
def browsers(tmp_path: Path) -> Iterator[Any]:
    """browsers(url, *flags) launches a plain headless Chromium on the URL (no Playwright, no DevTools)."""
    launched: list[subprocess.Popen] = []

    def open_url(url: str, *flags: str) -> subprocess.Popen:
        launched.append(launch_browser(tmp_path / f"profile-{len(launched)}", url, *flags))
        return launched[-1]

    yield open_url
    for process in launched:
        kill_group(process)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a browser and every process it started (renderers, GPU process, utilities)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def listening(pid: int) -> list[str]:
    found = []
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        found += [c.laddr.ip for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    return found


# --- a device that is this test ------------------------------------------------------------------------


class TestDevice:
    """The device page's protocol (hello, next, result) from Python; measures with ONNX Runtime on the CPU."""

    __test__ = False

    def __init__(self, url: str, user_agent: str = CLIENT_UA, cores: int = 1) -> None:
        self.api = url.rsplit("/page/", 1)[0] + "/api/"
        self.user_agent = user_agent
        self.page_id = f"test-device-{os.getpid()}-{time.monotonic_ns()}"[:64]
        self.cores = cores

    def post(self, route: str, body: bytes | dict[str, Any], api: str | None = None) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request((api or self.api) + route, data=data, method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def hello(self) -> dict[str, Any]:
        facts = {
            "user_agent": self.user_agent,
            "platform": "test",
            "origin": "/".join(self.api.split("/")[:3]),
            "hardware_concurrency": self.cores,
            "cross_origin_isolated": False,
            "secure_context": True,
            "adapter": {"available": False, "error": "a Python client has no WebGPU"},
            "webnn": {},
        }
        status, said = self.post("hello", {"page_id": self.page_id, "facts": facts})
        assert status == 200, said
        return said

    def next(self) -> dict[str, Any]:
        status, said = self.post("next", {"page_id": self.page_id})
        assert status == 200, said
        return said

    def answer(self, job: dict[str, Any]) -> dict[str, Any]:
        """Run the job as the page would: the first run's outputs, then timed runs (perf_counter)."""
        import onnxruntime as ort

        run = job["run"]
        model = urllib.request.urlopen(self.url(run["model_url"]), timeout=30).read()
        feeds = {}
        for tensor in run["inputs"]:
            data = urllib.request.urlopen(self.url(tensor["url"]), timeout=30).read()
            feeds[tensor["name"]] = np.frombuffer(data, dtype=tensor["dtype"]).reshape(tensor["dims"])
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        started = time.perf_counter()
        outputs = session.run(None, feeds)
        first_ms = (time.perf_counter() - started) * 1000
        samples = []
        for _ in range(run["iterations"]):
            started = time.perf_counter()
            session.run(None, feeds)
            samples.append((time.perf_counter() - started) * 1000)
        names = [o.name for o in session.get_outputs()]
        encoded = [
            {
                "name": n,
                "dtype": str(o.dtype),
                "dims": list(o.shape),
                "data_b64": base64.b64encode(o.tobytes()).decode(),
            }
            for n, o in zip(names, outputs, strict=True)
        ]
        return {"status": "ok", "samples_ms": samples, "first_run_ms": first_ms, "load_ms": 1.0, "outputs": encoded,
                "facts": {"user_agent": self.user_agent}}  # fmt: skip

    def url(self, path: str) -> str:
        """A job file's URL: the server gives them origin-relative, resolved against the origin asked."""
        return urllib.parse.urljoin(self.api, path)

    def result(self, job: dict[str, Any], body: bytes | dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if isinstance(body, dict) and "page_id" not in body:
            body = {"page_id": self.page_id, "answer": body}
        return self.post(f"result/{job['id']}", body)


# --- the tests -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One served run, two browsers opening its URL: one on 127.0.0.1 (a secure context), one reaching the
    server under a name as a LAN address would (not a secure context, another user agent). What the URL and
    the socket answered while serving, then the finished run."""
    out = tmp_path_factory.mktemp("serve-two")
    served = Serving(out, "--devices", "2")
    launched: list[subprocess.Popen] = []
    try:
        found: dict[str, Any] = {"served": served, "listening": set(listening(served.process.pid))}
        found["token"] = token = served.url.split("/")[3]
        wrong = served.url.replace(token, token[::-1])
        try:
            found["wrong_page"] = urllib.request.urlopen(wrong, timeout=10).status
        except urllib.error.HTTPError as refused:
            found["wrong_page"] = refused.code
        intruder = TestDevice(served.url)
        wrong_api = wrong.rsplit("/page/", 1)[0] + "/api/"
        found["wrong_api"] = intruder.post("hello", {"page_id": intruder.page_id, "facts": {}}, api=wrong_api)[0]
        launched.append(launch_browser(out / "profile-0", served.url))
        plain = served.url.replace("127.0.0.1", "lan.test")
        flags = (f"--user-agent={OTHER_UA}", "--host-resolver-rules=MAP lan.test 127.0.0.1")
        launched.append(launch_browser(out / "profile-1", plain, *flags))
        found["code"], found["stderr"] = served.finish()
        found["rows"] = served.rows()
        yield found
    finally:
        for process in launched:
            kill_group(process)
        served.stop()


def test_a_browser_opening_the_url_measures_and_the_run_completes(two_devices: dict[str, Any]) -> None:
    served, token = two_devices["served"], two_devices["token"]
    assert served.url.startswith("http://127.0.0.1:") and served.url.endswith("/page/device.html")
    assert two_devices["listening"] == {"127.0.0.1"}  # the socket, not the URL string
    assert two_devices["wrong_page"] == 403  # the page under a wrong token
    assert two_devices["wrong_api"] == 403  # a hello under a wrong token
    assert two_devices["code"] == 0, two_devices["stderr"]
    origin = served.url.split("/" + token)[0]
    rows = [r for r in two_devices["rows"] if r["details"]["page_origin"] == origin]  # the browser on 127.0.0.1
    assert [r["provider"] for r in rows] == ["wasm:threads=1", "wasm:threads=2"]  # 1 and hardwareConcurrency
    assert len({r["device"] for r in rows}) == 1 and rows[0]["device"].startswith("headless-chrome")
    for row in rows:
        assert row["status"] == "ok" and row["engine"] == "onnxruntime-web" and row["iterations"] == 3
        assert row["max_abs_diff"] is not None and row["max_abs_diff"] < 1e-3  # parity, checked on the server
        details = row["details"]
        assert "HeadlessChrome" in details["user_agent"] and details["served_device"] is True
        assert details["cross_origin_isolated"] is True and details["secure_context"] is True
        assert details["hardware_concurrency"] == 2 and details["client_address"] == "127.0.0.1"
    assert rows[1]["details"]["threads_effective"] == 2  # isolated on loopback: the threads are real
    assert served.runs()[0]["status"] == "completed"
    [report] = (Path(served.db).parent / "out").glob(f"{served.runs()[0]['run_id']}.html")
    html = report.read_text()
    assert rows[0]["device"] in html and "HeadlessChrome" in html  # the per-device section


@pytest.mark.slow  # ~25 s: two wasm settings' calibrations in a headless Chromium (the flow without a browser:
# test_ceiling_sizing.py::test_a_served_devices_calibration_adds_each_next_job_after_the_last_and_stores_its_ceiling)
def test_a_device_opening_the_url_with_ceilings_only_leaves_its_ceilings(serving: Any, browsers: Any) -> None:
    served = serving("--ceilings-only", "--devices", "1")
    browsers(served.url)
    code, stderr = served.finish()
    assert code == 0, stderr
    assert served.rows() == []
    with duckdb.connect(str(served.db), read_only=True) as connection:
        found = connection.execute("SELECT provider, kind, precision, device, value, budget_ms, software, sizing "
                                   "FROM ceilings ORDER BY provider, kind, precision").fetchall()  # fmt: skip
    assert [(p, k, c) for p, k, c, *_ in found] == [
        (provider, kind, cls) for provider in ("wasm:threads=1", "wasm:threads=2")
        for kind, cls in (("bandwidth", "bytes"), ("compute", "fp32"), ("compute", "int4"))
    ]  # fmt: skip
    for _, _, _, device, value, budget_ms, software, sizing in found:
        assert device.startswith("headless-chrome") and value > 0 and budget_ms > 0
        assert "HeadlessChrome" in software and sizing.startswith("probed ")


def test_a_served_page_runs_generate_jobs_with_token_parity(serving: Any, browsers: Any) -> None:
    served = serving("--devices", "1", "--model", "gpt2-tiny", "--mode", "generate", "--new-tokens", "4",
                     "--sequence-lengths", "8")  # fmt: skip
    browser = browsers(served.url)
    served.wait_for(r"finished all 2 jobs", timeout=300)
    code, stderr = served.finish()
    assert code == 0, stderr
    rows = served.rows()
    assert [(r["mode"], r["new_tokens"], r["status"]) for r in rows] == [("generate", 4, "ok")] * 2
    for row in rows:  # the server checks the device's tokens against native ORT's, as for a launched browser
        assert row["tokens_matched"] == 4 and row["ttft_ms"] > 0 and row["decode_tokens_per_s"] > 0
        assert row["details"]["served_device"] is True and len(json.loads(row["generated_tokens"])[0]) == 4
    kill_group(browser)


def test_a_served_device_loads_a_model_with_external_data(serving: Any, browsers: Any, tmp_path: Path) -> None:
    """The .onnx and its mm.onnx.data at origin-relative URLs the device's page fetches (externalData)."""
    from int4_models import matmul_model

    model = matmul_model(tmp_path / "mm.onnx", external=True)
    served = serving("--devices", "1", "--model-path", str(model), "--precision", "fp32,q4")
    browser = browsers(served.url)
    served.wait_for(r"finished all 4 jobs", timeout=240)
    code, stderr = served.finish()
    assert code == 0, stderr
    rows = served.rows()
    assert {r["requested_precision"] for r in rows} == {"fp32", "q4"} and len(rows) == 4
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert row["max_abs_diff"] <= row["details"]["parity_tolerance"] and row["details"]["served_device"] is True
    kill_group(browser)


def test_refused_posts_store_nothing_and_a_result_is_stored_once(serving: Any) -> None:
    served = serving("--devices", "1")
    device = TestDevice(served.url)
    hello = device.hello()
    assert [job["setting"] for job in hello["jobs"]] == ["wasm:threads=1"]  # one core: one setting
    job = device.next()["job"]
    assert device.result(job, b"{malformed")[0] == 400
    assert device.result(job, b"x" * (64 * 2**20))[0] == 413  # far past this job's output size
    assert device.result(job, {"status": "ok", "samples_ms": [-1], "facts": {}})[0] == 422
    assert device.result(job, device.answer(job) | {"facts": {"user_agent": OTHER_UA}})[0] == 422
    answer = device.answer(job)
    status, stored = device.result(job, answer)
    assert status == 200 and stored["stored"]["status"] == "ok", stored
    assert device.result(job, answer)[0] == 409  # the duplicate
    code, stderr = served.finish()
    assert code == 0, stderr
    [row] = served.rows()  # the refused posts and the duplicate stored nothing
    assert row["status"] == "ok" and row["details"]["user_agent"] == CLIENT_UA and row["max_abs_diff"] < 1e-4


def test_two_browsers_at_once_are_two_devices(two_devices: dict[str, Any]) -> None:
    # The second device reaches the server under a name (as a LAN address would be): not a secure context.
    assert two_devices["code"] == 0, two_devices["stderr"]
    rows = two_devices["rows"]
    devices = {r["device"] for r in rows}
    outcomes = [(r["device"], r["provider"], r["status"], r["error"]) for r in rows]
    assert len(devices) == 2 and len(rows) == 4 and all(r["status"] == "ok" for r in rows), outcomes
    assert len({r["run_id"] for r in rows}) == 1  # both devices are targets of the one run
    by_agent = {r["details"]["user_agent"]: r["device"] for r in rows}
    assert OTHER_UA in by_agent and any("HeadlessChrome" in ua for ua in by_agent)
    insecure = [r for r in rows if r["device"] == by_agent[OTHER_UA]]
    for row in insecure:
        details = row["details"]
        assert details["secure_context"] is False and details["cross_origin_isolated"] is False
        assert "not a secure context" in details["secure_context_note"]
        assert details["page_origin"].startswith("http://lan.test:")
    two_threads = next(r for r in insecure if r["provider"] == "wasm:threads=2")
    assert two_threads["details"]["threads_dropped"] is True  # no SharedArrayBuffer: ORT ran 1 thread


def test_a_browser_killed_mid_job_loses_its_lease_and_the_job_completes_on_the_next_page(
    serving: Any, browsers: Any
) -> None:
    served = serving("--devices", "1", "--min-duration", "2.5")
    first = browsers(served.url)
    served.wait_for(r": running bert-tiny .* on wasm:threads=1", timeout=240)
    time.sleep(1)  # the job leased, its page loading the model or inside its 2.5 s timed loop
    kill_group(first)
    browsers(served.url)  # the same browser again: the same device, waiting for the lease to lapse
    lost = served.wait_for(r"lost its lease", timeout=60)
    assert "wasm:threads=1" in lost
    code, stderr = served.finish()
    assert code == 0, stderr
    rows = served.rows()
    assert [r["status"] for r in rows] == ["ok", "ok"] and len({r["device"] for r in rows}) == 1
    history = rows[0]["details"]["lease_history"]
    assert len(history) == 1 and "without a heartbeat" in history[0]


def test_a_device_that_goes_away_is_recorded_disconnected_and_resume_gives_it_only_what_it_lacks(
    serving: Any,
) -> None:
    options = ("--devices", "1", "--batch-sizes", "1,2", "--serve-timeout", "20")
    served = serving(*options)
    device = TestDevice(served.url, cores=2)  # wasm at 1 and 2 threads, batch 1 and 2: four jobs
    assert len(device.hello()["jobs"]) == 4
    job = device.next()["job"]
    assert device.result(job, device.answer(job))[0] == 200
    device.next()  # takes the second job, then goes away without answering; the last two it never asks for
    code, stderr = served.finish()
    assert code == 1 and "--resume" in stderr, stderr
    [done, gone] = sorted(served.rows(), key=lambda r: r["batch_size"])
    assert done["status"] == "ok" and done["provider"] == gone["provider"] == "wasm:threads=1"
    assert gone["status"] == "error" and gone["error"].startswith("device disconnected: "), gone["error"]
    [run] = served.runs()
    assert run["status"] == "interrupted"
    # Back with --resume: the same device gets the two jobs it lacks, the run completes, nothing twice.
    resumed = serving(*options, "--resume")
    again = TestDevice(resumed.url, cores=2)
    assert [job["setting"] for job in again.hello()["jobs"]] == ["wasm:threads=2", "wasm:threads=2"]
    for _ in range(2):
        job = again.next()["job"]
        assert again.result(job, again.answer(job))[0] == 200
    code, stderr = resumed.finish()
    assert code == 0, stderr
    rows = resumed.rows()
    assert len(rows) == 4 and len({r["result_key"] for r in rows}) == 4
    assert resumed.runs() == [{"run_id": run["run_id"], "status": "completed"}]
