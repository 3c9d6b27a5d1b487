"""Facts about the machine and the code that every run records."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

import psutil

from harness.core.git import git_sha


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
