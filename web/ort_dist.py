"""onnxruntime-web's files for the benchmark page: which ones, where they are, and how a wheel gets them.

The page loads, per EP in web/page/eps.json, one ORT bundle, one wasm binary and that binary's glue
module (X.wasm runs with X.mjs): nine files, 69 MB (17 MB compressed) of the package's 139 MB.

- An installed wheel carries exactly these files in harness/web/ort/. The build (setup.py) stages them
  from the npm tarball of the version web/package-lock.json pins, checked against the lockfile's
  integrity hash: taken from npm's own content-addressed cache when `npm ci` left it there, else
  downloaded once from the npm registry. So `pip install accelharness` then `accelharness web` runs
  offline, and what is served is byte for byte what the lockfile names.
- A checkout serves the same nine files from web/node_modules (`make setup` runs `npm ci`).

The other page runtimes' npm files reach the wheel through the same pinned, verified tarballs (`pinned` with
their lockfile entry, `tarball`): web/runtime_dist.py says which files.

Standard library only: setup.py loads this file before any dependency is installed.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "onnxruntime-web"
REGISTRY = "https://registry.npmjs.org"
HERE = Path(__file__).resolve().parent
SHIPPED_DIR = HERE / "ort"  # present in an installed wheel only
CHECKOUT_DIR = HERE / "node_modules" / PACKAGE / "dist"
EPS_TABLE = HERE / "page" / "eps.json"
LOCKFILE = HERE / "package-lock.json"
SOURCE_FILE = "SOURCE.json"  # beside the shipped files: the version, its integrity hash, where it came from
DOWNLOAD_TIMEOUT_S = 120


class OrtFilesError(RuntimeError):
    """onnxruntime-web's files cannot be found, fetched or verified."""


@dataclass(frozen=True)
class Pin:
    """The release of an npm package (onnxruntime-web unless said) the lockfile pins, and its tarball's hash."""

    version: str
    integrity: str  # Subresource Integrity form, "sha512-<base64>"
    package: str = PACKAGE  # its npm name, scope included ("@wllama/wllama")

    @property
    def tarball_url(self) -> str:
        return f"{REGISTRY}/{self.package}/-/{self.package.rpartition('/')[2]}-{self.version}.tgz"


def required_files(eps_table: Path = EPS_TABLE) -> list[str]:
    """The bundle, wasm binary and glue module of every EP the page knows."""
    names: set[str] = set()
    for ep in json.loads(eps_table.read_text(encoding="utf-8")).values():
        names |= {ep["bundle"], ep["wasm_binary"], ep["wasm_binary"].removesuffix(".wasm") + ".mjs"}
    return sorted(names)


def dist_dir() -> Path:
    """Where this copy serves ORT-web from: the files a wheel shipped, else a checkout's node_modules."""
    return SHIPPED_DIR if SHIPPED_DIR.is_dir() else CHECKOUT_DIR


def missing_hint() -> str:
    if (HERE.parent / "pyproject.toml").is_file():  # a checkout (or an editable install of one)
        return "run `make setup` (it runs `cd web && npm ci`)"
    return "this installation of accelharness lacks them: reinstall it from a wheel (`pip install accelharness`)"


def pinned(lockfile: Path = LOCKFILE, key: str = f"node_modules/{PACKAGE}") -> Pin:
    """The pin of the lockfile's entry `key` (a path under node_modules, as the lockfile keys it)."""
    entry = json.loads(lockfile.read_text(encoding="utf-8"))["packages"][key]
    return Pin(entry["version"], entry["integrity"], key.rpartition("node_modules/")[2])


def _digest(integrity: str) -> tuple[str, bytes]:
    algorithm, _, encoded = integrity.partition("-")
    if algorithm not in ("sha512", "sha384", "sha256") or not encoded:
        raise OrtFilesError(f"unsupported integrity '{integrity}' (expected sha512-<base64>)")
    return algorithm, base64.b64decode(encoded)


def verified(data: bytes, pin: Pin, origin: str) -> bytes:
    """The tarball if its hash is the lockfile's; else an error naming both hashes."""
    algorithm, expected = _digest(pin.integrity)
    actual = hashlib.new(algorithm, data).digest()
    if actual != expected:
        got = f"{algorithm}-{base64.b64encode(actual).decode()}"
        raise OrtFilesError(
            f"{pin.package} {pin.version} from {origin} has {got}, but web/package-lock.json pins {pin.integrity}"
        )
    return data


def npm_cache_entry(pin: Pin) -> Path:
    """Where npm's cache (cacache) keeps a tarball: its path is the integrity hash in hex."""
    configured = os.environ.get("npm_config_cache")  # noqa: SIM112 (npm's own spelling)
    root = Path(configured or Path.home() / ".npm") / "_cacache"
    algorithm, digest = _digest(pin.integrity)
    hexdigest = digest.hex()
    return root / "content-v2" / algorithm / hexdigest[:2] / hexdigest[2:4] / hexdigest[4:]


def tarball(pin: Pin) -> tuple[bytes, str]:
    """(the verified tarball, where it came from): npm's cache if it holds it, else the registry."""
    cached = npm_cache_entry(pin)
    if cached.is_file():
        try:
            return verified(cached.read_bytes(), pin, str(cached)), f"npm cache ({cached})"
        except OrtFilesError:
            pass  # a damaged cache entry: fetch a good copy instead
    try:
        with urllib.request.urlopen(pin.tarball_url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except OSError as exc:
        raise OrtFilesError(f"could not download {pin.tarball_url}: {exc}") from exc
    return verified(data, pin, pin.tarball_url), pin.tarball_url


def extract(data: bytes, files: dict[str, Path]) -> str | None:
    """Write each regular file of an npm tarball (`data`, gzipped) named by its path inside the package to its
    destination, its folder made; returns the first path the tarball lacks as a regular file (then stops), else None.
    Only the paths asked for are read: a member's own name is never a destination."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for path, target in files.items():
            try:
                member = archive.extractfile(f"package/{path}")
            except KeyError:
                member = None
            if member is None:
                return path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(member.read())
    return None


def stage(dest: Path, lockfile: Path = LOCKFILE, eps_table: Path = EPS_TABLE) -> Pin:
    """Write the page's ORT files, from the verified tarball, into `dest` (replacing what was there)."""
    pin = pinned(lockfile)
    data, origin = tarball(pin)
    names = required_files(eps_table)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    missing = extract(data, {f"dist/{name}": dest / name for name in names})
    if missing is not None:
        raise OrtFilesError(f"{PACKAGE} {pin.version}'s tarball lacks {missing} (web/page/eps.json names it)")
    source = {"package": PACKAGE, "version": pin.version, "integrity": pin.integrity, "from": origin, "files": names}
    (dest / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    return pin
