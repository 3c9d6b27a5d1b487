"""The page runtimes' npm files (web/page/runtimes.json's rows other than onnxruntime-web): which ones the page may
load, where they are, how a wheel gets them, and their versions.

Each runtime is served under /<token>/runtimes/<name>/<file> (web/server.py), from this closed set only:

- transformers.js: its self-contained browser bundle (dist/transformers.js, which carries its own onnxruntime-web,
  1.31.0-dev, not the harness's 1.30.0) and that onnxruntime-web's wasm binary and glue (the asyncify build, which
  the bundle runs on wasm and WebGPU alike), taken from the onnxruntime-web transformers.js depends on.
- llama.cpp (wllama): its ES module (the worker's code is inlined) and wasm binary (memory64 + JSPI), plus the
  compat build (@wllama/wllama-compat, no memory64, Asyncify) served locally, so a browser without memory64 or JSPI
  never makes wllama fetch it from a CDN.
- webllm: its self-contained ES module (lib/index.js: TVM's web runtime and its tokenizers inlined) and its
  package.json (its version). The model (its compiled library and MLC weights) is the user's: --webllm-model DIR.

FILES is the one list: what the page may load, what a checkout serves and what a wheel carries.

- A checkout serves them from web/node_modules (`make setup` runs `npm ci`).
- An installed wheel carries exactly these files (and each package's package.json: its version, and which
  onnxruntime-web transformers.js depends on) in harness/web/npm/, laid out as node_modules lays them out, a
  package "<a> > <b>" as plain <b> (package_dir finds it there), so everything below reads either the same way.
  The build (setup.py) stages them as it stages onnxruntime-web's: from the npm tarball of each version
  web/package-lock.json pins, checked against its integrity hash (web/ort_dist.py's `pinned` and `tarball`).

Standard library only, like web/ort_dist.py (setup.py loads both by path, so this file never imports that one
at module level: `stage` is handed it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
NODE_MODULES = HERE / "node_modules"
SHIPPED_DIR = HERE / "npm"  # present in an installed wheel only
LOCKFILE = HERE / "package-lock.json"
RUNTIMES_TABLE = HERE / "page" / "runtimes.json"
OWN_RUNTIME = "onnxruntime-web"  # runtimes.json's row for the page's own loop: its files are web/ort_dist.py's
SOURCE_FILE = "SOURCE.json"  # beside the shipped files: each package's version, integrity hash, where it came from
TRANSFORMERS = "@huggingface/transformers"
WLLAMA = "@wllama/wllama"
WEBLLM = "@mlc-ai/web-llm"
TRANSFORMERS_ORT = f"{TRANSFORMERS} > onnxruntime-web"  # its own onnxruntime-web (1.31.0-dev), not the page's
ORT_BUILD = "ort-wasm-simd-threaded.asyncify"  # the build transformers.js's bundle runs, on wasm and WebGPU

# runtime -> served file name -> (npm package, path inside it); a package "<a> > <b>" is b as a resolves it
FILES: dict[str, dict[str, tuple[str, str]]] = {
    "transformers.js": {
        "transformers.js": (TRANSFORMERS, "dist/transformers.js"),
        f"{ORT_BUILD}.wasm": (TRANSFORMERS_ORT, f"dist/{ORT_BUILD}.wasm"),
        f"{ORT_BUILD}.mjs": (TRANSFORMERS_ORT, f"dist/{ORT_BUILD}.mjs"),
    },
    "llama.cpp": {
        "wllama.js": (WLLAMA, "esm/index.js"),
        "package.json": (WLLAMA, "package.json"),  # its version: the module does not say it
        "wllama.wasm": (WLLAMA, "esm/wasm/wllama.wasm"),
        "compat-wllama.js": (f"{WLLAMA}-compat", "wasm/wllama.js"),
        "compat-wllama.wasm": (f"{WLLAMA}-compat", "wasm/wllama.wasm"),
    },
    "webllm": {
        "web-llm.js": (WEBLLM, "lib/index.js"),
        "package.json": (WEBLLM, "package.json"),  # its version: read by the page module
    },
}


class RuntimeFilesError(RuntimeError):
    """A page runtime's npm files are not installed, or cannot be staged for a wheel."""


def dist_root() -> Path:
    """Where this copy serves the runtimes' files from: the files a wheel shipped, else a checkout's node_modules."""
    return SHIPPED_DIR if SHIPPED_DIR.is_dir() else NODE_MODULES


def _missing_hint() -> str:
    from harness.web import ort_dist  # here, not at the top: setup.py loads this file before the package exists

    return ort_dist.missing_hint()


def package_dir(package: str, root: Path | None = None) -> Path:
    """Where a package lives; "<a> > <b>": b as a resolves it (a's own node_modules first, as Node does)."""
    root = root or dist_root()
    parent, _, child = package.rpartition(" > ")
    if not parent:
        return root / package
    nested = root / parent / "node_modules" / child
    return nested if nested.is_dir() else root / child


def version(package: str, root: Path | None = None) -> str | None:
    try:
        return json.loads((package_dir(package, root) / "package.json").read_text(encoding="utf-8"))["version"]
    except (OSError, ValueError, KeyError):
        return None


def _check_transformers_ort(root: Path) -> str | None:
    """The onnxruntime-web found for transformers.js must be the one it depends on (its bundle's version)."""
    try:
        manifest = json.loads((root / TRANSFORMERS / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # reported as missing files
    wanted = manifest.get("dependencies", {}).get("onnxruntime-web")
    found = version(TRANSFORMERS_ORT, root)
    if wanted and found != wanted:
        return f"transformers.js depends on onnxruntime-web {wanted}, but {found} is installed for it"
    return None


def files(runtime: str, root: Path | None = None) -> dict[str, Path]:
    """The runtime's served files by name; RuntimeFilesError (saying what to do) if any is missing."""
    if runtime not in FILES:
        raise RuntimeFilesError(f"'{runtime}' is not a page runtime with npm files ({', '.join(FILES)})")
    root = root or dist_root()
    found = {name: package_dir(package, root) / path for name, (package, path) in FILES[runtime].items()}
    missing = [str(path) for path in found.values() if not path.is_file()]
    if missing:
        listed = ", ".join(missing)
        raise RuntimeFilesError(f"{runtime}'s npm files are not installed: {listed} missing; {_missing_hint()}")
    mismatch = _check_transformers_ort(root) if runtime == "transformers.js" else None
    if mismatch:
        raise RuntimeFilesError(f"{mismatch}; {_missing_hint()}")
    return found


def problem(runtime: str, root: Path | None = None) -> str | None:
    """Why the runtime's files cannot be served here, or None."""
    try:
        files(runtime, root)
    except RuntimeFilesError as exc:
        return str(exc)
    return None


def versions(runtime: str, root: Path | None = None) -> dict[str, str | None]:
    """The installed version of each package the runtime's files come from, by package."""
    return {package.rpartition(" > ")[2]: version(package, root) for package, _ in FILES.get(runtime, {}).values()}


def shipped_files() -> dict[str, set[str]]:
    """What a wheel carries, by package (FILES's spelling): every file FILES names of it, and its package.json."""
    wanted: dict[str, set[str]] = {}
    for served in FILES.values():
        for package, path in served.values():
            wanted.setdefault(package, {"package.json"}).add(path)
    return wanted


def shipped_folder(package: str) -> str:
    """A package's folder in a wheel's harness/web/npm/: its own name ("<a> > <b>": b, where package_dir finds it
    when a has no node_modules of its own)."""
    return package.rpartition(" > ")[2]


def lock_key(package: str, locked: dict[str, dict]) -> str:
    """The lockfile's entry for a package: "<a> > <b>" is a's nested copy of b if the lockfile has one, as Node
    resolves it (package_dir), else the top-level b."""
    parent, _, child = package.rpartition(" > ")
    nested = f"node_modules/{parent}/node_modules/{child}"
    return nested if parent and nested in locked else f"node_modules/{child}"


def _check_table(table: Path) -> None:
    """FILES holds a row for every runtime web/page/runtimes.json names but the page's own, and serves its package."""
    rows = json.loads(table.read_text(encoding="utf-8"))
    expected = set(rows) - {OWN_RUNTIME}
    if set(FILES) != expected:
        raise RuntimeFilesError(f"web/runtime_dist.py's FILES names {sorted(FILES)}, runtimes.json {sorted(expected)}")
    for runtime, served in FILES.items():
        if served and rows[runtime]["package"] not in {package for package, _ in served.values()}:
            raise RuntimeFilesError(f"{runtime}'s files do not come from its package {rows[runtime]['package']}")


def stage(dest: Path, npm: ModuleType, lockfile: Path = LOCKFILE, table: Path = RUNTIMES_TABLE) -> dict[str, str]:
    """Write the runtimes' shipped files, from each package's verified tarball, into `dest` (replacing what was
    there); `npm` is web/ort_dist.py (its `pinned`, `tarball` and `extract`). Returns each package's version."""
    _check_table(table)
    wanted = shipped_files()
    folders = [shipped_folder(package) for package in wanted]
    if len(set(folders)) != len(folders):
        raise RuntimeFilesError(f"two packages would share a folder in the wheel: {sorted(wanted)}")
    locked = json.loads(lockfile.read_text(encoding="utf-8"))["packages"]
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    source = {}
    for package, paths in sorted(wanted.items()):
        pin = npm.pinned(lockfile, lock_key(package, locked))
        data, origin = npm.tarball(pin)
        folder = dest / shipped_folder(package)
        missing = npm.extract(data, {path: folder / path for path in sorted(paths)})
        if missing is not None:
            raise RuntimeFilesError(f"{pin.package} {pin.version}'s tarball lacks {missing} (FILES names it)")
        source[package] = {"version": pin.version, "integrity": pin.integrity, "from": origin, "files": sorted(paths)}
    (dest / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    return {package: entry["version"] for package, entry in source.items()}
