"""Where the benchmark page loads from: a closed file set under a per-run token, with COOP/COEP.

Two ways to deliver it, one file set (PageFiles):
- PageServer: an aiohttp server on 127.0.0.1 (a random port), for a browser launched here.
- RoutedPages: no port at all. Playwright's request routing answers the page's requests on a
  fixed https origin (route.fulfill), so a remote browser (--browser-endpoint) that cannot open
  a connection back to this machine gets the page, ORT-web, the model and the inputs through
  the Playwright connection itself.

Every response carries COOP/COEP so the page is cross-origin isolated: without it there is no
SharedArrayBuffer (ORT-web silently drops to one wasm thread) and performance.now() is coarsened
to 100 µs instead of 5 µs. What the page sends back
is checked by web/answers.py before anything of it reaches the store.
"""

from __future__ import annotations

import re
import secrets
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from aiohttp import web

from harness.web import ort_dist, runtime_dist

PAGE_DIR = Path(__file__).parent / "page"
ROUTED_ORIGIN = "https://accelharness.local"  # never resolved: every request to it is answered by a route

MIME_TYPES = {
    ".html": "text/html",
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".onnx": "application/octet-stream",
    ".bin": "application/octet-stream",
    ".gguf": "application/octet-stream",
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
    """The ORT-web files the page loads (web/ort_dist.py: the same set a wheel ships), by file name."""
    where = ort_dist.dist_dir()
    files = {name: where / name for name in ort_dist.required_files()}
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:
        raise SetupError(
            f"onnxruntime-web is not installed: {where} lacks {', '.join(missing)}; {ort_dist.missing_hint()}"
        )
    return files


def runtime_files() -> dict[str, dict[str, Path]]:
    """Each installed page runtime's files (web/runtime_dist.py), by runtime; one whose files are missing is left
    out (its page module's import then fails, and the harness asks runtime_dist.problem for the reason first)."""
    return {name: runtime_dist.files(name) for name in runtime_dist.FILES if runtime_dist.problem(name) is None}


class PageFiles:
    """<origin>/<token>/page/* (page/runtimes/*: the page runtimes' modules), /<token>/ort/*,
    /<token>/runtimes/<runtime>/* (their npm files: web/runtime_dist.py) and /<token>/job/* (the current job's
    files); nothing else."""

    transport = "none"

    def __init__(self, isolate: bool = True) -> None:
        # isolate=False exists to show what happens without cross-origin isolation (threads drop to 1).
        self.isolate = isolate
        self.token = secrets.token_urlsafe(24)
        self._served = {
            "page": {p.name: p for p in PAGE_DIR.iterdir() if p.is_file()},
            "ort": dist_files(),
            "job": {},
        }
        self._served["page/runtimes"] = {p.name: p for p in (PAGE_DIR / "runtimes").glob("*.mjs")}
        self._served |= {f"runtimes/{name}": found for name, found in runtime_files().items()}

    @property
    def origin(self) -> str:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"{self.origin}/{self.token}/"

    @property
    def page_url(self) -> str:
        return self.base_url + "page/index.html"

    def set_job_files(self, files: dict[str, Path | bytes]) -> dict[str, str]:
        """Replace the job's served files; returns each file's URL. Names are plain file names, or one folder and a
        plain file name (a transformers.js model folder's onnx/model.onnx)."""
        areas: dict[str, dict[str, Path | bytes]] = {"job": {}}
        for name, found in files.items():
            parts = name.split("/")
            if len(parts) > 2 or any(part in ("", ".", "..") or "\\" in part for part in parts):
                raise ValueError(f"job file name '{name}' must be a plain file name, or a folder's and a file's")
            folder = "/".join(["job", *parts[:-1]])
            areas.setdefault(folder, {})[parts[-1]] = found
        self._served = {area: served for area, served in self._served.items() if area.split("/")[0] != "job"}
        self._served |= areas
        return {name: f"{self.base_url}job/{name}" for name in files}

    async def start(self) -> None:
        """Ready to answer (a server binds its port here)."""

    async def stop(self) -> None:
        """Stop answering."""

    async def attach(self, context: Any) -> None:
        """Make a Playwright browser context reach the files (routes register here)."""

    def headers(self, name: str | None = None) -> dict[str, str]:
        """Every response's headers; with a file name, its Content-Type too."""
        headers = dict(COMMON_HEADERS) | (ISOLATION_HEADERS if self.isolate else {})
        if name is not None:
            headers["Content-Type"] = MIME_TYPES.get(Path(unquote(name)).suffix, "application/octet-stream")
        return headers

    def token_matches(self, part: str) -> bool:
        """Whether a request path's first part is this run's token (compared in constant time)."""
        return secrets.compare_digest(unquote(part).encode(), self.token.encode())

    def _lookup(self, raw_path: str) -> tuple[int, Path | bytes | None]:
        """(HTTP status, what to serve) for a raw request path; decoding is done here, once per layer."""
        path = raw_path.split("?", 1)[0]
        decoded = path
        for _ in range(3):  # catch %2e%2e and %252e%252e alike
            decoded = unquote(decoded)
        parts = path.lstrip("/").split("/")
        if not self.token_matches(parts[0]):
            return 403, None
        if ".." in decoded.split("/") or "\\" in decoded or len(parts) not in (3, 4, 5):
            return 404, None
        if len(parts) > 3:  # /page/runtimes/<module>, /runtimes/<runtime>/<file>, /job/<folder>[/<folder>]/<file>
            parts = [parts[0], "/".join([parts[1], *(unquote(part) for part in parts[2:-1])]), parts[-1]]
        _, area, name = parts
        found = self._served.get(area, {}).get(unquote(name))
        return (200, found) if found is not None else (404, None)


class PageServer(PageFiles):
    """The files over HTTP on 127.0.0.1, for a browser launched on this machine (web --serve binds where
    it is asked, with TLS if given: harness.web.device_server)."""

    transport = "local HTTP server on 127.0.0.1"

    def __init__(
        self, isolate: bool = True, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(isolate)
        self.host = host
        self.port = port  # 0: a free port the OS picks when the server binds
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None

    @property
    def origin(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("GET", "/{tail:.*}", self._handle)

    async def start(self) -> None:
        app = web.Application()
        self.add_routes(app)
        app.on_response_prepare.append(self._add_headers)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context).start()
        except BaseException:
            await self.stop()
            raise
        self.port = self._runner.addresses[0][1]  # the port bound (the OS's pick for port 0)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _add_headers(self, _request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(self.headers())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        status, found = self._lookup(request.raw_path)
        if status == 403:
            return web.Response(status=403, text="forbidden: missing or wrong token\n")
        if found is None:
            return web.Response(status=404, text="not found\n")
        headers = self.headers(request.raw_path.split("?", 1)[0].rsplit("/", 1)[-1])
        if isinstance(found, bytes):
            return web.Response(body=found, content_type=headers["Content-Type"])
        return web.FileResponse(found, headers={"Content-Type": headers["Content-Type"]})


class RoutedPages(PageFiles):
    """The files through Playwright's request routing on ROUTED_ORIGIN: no port is opened anywhere.

    One route.fulfill carries its whole body in one DevTools message, and Chromium takes time
    quadratic in its size to read one (measured over CDP: 2 MB 1 s, 8 MB 10 s, 20 MB > 20 s), so
    the page asks for large files in byte ranges of CHUNK_BYTES (page_url's ?chunk=), answered 206.
    """

    transport = f"Playwright request routing on {ROUTED_ORIGIN} (no local port)"
    CHUNK_BYTES = 512 * 1024  # ~6 MB/s over CDP on this machine, against ~1 MB/s for 8 MB in one piece

    @property
    def origin(self) -> str:
        return ROUTED_ORIGIN

    @property
    def page_url(self) -> str:
        return f"{self.base_url}page/index.html?chunk={self.CHUNK_BYTES}"

    async def attach(self, context: Any) -> None:
        await context.route(f"{ROUTED_ORIGIN}/**", self._fulfill)

    async def _fulfill(self, route: Any) -> None:
        path = urlsplit(route.request.url).path
        status, found = self._lookup(path)
        if found is None:
            text = "forbidden: missing or wrong token\n" if status == 403 else "not found\n"
            await route.fulfill(status=status, headers=self.headers(), body=text)
            return
        headers = self.headers(path.rsplit("/", 1)[-1])
        wanted = RANGE.fullmatch(route.request.headers.get("range", ""))
        if wanted is None:
            body = {"body": found} if isinstance(found, bytes) else {"path": str(found)}
            await route.fulfill(status=200, headers=headers, **body)
            return
        size = len(found) if isinstance(found, bytes) else found.stat().st_size
        start, end = int(wanted.group(1)), min(int(wanted.group(2)), size - 1)
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        await route.fulfill(status=206, headers=headers, body=_read_range(found, start, end + 1))


RANGE = re.compile(r"bytes=(\d+)-(\d+)")


def _read_range(found: Path | bytes, start: int, end: int) -> bytes:
    if isinstance(found, bytes):
        return found[start:end]
    with found.open("rb") as handle:
        handle.seek(start)
        return handle.read(end - start)
