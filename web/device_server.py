"""`accelharness web --serve`: any browser that opens the run's URL becomes a measured target.

The device page (web/page/device.html + device.mjs) runs runner.mjs's own runJob, so its timing
and EP checks are the Playwright path's; only how jobs reach it and answers come back differs:
the page asks this server for them. The server is the PageServer's closed file set under the
run's token (every case's files at once) plus four POST routes under /<token>/api/:

- hello: the page's facts (user agent, adapter, WebNN contexts, isolation...); the server names
  the device (id = hash of user agent and adapter facts) and answers with its jobs and progress.
  Hellos are rate-limited per client address, and a device beyond the run's max_devices is refused
  (429): a flood of made-up devices holds neither memory nor the terminal.
- next: the device's next job. One page at a time holds a device (its lease); another page of
  the same device waits until that lease is released or expires. A source that hands its jobs one at a
  time (JobSource.more: ab's launched browser) may have none yet: `next` waits NEXT_WAIT_S for one, then
  answers `more` and the page asks again.
- heartbeat: sent every HEARTBEAT_S by a worker of the holding page (a worker keeps beating while
  the main thread is busy in wasm). A page silent for LEASE_S loses its device, and the job it
  held is offered again to the next page of that device; a job held past --timeout is recorded as
  a timeout; a job whose lease was lost and that nobody took up again is recorded, when serving
  ends, as `error: device disconnected`.
- result/<job>: the answer. Its body is bounded by the job's known output sizes, it is checked by
  the Playwright path's validator, and it must come from the page holding that job's lease:
  anything malformed, oversized, out of schema, duplicate or from elsewhere gets a 4xx and stores
  nothing. A valid answer goes to JobSource.answered exactly once.

Every body is JSON nested at most MAX_JSON_DEPTH deep (else a 400); each refused post is one log line
(rate-limited), in terminal-safe text.

What a device runs and how an answer becomes a row belong to the caller (JobSource).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import hashlib
import io
import ipaddress
import json
import logging
import math
import re
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from harness.core.terminal import terminal_text
from harness.web.answers import PageResultError, check_facts, decode_outputs, validate_page_result
from harness.web.page_job import PageJob
from harness.web.server import PageServer

log = logging.getLogger(__name__)

LEASE_S = 10.0  # a holding page silent this long loses its device (and the job it was running)
HEARTBEAT_S = 2.0  # how often the holding page's worker renews its lease
SWEEP_S = 0.25  # how often leases, job timeouts and the end condition are checked
# A device's page asks for work once more after its last result and is told it is done (its "You can close
# this tab"); its last posts must find the server still answering, so a finished device ends the serving once
# its page was told so, or after this long (a page that went away asks nothing more).
DONE_LINGER_S = 3.0
# A source that hands its jobs one at a time (harness.browser.launched_session: ab's launched browser) may add one
# while its page asks: `next` waits this long for it before telling the page to ask again.
NEXT_WAIT_S = 2.0
SMALL_BODY = 64 * 1024  # hello, next, heartbeat
# Refused posts are logged a line each, LOG_BURST at once and LOG_PER_S a second after that (the rest
# counted in the next line): a flood of bad posts cannot flood the operator's terminal.
LOG_BURST, LOG_PER_S = 10, 1.0
# Hellos per client address: HELLO_BURST at once, then HELLO_PER_S a second. A page says hello once per
# load (a load per EP setting, about six per device), so several devices behind one address pass.
HELLO_BURST, HELLO_PER_S = 20, 2.0
MAX_CLIENTS = 1024  # client addresses whose recent hellos are remembered at once
MAX_PAGES = 32  # open pages (tabs) of one device
MAX_JSON_DEPTH = 32  # a page's posts nest a few levels (answer.facts.webnn.cpu); deeper is not a page's
# What an answer may hold besides its outputs: facts and console lines, and per timed sample a number.
FACTS_ALLOWANCE = 256 * 1024
BYTES_PER_SAMPLE = 32
PAGE_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
ADAPTER_IDENTITY = ("vendor", "architecture", "device", "description", "isFallbackAdapter")
BROWSERS = (  # the first that matches names the browser: Edge and Opera say Chrome too
    ("edge", r"Edg(?:e|A|iOS)?/(\d+)"),
    ("opera", r"OPR/(\d+)"),
    ("samsung", r"SamsungBrowser/(\d+)"),
    ("firefox", r"(?:Firefox|FxiOS)/(\d+)"),
    ("headless-chrome", r"HeadlessChrome/(\d+)"),
    ("chrome", r"(?:Chrome|CriOS)/(\d+)"),
    ("safari", r"Version/(\d+)[.\d]* (?:Mobile/\S+ )?Safari/"),
)
SYSTEMS = (
    ("android", r"Android"),
    ("ios", r"iPhone|iPad|iPod"),
    ("windows", r"Windows"),
    ("chromeos", r"CrOS"),
    ("macos", r"Mac OS X|Macintosh"),
    ("linux", r"Linux"),
)


class ServeError(ValueError):
    """A serve option cannot work (TLS files, an address this machine does not have)."""


class TokenBucket:
    """`burst` tokens, refilled at `per_s` a second: take() says whether one was left (and takes it)."""

    def __init__(self, burst: float, per_s: float) -> None:
        self.burst, self.per_s = burst, per_s
        self.tokens, self.stamp = burst, time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.per_s)
        self.stamp = now

    def take(self) -> bool:
        self._refill()
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    @property
    def full(self) -> bool:
        self._refill()
        return self.tokens >= self.burst


class ApiError(Exception):
    """A request refused with this HTTP status; nothing of it was stored. retry_s: when the same request
    may pass (a rate limit), for the page to wait and ask again."""

    def __init__(self, status: int, message: str, retry_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_s = retry_s


@dataclass
class ServeJob:
    """One job of one device: what the page runs, what bounds its answer, and who holds it."""

    key: str  # the result key: unique per device and run
    setting: str  # the runtime it needs (EP, threads, device type): a page load runs one setting
    label: str  # shown on the page and in the terminal
    page_job: PageJob  # what the page runs
    max_body: int  # bytes an answer may take (answer_limit)
    id: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    holder: str | None = None  # the page running it
    taken: float = 0.0  # when that page took it (monotonic)
    lost: list[str] = field(default_factory=list)  # how earlier leases on it ended
    outcome: dict[str, Any] | None = None  # the stored row's summary, once there is one

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "setting": self.setting, "label": self.label, "outcome": self.outcome}


@dataclass
class Page:
    """One open page (a browser tab) of a device, as it said hello."""

    id: str
    facts: dict[str, Any]  # what the page reported (environment, adapter, WebNN contexts, origin)
    address: str  # the client address its requests came from
    origin: str  # the origin it asked on (scheme://host:port as the browser sent it)


@dataclass
class Device:
    """A browser, as named by its user agent and adapter: a target of the run."""

    id: str
    name: str
    facts: dict[str, Any]  # its first page's facts
    jobs: list[ServeJob] = field(default_factory=list)
    holder: str | None = None  # the page holding its lease
    seen: float = 0.0  # the holder's last request (monotonic)
    pages: dict[str, Page] = field(default_factory=dict)
    told_done: bool = False  # a page of it asked for work after the last result and was told it is done
    finished_at: float | None = None  # when the serving loop first saw every job with its outcome (monotonic)

    @property
    def finished(self) -> bool:
        return all(job.outcome is not None for job in self.jobs)

    def progress(self) -> dict[str, Any]:
        done = sum(job.outcome is not None for job in self.jobs)
        running = next((job.label for job in self.jobs if job.holder and job.outcome is None), None)
        return {"done": done, "total": len(self.jobs), "running": running, "finished": self.finished}


class JobSource(Protocol):
    """What a device runs, and how its answers become rows (the caller's side of the server)."""

    def describe(self) -> dict[str, Any]:
        """What the run measures, for the page's header (models, cases, measuring settings)."""

    def jobs(self, device: Device, files: PageServer) -> list[ServeJob]:
        """A newly seen device's jobs, without those the run already holds rows for; their files are
        served through files.set_job_files."""

    def answered(self, device: Device, job: ServeJob, answer: dict[str, Any], page: Page) -> dict[str, Any]:
        """Store a validated answer; returns a summary of the row (status, p50, parity) for the page."""

    def unanswered(self, device: Device, job: ServeJob, status: str, why: str) -> dict[str, Any]:
        """Store the row of a job that got no answer (timeout, device disconnected)."""

    # Optional: `more(device) -> bool`, whether jobs may still be added to the device (DeviceServer.add_job) after
    # it ran out of them; a source without it hands every job at hello.


Event = Callable[[str, Device, ServeJob | None], None]  # (kind, device, job): arrived, leased, answered, lost...


def answer_limit(output_bytes: int, max_iterations: int) -> int:
    """The largest answer body a job may post: its outputs (at up to twice the reference's bytes, as
    base64), plus the facts and console lines, plus a number per timed sample."""
    encoded = 4 * math.ceil(2 * output_bytes / 3)
    return encoded + FACTS_ALLOWANCE + BYTES_PER_SAMPLE * max_iterations


def device_identity(facts: dict[str, Any]) -> tuple[str, str]:
    """(id, name) of the browser that sent these facts. The id is a hash of the user agent and the
    adapter's identity, prefixed with a readable slug: chrome141-android-3f9a2c1d."""
    agent = facts["user_agent"]
    adapter = (facts.get("adapter") or {}).get("info") or {}
    identity = {"user_agent": agent, "adapter": {k: adapter.get(k) for k in ADAPTER_IDENTITY if k in adapter}}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    browser, version = next(
        ((name, found.group(1)) for name, pattern in BROWSERS if (found := re.search(pattern, agent))), ("browser", "")
    )
    system = next((name for name, pattern in SYSTEMS if re.search(pattern, agent)), "unknown")
    model = ((facts.get("user_agent_data") or {}).get("model") or "").strip()
    name = f"{browser} {version} on {system}".replace("  ", " ") + (f" ({model})" if model else "")
    if adapter.get("description") or adapter.get("vendor"):
        name += f", GPU {adapter.get('description') or adapter.get('vendor')}"
    return f"{browser}{version}-{system}-{digest}", name


# --- checking what a page sends ---------------------------------------------------------------------

_HELLO_TEXT = ("user_agent", "platform", "origin")
_HELLO_OBJECTS = ("adapter", "webnn", "user_agent_data")


def _check_hello(facts: Any) -> dict[str, Any]:
    if not isinstance(facts, dict):
        raise ApiError(400, "hello.facts must be an object")
    for key in _HELLO_TEXT:
        if not isinstance(facts.get(key), str) or not facts[key] or len(facts[key]) > 2048:
            raise ApiError(422, f"hello.facts.{key} must be a non-empty string of at most 2048 characters")
    for key in _HELLO_OBJECTS:
        if not isinstance(facts.get(key), dict | None):
            raise ApiError(422, f"hello.facts.{key} must be an object or null")
    memory = facts.get("device_memory")
    if memory is not None and not (isinstance(memory, int | float) and not isinstance(memory, bool) and memory > 0):
        raise ApiError(422, "hello.facts.device_memory must be a number > 0 or null")
    try:
        check_facts(facts)  # the keys runner.mjs's environmentFacts() reports, checked as on every answer
    except PageResultError as exc:
        raise ApiError(422, f"hello: {exc}") from None
    return facts


async def _read_json(request: web.Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, refused (413) past `limit` bytes before more than that is read, and
    (400) when it is not JSON, not an object, or nested deeper than MAX_JSON_DEPTH."""
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"body of {request.content_length} bytes; this route takes at most {limit}")
    body = bytearray()
    while chunk := await request.content.read(64 * 1024):
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"body larger than {limit} bytes, the most this route takes")
    try:
        data = json.loads(body, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:  # the decoder's own bound on nesting (the interpreter's recursion limit)
        raise ApiError(400, f"body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits...
        raise ApiError(400, f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"body must be a JSON object, not {type(data).__name__}")
    if _nesting(data) > MAX_JSON_DEPTH:
        raise ApiError(400, f"body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels")
    return data


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _nesting(value: Any) -> int:
    """How deep arrays and objects nest in `value`, walked without recursion, stopping past the bound."""
    deepest, todo = 0, [(value, 1)]
    while todo and deepest <= MAX_JSON_DEPTH:
        item, depth = todo.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        todo += [(child, depth + 1) for child in children if isinstance(child, dict | list)]
    return deepest


def _page_id(data: dict[str, Any]) -> str:
    page_id = data.get("page_id")
    if not isinstance(page_id, str) or not PAGE_ID.fullmatch(page_id):
        raise ApiError(400, "page_id must be 16-64 characters of A-Z a-z 0-9 _ -")
    return page_id


def _wall(monotonic: float) -> str:
    """A monotonic instant as UTC wall time, for the reasons recorded on rows."""
    return datetime.fromtimestamp(time.time() - (time.monotonic() - monotonic), UTC).strftime("%H:%M:%S UTC")


# --- the server -------------------------------------------------------------------------------------


class DeviceServer(PageServer):
    """The page files and the device API on host:port (loopback unless asked), with TLS if given."""

    def __init__(
        self,
        source: JobSource,
        timeout_s: float,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        on_event: Event | None = None,
        *,
        max_devices: int,
    ) -> None:
        super().__init__(isolate=True, host=host, port=port, ssl_context=ssl_context)
        self.source = source
        self.timeout_s = timeout_s
        self.max_devices = max_devices  # devices this run takes; a new one beyond them gets a 429
        self._hellos: dict[str, TokenBucket] = {}  # per client address
        self.on_event = on_event or (lambda kind, device, job: None)
        self.devices: dict[str, Device] = {}
        self._jobs: dict[str, tuple[Device, ServeJob]] = {}
        self._pages: dict[str, Device] = {}
        self._job_files: dict[str, Path | bytes] = {}
        self._log_budget = TokenBucket(LOG_BURST, LOG_PER_S)
        self._unlogged = 0  # refused posts not logged since the last line
        self._added = asyncio.Event()  # a job was added (add_job): a waiting `next` takes it

    transport = "web --serve: the device page asks this server for jobs over HTTP(S)"

    @property
    def origin(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{url_host(self.host)}:{self.port}"

    @property
    def device_url(self) -> str:
        return self.base_url + "page/device.html"

    def set_job_files(self, files: dict[str, Path | bytes]) -> dict[str, str]:
        """Add (never replace: every device's jobs are open at once) files, each under a name made
        unique by a digest of what it is, so one model file keeps one URL and the page one session.
        The URLs are origin-relative: a device reaches this server under whatever name or address it
        was given (a LAN address, a hostname), and its page fetches from that same origin."""
        if any("/" in name for name in files):  # a model folder (transformers.js's onnx/model.onnx)
            return self._job_folder(files)
        urls = {}
        for name, source in files.items():
            if name in ("", ".", ".."):
                raise ValueError(f"job file name '{name}' must be a plain file name")
            what = str(Path(source).resolve()).encode() if isinstance(source, Path) else source
            unique = f"{hashlib.sha256(what).hexdigest()[:16]}-{name}"
            self._served["job"][unique] = source
            urls[name] = f"/{self.token}/job/{unique}"
        return urls

    def _job_folder(self, files: dict[str, Path | bytes]) -> dict[str, str]:
        """A job's files that name a folder layout, kept as laid out under one folder of their own, named by a
        digest of every file's name and what it is (one layout keeps one URL, and no other job's file is touched)."""
        digest = hashlib.sha256()
        for name, source in sorted(files.items(), key=lambda item: item[0]):
            parts = name.split("/")
            if len(parts) > 2 or any(part in ("", ".", "..") or "\\" in part for part in parts):
                raise ValueError(f"job file name '{name}' must be a plain file name, or a folder's and a file's")
            what = str(Path(source).resolve()).encode() if isinstance(source, Path) else source
            digest.update(f"{name}\0{len(what)}\0".encode() + what)
        folder = f"job/{digest.hexdigest()[:16]}"
        for name, source in files.items():
            area = "/".join([folder, *name.split("/")[:-1]])
            self._served.setdefault(area, {})[name.split("/")[-1]] = source
        return {name: f"/{self.token}/{folder}/{name}" for name in files}

    def add_job(self, device: Device, job: ServeJob) -> None:
        """One more job for a device that said hello (a source handing jobs one at a time: JobSource.more)."""
        device.jobs.append(job)
        self._jobs[job.id] = (device, job)
        self._added.set()

    def wake(self) -> None:
        """A waiting `next` asks the source again now (it may have no more jobs to give)."""
        self._added.set()

    def _more(self, device: Device) -> bool:
        more = getattr(self.source, "more", None)
        return bool(more is not None and more(device))

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._dispatch)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = request.raw_path.split("?", 1)[0].lstrip("/").split("/")
        if not self.token_matches(parts[0]):
            return web.json_response({"error": "forbidden: missing or wrong token"}, status=403)
        if request.method in ("GET", "HEAD"):
            return await self._handle(request)
        if request.method != "POST" or len(parts) not in (3, 4) or parts[1] != "api":
            return web.json_response({"error": f"no route {request.method} /…/{'/'.join(parts[1:])}"}, status=404)
        try:
            return web.json_response(await self._api(request, parts[2:]))
        except ApiError as exc:
            self._log_refused(request, "/".join(parts[2:]), exc)
            retry = {} if exc.retry_s is None else {"retry_s": exc.retry_s}
            return web.json_response({"error": str(exc)} | retry, status=exc.status)

    def _log_refused(self, request: web.Request, route: str, refused: ApiError) -> None:
        """One line per refused post (409s aside: the lease protocol at work, shown by its own events), in
        terminal-safe text: what a device sent may be quoted in the reason."""
        if refused.status == 409:
            return
        if not self._log_budget.take():
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused since the last line)" if self._unlogged else ""
        self._unlogged = 0
        line = f"web --serve refused POST …/api/{route[:80]} from {request.remote}: {refused.status} {refused}{more}"
        log.warning(terminal_text(line))

    async def _api(self, request: web.Request, route: list[str]) -> dict[str, Any]:
        if route[0] == "result" and len(route) == 2:
            return await self._result(request, route[1])
        handlers = {"hello": self._hello, "heartbeat": self._heartbeat}
        if len(route) != 1 or route[0] not in (*handlers, "next"):
            raise ApiError(404, f"no API route '{'/'.join(route)}'; routes: hello, next, heartbeat, result/<job>")
        if route[0] == "hello":
            self._admit_hello(request.remote or "?")  # before the body is read
        data = await _read_json(request, SMALL_BODY)
        if route[0] == "next":
            return await self._next(request, data)
        return handlers[route[0]](request, data)

    def _admit_hello(self, address: str) -> None:
        """A token of this address's hello bucket, or a 429. A full bucket is the same as none, so those
        are forgotten first when MAX_CLIENTS addresses are remembered."""
        bucket = self._hellos.get(address)
        if bucket is None:
            if len(self._hellos) >= MAX_CLIENTS:
                self._hellos = {known: b for known, b in self._hellos.items() if not b.full}
            if len(self._hellos) >= MAX_CLIENTS:
                raise ApiError(429, f"hellos from {MAX_CLIENTS} client addresses at once; try again", 1.0)
            bucket = self._hellos[address] = TokenBucket(HELLO_BURST, HELLO_PER_S)
        if not bucket.take():
            raise ApiError(
                429,
                f"too many hellos from {address}: at most {HELLO_BURST} at once, then {HELLO_PER_S:g} a second",
                1 / HELLO_PER_S,
            )

    # --- the routes ---------------------------------------------------------------------------------

    def _hello(self, request: web.Request, data: dict[str, Any]) -> dict[str, Any]:
        page_id = _page_id(data)
        facts = _check_hello(data.get("facts"))
        device_id, name = device_identity(facts)
        known = self._pages.get(page_id)
        if known is not None and known.id != device_id:
            raise ApiError(409, f"page {page_id} belongs to device {known.id}, not {device_id}")
        device = self.devices.get(device_id)
        arrived = device is None
        if device is None and len(self.devices) >= self.max_devices:
            raise ApiError(
                429,
                f"this run takes at most {self.max_devices} devices (--max-devices {self.max_devices}), and "
                f"{len(self.devices)} have said hello; {name} is not measured",
            )
        if device is not None and page_id not in device.pages and len(device.pages) >= MAX_PAGES:
            raise ApiError(429, f"device {device.id} has {MAX_PAGES} pages open, the most one device may have")
        if device is None:
            device = self.devices[device_id] = Device(device_id, name, facts)
            device.jobs = self.source.jobs(device, self)
            self._jobs |= {job.id: (device, job) for job in device.jobs}
        origin = f"{request.scheme}://{request.host}"
        device.pages[page_id] = Page(page_id, facts, request.remote or "?", origin)
        self._pages[page_id] = device
        if arrived:
            self.on_event("arrived", device, None)
        holding = self._hold(device, page_id)
        return self._state(device, page_id, holding) | {
            "run": self.source.describe(),
            "lease_s": LEASE_S,
            "heartbeat_s": HEARTBEAT_S,
        }

    async def _next(self, _request: web.Request, data: dict[str, Any]) -> dict[str, Any]:
        page_id = _page_id(data)
        device = self._device_of(page_id)
        if not self._hold(device, page_id):
            return self._state(device, page_id, False)
        job = self._next_job(device, page_id)
        if job is None and self._more(device):  # a job may come: wait a little for it rather than have the page poll
            self._added.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._added.wait(), NEXT_WAIT_S)
            if device.holder != page_id:  # its lease lapsed meanwhile
                return self._state(device, page_id, False)
            job = self._next_job(device, page_id)
        if job is None:
            more = self._more(device)
            device.told_done = device.finished and not more
            return self._state(device, page_id, True) | ({"more": True} if more else {})
        if job.holder is None:
            job.holder, job.taken = page_id, time.monotonic()
            self.on_event("leased", device, job)
        return self._state(device, page_id, True) | {"job": job.public() | {"run": job.page_job.page_json()}}

    @staticmethod
    def _next_job(device: Device, page_id: str) -> ServeJob | None:
        """The job this page holds, else the first one nobody holds that has no outcome."""
        job = next((j for j in device.jobs if j.holder == page_id and j.outcome is None), None)
        return job or next((j for j in device.jobs if j.holder is None and j.outcome is None), None)

    def _heartbeat(self, _request: web.Request, data: dict[str, Any]) -> dict[str, Any]:
        page_id = _page_id(data)
        device = self._device_of(page_id)
        if device.holder != page_id:
            raise ApiError(409, f"page {page_id} does not hold device {device.id} (its lease expired or was taken)")
        device.seen = time.monotonic()
        return {"ok": True}

    async def _result(self, request: web.Request, job_id: str) -> dict[str, Any]:
        found = self._jobs.get(job_id)
        if found is None:
            raise ApiError(404, f"no job '{job_id[:40]}' in this run")
        device, job = found
        data = await _read_json(request, job.max_body)
        page_id = _page_id(data)
        if job.outcome is not None:
            raise ApiError(409, f"job {job_id} already has its result; a result is stored once")
        if job.holder != page_id or device.holder != page_id:
            raise ApiError(409, f"page {page_id} does not hold the lease on job {job_id} (device {device.id})")
        try:
            answer = validate_page_result(data.get("answer"), job.page_job, self.timeout_s)
            if answer["status"] == "ok" and "generation" not in answer:  # a generate answer carries tokens instead
                decode_outputs(answer["outputs"])
        except (PageResultError, ValueError, binascii.Error) as exc:
            raise ApiError(422, f"the answer failed validation: {exc}") from None
        if answer["facts"].get("user_agent") != device.facts["user_agent"]:
            raise ApiError(422, "the answer's user agent is not the one of the device that holds the job")
        extras = data.get("page") if isinstance(data.get("page"), dict) else {}
        page = device.pages[page_id]
        page.facts = page.facts | {"tab_hidden_during_job": extras.get("hidden") is True}
        device.seen = time.monotonic()
        try:
            job.outcome = self.source.answered(device, job, answer, page)
        except Exception as exc:
            raise ApiError(503, f"the answer could not be stored: {type(exc).__name__}: {exc}") from None
        job.holder = None
        self.on_event("answered", device, job)
        return {"stored": job.outcome} | self._state(device, page_id, True)

    # --- leases -------------------------------------------------------------------------------------

    def _device_of(self, page_id: str) -> Device:
        device = self._pages.get(page_id)
        if device is None:
            raise ApiError(409, f"page {page_id} has not said hello to this run")
        return device

    def _hold(self, device: Device, page_id: str) -> bool:
        """Whether this page holds the device now: it did, nobody did, or the holder's lease expired."""
        now = time.monotonic()
        if device.holder not in (None, page_id):
            if now - device.seen <= LEASE_S:
                return False
            self._release(device, f"page {device.holder} went silent ({LEASE_S:g} s without a heartbeat)")
        if device.holder is None:
            self.on_event("holding", device, None)
        device.holder, device.seen = page_id, now
        return True

    def _release(self, device: Device, why: str) -> None:
        """The holder lost the device: the job it was running is offered again (and says why)."""
        for job in device.jobs:
            if job.holder == device.holder and job.outcome is None:
                job.holder = None
                job.lost.append(f"{why}; its lease on this job ended at {_wall(time.monotonic())}")
                self.on_event("lost", device, job)
        device.holder = None

    def sweep(self) -> None:
        """Expire silent holders' leases; record jobs held past --timeout."""
        now = time.monotonic()
        for device in self.devices.values():
            if device.holder is not None and now - device.seen > LEASE_S:
                self._release(device, f"page {device.holder} went silent ({LEASE_S:g} s without a heartbeat)")
            for job in device.jobs:
                if job.holder is not None and job.outcome is None and now - job.taken > self.timeout_s:
                    why = f"no answer within --timeout {self.timeout_s:g}s from page {job.holder} of this device"
                    job.outcome = self.source.unanswered(device, job, "timeout", why)
                    job.holder = None
                    self.on_event("timeout", device, job)

    def record_disconnected(self) -> None:
        """Serving ends: a job whose lease was lost and that nobody took up again gets its row."""
        self.sweep()
        for device in self.devices.values():
            for job in device.jobs:
                if job.outcome is None and job.holder is None and job.lost:
                    why = "device disconnected: " + "; ".join(job.lost) + "; no page of it took the job up again"
                    job.outcome = self.source.unanswered(device, job, "error", why)
                    self.on_event("disconnected", device, job)

    def _state(self, device: Device, page_id: str, holding: bool) -> dict[str, Any]:
        state: dict[str, Any] = {
            "device": {"id": device.id, "name": device.name},
            "page_id": page_id,
            "holding": holding,
            "progress": device.progress(),
            "jobs": [job.public() for job in device.jobs],
        }
        if not holding:
            state["wait_s"] = HEARTBEAT_S
            state["why"] = (
                f"another page of this device ({device.holder}) is running its jobs: one page per device at a "
                "time, so they do not compete for it. This page takes over if that one goes quiet."
            )
        return state

    def finished_devices(self) -> int:
        """Devices done with every job whose page was told so (or that had DONE_LINGER_S to ask)."""
        now = time.monotonic()
        done = 0
        for device in self.devices.values():
            if not (device.finished and device.pages):
                continue
            device.finished_at = device.finished_at or now
            done += device.told_done or now - device.finished_at >= DONE_LINGER_S
        return done


async def serve_until(
    server: DeviceServer,
    devices: int | None,
    serve_timeout_s: float | None,
    on_ready: Callable[[str], None],
) -> str:
    """Serve until `devices` devices have finished every job ('devices'), or serve_timeout_s passed
    ('timeout'). Ctrl-C cancels this; either way, lost jobs get their rows and the port is closed."""
    await server.start()
    try:
        on_ready(server.device_url)
        deadline = None if serve_timeout_s is None else time.monotonic() + serve_timeout_s
        while True:
            server.sweep()
            if devices is not None and server.finished_devices() >= devices:
                return "devices"
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout"
            await asyncio.sleep(SWEEP_S)
    finally:
        server.record_disconnected()
        await server.stop()


# --- options ------------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """The host to put in the device URL: a wildcard bind is shown as this machine's LAN address."""
    if host in ("0.0.0.0", "::", ""):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:  # a UDP connect sends nothing: it only asks the kernel which address would route there
                probe.connect(("10.254.254.254", 9))
                return probe.getsockname()[0]
            except OSError:
                return socket.gethostname()
    return f"[{host}]" if ":" in host else host


def check_bind(host: str, port: int) -> None:
    """Refuse an address this machine cannot listen on, before the run is started."""
    if not 0 <= port <= 65535:
        raise ServeError(f"--port {port}: must be 0 (a free port) to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeError(f"--host {host}: not an address or name this machine resolves ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def tls_context(certfile: Path | None, keyfile: Path | None) -> ssl.SSLContext | None:
    """HTTPS for the device page (a self-signed pair works), or None for plain HTTP."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        raise ServeError("--certfile and --keyfile go together (a certificate and its private key, PEM)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ServeError(f"--certfile {certfile} / --keyfile {keyfile}: cannot load them as PEM: {exc}") from None
    return context


def exposure_warning(host: str, tls: bool) -> str | None:
    """What to tell the user when the server listens beyond this machine."""
    if is_loopback(host):
        return None
    warning = (
        f"listening on {host}: any machine that can reach this address and has the URL (its token) can load "
        "the page and post results for its own device; use a network you trust"
    )
    if not tls:
        warning += (
            ". Plain HTTP off loopback is not a secure context: no WebGPU or WebNN, no wasm threads "
            "(no SharedArrayBuffer), a coarse timer; serve HTTPS with --certfile/--keyfile"
        )
    return warning


def qr_text(url: str) -> str:
    """The URL as a QR code in text (Unicode half blocks): point a phone's camera at the terminal."""
    import segno

    out = io.StringIO()
    segno.make(url, error="l").terminal(out=out, compact=True)
    return out.getvalue()
