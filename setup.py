"""The two build steps pyproject.toml cannot declare: the package list, and the npm files the page loads.

The packages are found, never listed: every directory with an __init__.py under harness/, and under the
top-level native/, models/ and web/ (the design card) installed as harness.native, harness.models and
harness.web, so they cannot collide with other distributions' `native` or `models`. A hand-written list
once left harness.bundle out of the wheel (tests/test_package.py checks the wheel against the tree).

build_py stages onnxruntime-web's into harness/web/ort/ (web/ort_dist.py) and the other page runtimes' into
harness/web/npm/ (web/runtime_dist.py), each from the npm tarball web/package-lock.json pins, verified against
its integrity hash. An editable install skips it: a checkout serves them from web/node_modules.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Top-level folders that install under the harness namespace.
MAPPED = ("native", "models", "web")


def _packages() -> tuple[list[str], dict[str, str]]:
    """Every package of the tree, and where the mapped ones live."""
    packages = find_packages(where=str(ROOT), include=["harness", "harness.*"])
    package_dir = {"harness": "harness"}
    for top in MAPPED:
        for name in ["", *find_packages(where=str(ROOT / top))]:
            dotted = ".".join(filter(None, ["harness", top, name]))
            packages.append(dotted)
            package_dir[dotted] = "/".join(filter(None, [top, *name.split(".")]))
    return sorted(packages), package_dir


def _web_module(name: str):
    # Loaded by path: the harness package and its dependencies are not installed while it builds.
    spec = importlib.util.spec_from_file_location(f"_accelharness_{name}", ROOT / "web" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class BuildPyWithNpm(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            web = Path(self.build_lib) / "harness" / "web"
            ort_dist, runtime_dist = _web_module("ort_dist"), _web_module("runtime_dist")
            pin = ort_dist.stage(web / "ort")
            print(f"staged {ort_dist.PACKAGE} {pin.version} ({pin.integrity[:19]}…) into harness/web/ort")
            staged = runtime_dist.stage(web / "npm", ort_dist)
            print(f"staged {', '.join(f'{p} {v}' for p, v in staged.items())} into harness/web/npm")


PACKAGES, PACKAGE_DIR = _packages()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR, cmdclass={"build_py": BuildPyWithNpm})
