"""The page runtimes' npm files (web/page/runtimes.json's rows other than onnxruntime-web): which ones the page may
load, where a checkout has them, and their versions.

Each runtime is served under /<token>/runtimes/<name>/<file> (web/server.py), from this closed set only:

- transformers.js: its self-contained browser bundle (dist/transformers.js, which carries its own onnxruntime-web,
  1.31.0-dev, not the harness's 1.30.0) and that onnxruntime-web's wasm binary and glue (the asyncify build, which
  the bundle runs on wasm and WebGPU alike), taken from the onnxruntime-web transformers.js depends on.
- llama.cpp (wllama): its ES module (the worker's code is inlined) and wasm binary (memory64 + JSPI), plus the
  compat build (@wllama/wllama-compat, no memory64, Asyncify) served locally, so a browser without memory64 or JSPI
  never makes wllama fetch it from a CDN.
- webllm: nothing (the page module answers `unsupported`: no TVM-compiled model library is given).

A checkout serves them from web/node_modules (`make setup` runs `npm ci`); a wheel does not ship them yet.
Standard library only, like web/ort_dist.py.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
NODE_MODULES = HERE / "node_modules"
TRANSFORMERS = "@huggingface/transformers"
WLLAMA = "@wllama/wllama"
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
    "webllm": {},
}


class RuntimeFilesError(RuntimeError):
    """A page runtime's npm files are not installed."""


def package_dir(package: str, root: Path = NODE_MODULES) -> Path:
    """Where a package lives; "<a> > <b>": b as a resolves it (a's own node_modules first, as Node does)."""
    parent, _, child = package.rpartition(" > ")
    if not parent:
        return root / package
    nested = root / parent / "node_modules" / child
    return nested if nested.is_dir() else root / child


def version(package: str, root: Path = NODE_MODULES) -> str | None:
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


def files(runtime: str, root: Path = NODE_MODULES) -> dict[str, Path]:
    """The runtime's served files by name; RuntimeFilesError (saying to run `make setup`) if any is missing."""
    if runtime not in FILES:
        raise RuntimeFilesError(f"'{runtime}' is not a page runtime with npm files ({', '.join(FILES)})")
    found = {name: package_dir(package, root) / path for name, (package, path) in FILES[runtime].items()}
    missing = [str(path) for path in found.values() if not path.is_file()]
    if missing:
        raise RuntimeFilesError(
            f"{runtime}'s npm files are not installed: {', '.join(missing)} missing; "
            "run `make setup` (it runs `cd web && npm ci`)"
        )
    mismatch = _check_transformers_ort(root) if runtime == "transformers.js" else None
    if mismatch:
        raise RuntimeFilesError(f"{mismatch}; run `make setup` (it runs `cd web && npm ci`)")
    return found


def problem(runtime: str, root: Path = NODE_MODULES) -> str | None:
    """Why the runtime's files cannot be served here, or None."""
    try:
        files(runtime, root)
    except RuntimeFilesError as exc:
        return str(exc)
    return None


def versions(runtime: str, root: Path = NODE_MODULES) -> dict[str, str | None]:
    """The installed version of each package the runtime's files come from, by package."""
    return {package.rpartition(" > ")[2]: version(package, root) for package, _ in FILES.get(runtime, {}).values()}
