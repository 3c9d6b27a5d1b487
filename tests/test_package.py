"""The package as a user gets it: sdist -> wheel -> a new venv outside the checkout -> `accelharness web`.

Installing the wheel's dependencies afresh writes 2.3 GB (torch, OpenVINO, ORT, ...) and took 6
minutes here, most of the CI budget. So the new venv sees, through a .pth overlay, exactly the
distributions the wheel's base requirements reach (no extras, no test tools, not the checkout's own
editable install) from this venv's site-packages, and pip installs the wheel into it with no index:
a base requirement the wheel forgot, or an import of an extra, fails here as it would for a user.
`make wheel-check` does the full install from the package indexes instead.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness.web import ort_dist

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def requirement_closure(requirements: list[str]) -> set[str]:
    """Every distribution `requirements` reach (with the extras they name), by canonical name."""
    seen: set[tuple[str, str]] = set()
    todo = [(text, "") for text in requirements]
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        dist = metadata.distribution(req.name)
        for wanted in ("", *sorted(req.extras)):
            key = (canonicalize_name(req.name), wanted)
            if key not in seen:
                seen.add(key)
                todo += [(child, wanted) for child in dist.requires or []]
    return {name for name, _ in seen}


def overlay(names: set[str], into: Path) -> None:
    """Symlinks to each named distribution's top-level files (its modules and its .dist-info)."""
    into.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            link = into / top
            if not link.exists():
                link.symlink_to(Path(dist.locate_file(top)))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the sdist) built the way `python -m build` does: the wheel from the sdist."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


@pytest.fixture(scope="module")
def installed(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv (outside the checkout) with the wheel installed; returns its bin/."""
    wheel, _ = built
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=home)
    with zipfile.ZipFile(wheel) as archive:
        meta = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    site = next((venv / "lib").glob("python3*/site-packages"))
    overlay(requirement_closure(requires), home / "base")
    (site / "base-requirements.pth").write_text(f"{home / 'base'}\n")
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python"]
    run(*pip, "install", "--no-index", "--no-compile", "--find-links", wheel.parent, "accelharness", cwd=home)
    run(*pip, "check", cwd=home)
    return venv / "bin"


def test_wheel_carries_the_page_and_exactly_the_ort_files_it_loads(built: tuple[Path, Path]) -> None:
    wheel, sdist = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        source = json.loads(archive.read("harness/web/ort/SOURCE.json"))
    shipped = {n.removeprefix("harness/web/ort/") for n in names if n.startswith("harness/web/ort/")}
    assert shipped == {*ort_dist.required_files(), "SOURCE.json"}
    assert {"harness/web/page/index.html", "harness/web/page/runner.mjs", "harness/web/page/eps.json"} <= names
    assert (source["version"], source["integrity"]) == (ort_dist.pinned().version, ort_dist.pinned().integrity)
    assert wheel.stat().st_size < 25e6  # nine files of 139 MB, compressed: ~17.5 MB
    assert not any("node_modules" in n for n in names)
    assert sdist.stat().st_size < 2e6  # source only: the wheel's build fetches ORT-web's tarball


def test_installed_wheel_runs_a_wasm_case_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ACCELHARNESS_CACHE_DIR"] = str(tmp_path / "cache")  # exported by the installed copy itself
    where = run(installed / "python", "-c", "import harness; print(harness.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(installed.parent)), where.stdout
    run(
        installed / "accelharness", "web", "--model", "bert-tiny", "--hardware", "wasm", "--threads", "1",
        "--batch-sizes", "1", "--sequence-lengths", "8", "--iterations", "3", "--warmup", "0",
        "--min-duration", "0", "--db", "w.duckdb", "--output-dir", "out", cwd=tmp_path, env=env,
    )  # fmt: skip
    query = "SELECT status, engine, details->>'ort_web_version' AS ort_web, error FROM results"
    rows = run(installed / "accelharness", "query", "--db", "w.duckdb", "--format", "json", "--sql", query,
               cwd=tmp_path, env=env)  # fmt: skip
    (row,) = json.loads(rows.stdout)
    assert (row["status"], row["engine"], row["ort_web"]) == ("ok", "onnxruntime-web", ort_dist.pinned().version), row
    assert (tmp_path / "out").is_dir()

    # An install that lost a file ORT-web needs says what is missing and what to do, exit 2, nothing written.
    lost = next(installed.parent.glob("lib/python3*/site-packages/harness/web/ort")) / "ort-wasm-simd-threaded.wasm"
    lost.unlink()
    broken = subprocess.run(
        [installed / "accelharness", "web", "--model", "bert-tiny", "--hardware", "wasm", "--db", "b.duckdb"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert "ort-wasm-simd-threaded.wasm" in broken.stderr + broken.stdout
    assert "reinstall" in broken.stderr + broken.stdout
    assert not (tmp_path / "b.duckdb").exists()
