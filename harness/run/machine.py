"""Which machine a run was made on: an id that is not its hostname, a label the user may set, and the
GPU driver's major version (the rest of the hardware class is in the run row: harness.store).

The id is a hash of hardware facts and the store's random salt (Store.machine_salt): stable for one
machine writing to one store, not derivable from the facts alone, and unchanged by a rename."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil

from harness.run.provenance import cpu_model

LABEL_ENV = "ACCELHARNESS_MACHINE_LABEL"
LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LABEL_RULE = "1 to 64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit"


def check_machine_label(label: str | None, where: str = "--machine-label") -> None:
    """Refuse a label that could not name a report column or a file: ValueError naming the rule."""
    if label is not None and not LABEL_PATTERN.fullmatch(label):
        raise ValueError(f"{where} '{label[:80]}' is not a machine label: {LABEL_RULE}")


def machine_label(given: str | None) -> str | None:
    """The label a run records: the one given, else ACCELHARNESS_MACHINE_LABEL, else none."""
    label = given if given is not None else (os.environ.get(LABEL_ENV) or None)
    check_machine_label(label, "--machine-label" if given is not None else LABEL_ENV)
    return label


def _nvidia_gpus() -> list[tuple[str, str]]:
    """(name, driver version) of each NVIDIA GPU nvidia-smi lists; none without the tool."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        listed = subprocess.run(
            [tool, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [tuple(part.strip() for part in line.split(",", 1)) for line in listed.splitlines() if "," in line]


def _machine_file() -> str:
    """The OS's own machine id (systemd, dbus), where readable: two identical servers differ by it."""
    for path in (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")):
        try:
            return path.read_text().strip()
        except OSError:
            continue
    return ""


def machine_facts(label: str | None, salt: str) -> dict[str, Any]:
    """machine_id, machine_label and gpu_driver_major for Store.start_run."""
    gpus = _nvidia_gpus()
    facts = {
        "cpu_model": cpu_model(),
        "cpu_threads": psutil.cpu_count(logical=True),
        "memory_bytes": psutil.virtual_memory().total,
        "architecture": platform.machine(),
        "system": platform.system(),
        "gpus": [name for name, _ in gpus],
        "machine_file": _machine_file(),
    }
    digest = hashlib.sha256((salt + json.dumps(facts, sort_keys=True)).encode()).hexdigest()
    drivers = sorted({driver.split(".")[0] for _, driver in gpus})
    return {
        "machine_id": digest[:16],
        "machine_label": machine_label(label),
        "gpu_driver_major": ", ".join(drivers) or None,
    }
