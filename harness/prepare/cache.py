"""Where prepared files live: exports, their precision variants and each case's inputs and reference; and the
staging folders an export writes before it renames its result into place."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

EXPORTS = "onnx"  # cache_root()/onnx/<key>: one export each
STAGING_PREFIX = ".staging-"  # .staging-<pid>-<random>: an export being written by process <pid>
# A staging folder without a process id in its name (an older harness wrote it) is stale after this long.
UNOWNED_STALE_S = 24 * 3600.0


def cache_root() -> Path:
    """$ACCELHARNESS_CACHE_DIR, else $XDG_CACHE_HOME/accelharness, else ~/.cache/accelharness."""
    explicit = os.environ.get("ACCELHARNESS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "accelharness"


def exports_dir() -> Path:
    return cache_root() / EXPORTS


def staging_dir(parent: Path) -> Path:
    """A new staging folder in `parent` named after this process, once stale ones are gone."""
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(parent)
    return Path(tempfile.mkdtemp(dir=parent, prefix=f"{STAGING_PREFIX}{os.getpid()}-"))


def remove_stale_staging(parent: Path | None = None) -> list[Path]:
    """Remove the staging folders whose process is gone: an export killed mid-way (a timeout, SIGKILL, Ctrl-C
    killing its worker's group) never reaches its own cleanup. Returns what was removed."""
    parent = parent or exports_dir()
    removed = []
    for path in parent.glob(f"{STAGING_PREFIX}*") if parent.is_dir() else []:
        owner = path.name.removeprefix(STAGING_PREFIX).split("-")[0]
        if owner.isdigit() and _alive(int(owner)):
            continue
        if not owner.isdigit() and time.time() - path.stat().st_mtime < UNOWNED_STALE_S:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) said it exists
    return state != "Z"
