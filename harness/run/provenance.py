"""Facts about the machine and the code that every run records."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import psutil


@cache
def git_sha() -> str | None:
    """The harness checkout's commit (with '-dirty' when it has uncommitted changes), if any."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> dict[str, Any]:
    from harness import __version__

    return {
        "git_sha": git_sha(),
        "harness_version": __version__,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python_version": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_cores": psutil.cpu_count(logical=True),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 2),
        "load_avg_at_start": os.getloadavg(),
    }
