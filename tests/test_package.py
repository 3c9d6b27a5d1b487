"""The package as a user gets it: sdist -> wheel -> a new venv outside the checkout -> `accelharness web`.

Installing the wheel's dependencies afresh writes 2.3 GB (torch, OpenVINO, ORT, ...) and took 6
minutes here, most of the CI budget. So the new venv sees, through a .pth overlay, exactly the
distributions the wheel's base requirements reach (no extras, no test tools, not the checkout's own
editable install) from this venv's site-packages, and pip installs the wheel into it with no index:
a base requirement the wheel forgot, or an import of an extra, fails here as it would for a user.
`make wheel-check` does the full install from the package indexes instead.

Everything the installed copy runs is run from a folder outside the checkout, and checked to come from
the new venv: every command's --help, every module's import, the page runtimes' files it serves, a native run
and its bundle's round trip (export --bundle -> import -> merge -> report, --machine).
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness.web import ort_dist, runtime_dist

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("native", "models", "web")  # top-level folders installed as harness.<name> (setup.py)
# Top-level modules of the optional extras ([jax], [ray], [genai], [cuda], [webgpu]): absent from the base install.
EXTRA_MODULES = {"jax", "flax", "ray", "onnxruntime_genai", "pynvml", "onnxruntime_ep_webgpu"}
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
    done = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    (out / "build.log").write_text(done.stdout + done.stderr)
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The user's environment: none of the checkout's paths, and one export cache the installed copy
    fills itself (the wasm case and the native run share bert-tiny's export)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ACCELHARNESS_CACHE_DIR"] = str(tmp_path_factory.mktemp("user-cache"))
    return env


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


def locked_pins() -> dict[str, tuple[str, str]]:
    """(version, integrity) web/package-lock.json pins for each package whose files the page runtimes serve."""
    locked = json.loads(ort_dist.LOCKFILE.read_text())["packages"]
    pins = {p: ort_dist.pinned(key=runtime_dist.lock_key(p, locked)) for p in runtime_dist.shipped_files()}
    return {package: (pin.version, pin.integrity) for package, pin in pins.items()}


def test_wheel_carries_the_page_and_exactly_the_npm_files_it_loads(built: tuple[Path, Path], tmp_path: Path) -> None:
    wheel, sdist = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        source = json.loads(archive.read("harness/web/ort/SOURCE.json"))
        runtimes_source = json.loads(archive.read("harness/web/npm/SOURCE.json"))
        archive.extractall(tmp_path, [n for n in names if n.startswith("harness/web/npm/")])
    shipped = {n.removeprefix("harness/web/ort/") for n in names if n.startswith("harness/web/ort/")}
    assert shipped == {*ort_dist.required_files(), "SOURCE.json"}
    page = ROOT / "web" / "page"  # every file of it, its runtimes/ folder's page modules too
    assert {f"harness/web/page/{f.relative_to(page).as_posix()}" for f in page.rglob("*") if f.is_file()} <= names
    assert {"harness/web/page/index.html", "harness/web/page/runtimes/wllama.mjs"} <= names
    assert (source["version"], source["integrity"]) == (ort_dist.pinned().version, ort_dist.pinned().integrity)
    # The other page runtimes' files: exactly those runtime_dist.FILES names (and each package's package.json),
    # laid out where runtime_dist finds them, each from the tarball the lockfile pins.
    wanted = runtime_dist.shipped_files()
    npm = {n.removeprefix("harness/web/npm/") for n in names if n.startswith("harness/web/npm/")}
    expected = {f"{runtime_dist.shipped_folder(p)}/{path}" for p, paths in wanted.items() for path in paths}
    assert npm == expected | {"SOURCE.json"}
    assert {p: (e["version"], e["integrity"]) for p, e in runtimes_source.items()} == locked_pins()
    shipped_root = tmp_path / "harness" / "web" / "npm"  # what runtime_dist reads in an installed wheel
    for runtime, served in runtime_dist.FILES.items():
        assert set(runtime_dist.files(runtime, shipped_root)) == set(served)  # every one found, none missing
        assert runtime_dist.versions(runtime, shipped_root) == {  # read from the staged package.json
            package.rpartition(" > ")[2]: locked_pins()[package][0] for package, _ in served.values()
        }
    assert wheel.stat().st_size < 40e6  # ORT-web's nine files and the runtimes' eleven, compressed: ~31.6 MB
    assert not any("node_modules" in n for n in names)
    assert sdist.stat().st_size < 2e6  # source only: the wheel's build fetches ORT-web's tarball


def test_installed_wheel_runs_a_wasm_case_outside_the_checkout(
    installed: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    env = user_env
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


def build_log(wheel: Path) -> str:
    return (wheel.parent / "build.log").read_text()


def tree_modules() -> set[str]:
    """Every module file of every package in the checkout, as its path inside the wheel."""
    found = set()
    for top in ("harness", *MAPPED):
        for init in (ROOT / top).rglob("__init__.py"):
            if "node_modules" in init.parts:
                continue
            inside = init.parent.relative_to(ROOT / top).parts
            if all((ROOT / top).joinpath(*inside[:depth], "__init__.py").exists() for depth in range(len(inside))):
                prefix = "/".join(["harness", *([top] if top != "harness" else []), *inside])
                found |= {f"{prefix}/{module.name}" for module in init.parent.glob("*.py")}
    return found


def test_wheel_carries_every_package_of_the_tree(built: tuple[Path, Path]) -> None:
    # A hand-written package list once left harness/bundle/ out: export --bundle, import, merge and
    # --machine then failed with a missing module in a pip-installed harness.
    wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = tree_modules()
    assert {"harness/bundle/importer.py", "harness/native/base.py", "harness/web/server.py"} <= expected
    assert expected - names == set(), "modules of the tree missing from the wheel"
    assert {n for n in names if n.endswith(".py")} - expected == set(), "modules in the wheel that the tree lacks"
    # setuptools still copies a package it was not told of as the data of its parent, warning that it will
    # stop: harness.bundle reached the wheel only that way. Only a folder of data (web/page, its runtimes/) may be
    # warned of.
    warned = re.findall(r"Package '([\w.]+)' is absent from the `packages` configuration", build_log(wheel))
    code = [name for name in warned if any(f.startswith(name.replace(".", "/") + "/") for f in expected)]
    assert code == [], f"packages found only by setuptools' fallback: {code}"


# Run by the installed venv's Python: what the installed copy serves of each page runtime, and from where.
RUNTIMES_PROBE = """
import json
from harness.web import runtime_dist, server
served = server.runtime_files()
print(json.dumps({"root": str(runtime_dist.dist_root()),
                  "problems": {r: runtime_dist.problem(r) for r in runtime_dist.FILES},
                  "versions": {r: runtime_dist.versions(r) for r in runtime_dist.FILES},
                  "served": {r: {n: str(p) for n, p in files.items()} for r, files in served.items()}}))
"""


def test_installed_wheel_serves_the_page_runtimes_files(
    installed: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    # Before the wheel carried them, every transformers.js and llama.cpp row of an installed copy was `unsupported`.
    probe = json.loads(run(installed / "python", "-c", RUNTIMES_PROBE, cwd=tmp_path, env=user_env).stdout)
    site = next(installed.parent.glob("lib/python3*/site-packages"))
    assert probe["root"] == str(site / "harness" / "web" / "npm")
    assert probe["problems"] == dict.fromkeys(runtime_dist.FILES), probe["problems"]
    assert probe["versions"] == {r: runtime_dist.versions(r) for r in runtime_dist.FILES}  # the checkout's npm ci
    pins = {package.rpartition(" > ")[2]: version for package, (version, _) in locked_pins().items()}
    assert all(version == pins[p] for found in probe["versions"].values() for p, version in found.items())
    assert {r: set(files) for r, files in probe["served"].items()} == {r: set(f) for r, f in runtime_dist.FILES.items()}
    assert all(path.startswith(probe["root"]) for files in probe["served"].values() for path in files.values())

    # An install that lost one of them: that runtime's rows say what is missing and to reinstall.
    Path(probe["served"]["llama.cpp"]["compat-wllama.wasm"]).unlink()
    probe = json.loads(run(installed / "python", "-c", RUNTIMES_PROBE, cwd=tmp_path, env=user_env).stdout)
    assert "wllama-compat/wasm/wllama.wasm missing" in probe["problems"]["llama.cpp"]
    assert "reinstall" in probe["problems"]["llama.cpp"] and probe["problems"]["transformers.js"] is None


# Run by the installed venv's Python: every command's --help through the installed app, every module
# imported; prints what failed and where each module came from, as JSON.
PROBE = """
import importlib, json, pkgutil, sys
from typer.testing import CliRunner
import harness
from harness.cli import app
from harness.cli.reference import commands
runner = CliRunner()
helps = {}
for name in commands():
    done = runner.invoke(app, [*name.split(), "--help"])
    helps[name] = [done.exit_code, done.output[-400:] if done.exit_code else ""]
imported, missing = {"harness": harness.__file__}, {}
for info in pkgutil.walk_packages(harness.__path__, "harness."):
    if info.name.endswith(".__main__"):  # runs the app
        continue
    try:
        imported[info.name] = importlib.import_module(info.name).__file__
    except ModuleNotFoundError as exc:
        missing[info.name] = exc.name
print(json.dumps({"helps": helps, "imported": imported, "missing": missing}))
"""


def test_installed_wheel_helps_every_command_and_imports_every_module(
    installed: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    from harness.cli.reference import commands

    done = run(installed / "python", "-c", PROBE, cwd=tmp_path, env=user_env)
    probe = json.loads(done.stdout.splitlines()[-1])
    assert set(probe["helps"]) == set(commands()), "the installed app's commands differ from the checkout's"
    assert {name: help for name, help in probe["helps"].items() if help[0] != 0} == {}
    site = next(installed.parent.glob("lib/python3*/site-packages"))
    assert all(path.startswith(str(site)) for path in probe["imported"].values()), probe["imported"]
    mains = {m for m in tree_modules() if m.endswith("/__main__.py")}
    assert len(probe["imported"]) + len(probe["missing"]) == len(tree_modules() - mains)
    assert set(probe["missing"].values()) <= EXTRA_MODULES, probe["missing"]  # only an extra may be absent
    for name in ("", "import", "export", "merge"):  # and the console script itself
        run(installed / "accelharness", *name.split(), "--help", cwd=tmp_path, env=user_env)


# slow: CI's installed-wheel checks are the wasm case and every command's --help; bundles round-trip in test_bundle*
@pytest.mark.slow
def test_installed_wheel_round_trips_a_bundle_outside_the_checkout(
    installed: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return run(installed / "accelharness", *args, cwd=tmp_path, env=user_env)

    # --no-reports: the report read below is `report`'s
    cli("native", "--model", "bert-tiny", "--engines", "onnxruntime", "--batch-sizes", "1", "--sequence-lengths",
        "8", "--iterations", "3", "--warmup", "0", "--min-duration", "0", "--machine-label", "wheel-user",
        "--db", "a.duckdb", "--no-reports", "--output-dir", "out")  # fmt: skip
    cli("export", "--bundle", "a.zip", "--db", "a.duckdb")
    cli("import", "a.zip", "--db", "b.duckdb")
    cli("merge", "a.duckdb", "b.duckdb", "--db", "m.duckdb")
    cli("report", "--run", "latest", "--db", "b.duckdb", "--output-dir", "rep", "--format", "json")
    cli("recommend", "--model", "bert-tiny", "--machine", "wheel-user", "--db", "m.duckdb")
    query = "SELECT r.status, r.engine, u.machine_label FROM results r JOIN runs u USING (run_id)"
    for store in ("b.duckdb", "m.duckdb"):
        rows = json.loads(cli("query", "--db", store, "--format", "json", "--sql", query).stdout)
        assert rows == [{"status": "ok", "engine": "onnxruntime", "machine_label": "wheel-user"}], (store, rows)
    (report,) = (tmp_path / "rep").glob("*.json")
    (result,) = json.loads(report.read_text())["results"]
    assert result["status"] == "ok"
