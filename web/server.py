"""The local HTTP server the benchmark page runs from: 127.0.0.1 only, a per-run token, a closed file set.

Every response carries COOP/COEP so the page is cross-origin isolated: without it there is no
SharedArrayBuffer (ORT-web silently drops to one wasm thread) and performance.now() is coarsened
to 100 µs instead of 5 µs. What the page sends back is checked by `validate_page_result` before
anything of it reaches the store.
"""

from __future__ import annotations

import base64
import math
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
from aiohttp import web

PAGE_DIR = Path(__file__).parent / "page"
DIST_DIR = Path(__file__).parent / "node_modules" / "onnxruntime-web" / "dist"
SETUP_HINT = "run `make setup` (it runs `cd web && npm ci`)"

MIME_TYPES = {
    ".html": "text/html",
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".wasm": "application/wasm",
    ".onnx": "application/octet-stream",
    ".bin": "application/octet-stream",
}
ISOLATION_HEADERS = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}
COMMON_HEADERS = {
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


class SetupError(RuntimeError):
    """The browser half is not installed (ORT-web's npm package is missing)."""


def dist_files() -> dict[str, Path]:
    """The ORT-web bundles and wasm binaries we serve, by file name."""
    if not DIST_DIR.is_dir():
        raise SetupError(f"onnxruntime-web is not installed ({DIST_DIR} is missing): {SETUP_HINT}")
    return {p.name: p for p in DIST_DIR.iterdir() if p.suffix in (".mjs", ".wasm") and p.is_file()}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PageServer:
    """Serves /<token>/page/*, /<token>/ort/* and /<token>/job/* (the current job's files)."""

    def __init__(self, isolate: bool = True) -> None:
        # isolate=False exists to show what happens without cross-origin isolation (threads drop to 1).
        self.isolate = isolate
        self.token = secrets.token_urlsafe(24)
        self.port = 0
        self._served = {
            "page": {p.name: p for p in PAGE_DIR.iterdir() if p.is_file()},
            "ort": dist_files(),
            "job": {},
        }
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.token}/"

    @property
    def page_url(self) -> str:
        return self.base_url + "page/index.html"

    def set_job_files(self, files: dict[str, Path | bytes]) -> dict[str, str]:
        """Replace the job's served files; returns each file's URL. Names must be plain file names."""
        for name in files:
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"job file name '{name}' must be a plain file name")
        self._served["job"] = dict(files)
        return {name: f"{self.base_url}job/{name}" for name in files}

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        app.on_response_prepare.append(self._add_headers)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # Bind to an ephemeral port the OS picked; retry once should another process grab it first.
        for _ in range(3):
            self.port = _free_port()
            try:
                await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
                return
            except OSError:
                continue
        raise OSError("could not bind a free port on 127.0.0.1")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _add_headers(self, _request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(COMMON_HEADERS)
        if self.isolate:
            response.headers.update(ISOLATION_HEADERS)

    def _lookup(self, raw_path: str) -> tuple[int, Path | bytes | None]:
        """(HTTP status, what to serve) for a raw request path; decoding is done here, once per layer."""
        path = raw_path.split("?", 1)[0]
        decoded = path
        for _ in range(3):  # catch %2e%2e and %252e%252e alike
            decoded = unquote(decoded)
        parts = path.lstrip("/").split("/")
        if not parts or not secrets.compare_digest(unquote(parts[0]).encode(), self.token.encode()):
            return 403, None
        if ".." in decoded.split("/") or "\\" in decoded or len(parts) != 3:
            return 404, None
        _, area, name = parts
        found = self._served.get(area, {}).get(unquote(name))
        return (200, found) if found is not None else (404, None)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        status, found = self._lookup(request.raw_path)
        if status == 403:
            return web.Response(status=403, text="forbidden: missing or wrong token\n")
        if found is None:
            return web.Response(status=404, text="not found\n")
        name = request.raw_path.split("?", 1)[0].rsplit("/", 1)[-1]
        content_type = MIME_TYPES.get(Path(unquote(name)).suffix, "application/octet-stream")
        if isinstance(found, bytes):
            return web.Response(body=found, content_type=content_type)
        return web.FileResponse(found, headers={"Content-Type": content_type})


# --- what the page returns ------------------------------------------------------------------------

RESULT_STATUSES = ("ok", "error", "unsupported")
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}
NUMPY_DTYPES |= {"float64": np.float64, "int16": np.int16, "int8": np.int8, "uint64": np.uint64, "uint32": np.uint32}
NUMPY_DTYPES |= {"uint16": np.uint16, "uint8": np.uint8, "bool": np.bool_}
OUTPUT_DTYPES = tuple(NUMPY_DTYPES)


class PageResultError(ValueError):
    """The page's answer does not have the expected shape; nothing of it is stored."""


def _require(obj: dict[str, Any], key: str, kinds: tuple[type, ...], where: str = "result") -> Any:
    if key not in obj:
        raise PageResultError(f"{where} lacks '{key}'")
    value = obj[key]
    if isinstance(value, bool) and bool not in kinds:
        raise PageResultError(f"{where}.{key} must be {kinds}, got a boolean")
    if not isinstance(value, kinds):
        raise PageResultError(f"{where}.{key} must be {' or '.join(k.__name__ for k in kinds)}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _timed_ms(value: Any, name: str, timer_resolution_ms: Any) -> float:
    """A duration from performance.now(): finite and > 0. Every run takes time, so 0 ms means the
    clock did not advance across it: a timer fault (too coarse for the work, or frozen), not a figure."""
    if not _is_number(value) or value < 0:
        raise PageResultError(f"{name} must be a finite number > 0 (got {value!r})")
    if value == 0:
        resolution = f"{timer_resolution_ms:g} ms" if _is_number(timer_resolution_ms) else "unknown"
        raise PageResultError(
            f"{name} is 0 ms: a timer fault, performance.now() did not advance across the run (its resolution: "
            f"{resolution}); nothing was measured"
        )
    return float(value)


# The facts the page reports (web/page/runner.mjs), checked like the rest of its answer: reports and
# the matrix compute with them. (what a valid value is, in words; the check). Keys not listed pass as
# they are (plain JSON values).
FactCheck = tuple[str, Callable[[Any], bool]]
_BOOLEAN: FactCheck = ("a boolean", lambda v: isinstance(v, bool))
_COUNT: FactCheck = ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
_MS: FactCheck = ("a finite number >= 0", lambda v: _is_number(v) and v >= 0)
_TEXT: FactCheck = ("a string", lambda v: isinstance(v, str))
_OPTIONAL_TEXT: FactCheck = ("a string or null", lambda v: v is None or isinstance(v, str))
_TEXTS: FactCheck = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
_OBJECT: FactCheck = ("an object or null", lambda v: v is None or isinstance(v, dict))
_COUNTS: FactCheck = (
    "an object of node counts (integers >= 0)",
    lambda v: isinstance(v, dict) and all(_COUNT[1](n) for n in v.values()),
)
FACT_CHECKS: dict[str, FactCheck] = {
    **dict.fromkeys(
        ("cross_origin_isolated", "shared_array_buffer", "webassembly", "webgpu_api", "webnn_api", "threads_dropped"),
        _BOOLEAN,
    ),
    **dict.fromkeys(("hardware_concurrency", "threads_requested", "threads_effective"), _COUNT),
    **dict.fromkeys(("timer_resolution_ms", "runtime_init_ms", "fetch_ms"), _MS),
    **dict.fromkeys(("user_agent", "bundle", "placement_method", "load_measured_with"), _TEXT),
    **dict.fromkeys(("ort_web_version", "ort_common_version", "ep_check"), _OPTIONAL_TEXT),
    **dict.fromkeys(("wasm_files", "input_names", "output_names", "console_warnings"), _TEXTS),
    **dict.fromkeys(("probed_adapter", "adapter"), _OBJECT),
    "node_placement": _COUNTS,
}


def _check_facts(facts: dict[str, Any]) -> None:
    for key, (valid, check) in FACT_CHECKS.items():
        if key in facts and not check(facts[key]):
            raise PageResultError(f"result.facts.{key} must be {valid} (got {facts[key]!r:.200})")


def _check_outputs(outputs: Any) -> None:
    if not isinstance(outputs, list) or not outputs:
        raise PageResultError("result.outputs must be a non-empty list")
    for i, out in enumerate(outputs):
        where = f"outputs[{i}]"
        if not isinstance(out, dict):
            raise PageResultError(f"{where} must be an object")
        _require(out, "name", (str,), where)
        if _require(out, "dtype", (str,), where) not in OUTPUT_DTYPES:
            raise PageResultError(f"{where}.dtype '{out['dtype']}' is not one of {OUTPUT_DTYPES}")
        dims = _require(out, "dims", (list,), where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise PageResultError(f"{where}.dims must be non-negative integers")
        _require(out, "data_b64", (str,), where)


def validate_page_result(result: Any, max_samples: int) -> dict[str, Any]:
    """Check the page's answer: required keys, types (facts included), durations finite and > 0,
    sample-count bounds. A failure makes that job's row an `error` naming what was wrong."""
    if not isinstance(result, dict):
        raise PageResultError(f"the page returned {type(result).__name__}, not an object")
    status = _require(result, "status", (str,))
    if status not in RESULT_STATUSES:
        raise PageResultError(f"result.status '{status}' is not one of {RESULT_STATUSES}")
    facts = _require(result, "facts", (dict,))
    _check_facts(facts)
    if status != "ok":
        if not _require(result, "error", (str,)).strip():
            raise PageResultError(f"a '{status}' result must say why (result.error is empty)")
        return result
    samples = _require(result, "samples_ms", (list,))
    if not 1 <= len(samples) <= max_samples:
        raise PageResultError(f"result has {len(samples)} samples; expected 1..{max_samples}")
    resolution = facts.get("timer_resolution_ms")
    result["samples_ms"] = [_timed_ms(s, f"samples_ms[{i}]", resolution) for i, s in enumerate(samples)]
    for key in ("first_run_ms", "load_ms"):
        result[key] = _timed_ms(_require(result, key, (int, float)), key, resolution)
    _check_outputs(result.get("outputs"))
    return result


def decode_outputs(outputs: list[dict[str, Any]]) -> list[np.ndarray]:
    """The page's base64 outputs as numpy arrays (dtype and byte count checked)."""
    arrays = []
    for out in outputs:
        data = base64.b64decode(out["data_b64"], validate=True)
        dtype = np.dtype(NUMPY_DTYPES[out["dtype"]])
        count = int(np.prod(out["dims"], dtype=np.int64))
        if len(data) != count * dtype.itemsize:
            raise ValueError(f"output {out['name']}: {len(data)} bytes for shape {out['dims']} of {out['dtype']}")
        arrays.append(np.frombuffer(data, dtype=dtype).reshape(out["dims"]))
    return arrays
