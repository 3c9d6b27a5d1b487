"""The one build step pyproject.toml cannot declare: the wheel carries onnxruntime-web's files for the page.

build_py stages them into harness/web/ort/ from the npm tarball web/package-lock.json pins, verified
against its integrity hash (web/ort_dist.py). An editable install skips it: a checkout serves them
from web/node_modules.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _ort_dist():
    # Loaded by path: the harness package and its dependencies are not installed while it builds.
    spec = importlib.util.spec_from_file_location("_accelharness_ort_dist", ROOT / "web" / "ort_dist.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class BuildPyWithOrt(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            ort_dist = _ort_dist()
            pin = ort_dist.stage(Path(self.build_lib) / "harness" / "web" / "ort")
            print(f"staged {ort_dist.PACKAGE} {pin.version} ({pin.integrity[:19]}…) into harness/web/ort")


setup(cmdclass={"build_py": BuildPyWithOrt})
