"""Where prepared files live: exports, their precision variants and each case's inputs and reference."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$ACCELHARNESS_CACHE_DIR, else $XDG_CACHE_HOME/accelharness, else ~/.cache/accelharness."""
    explicit = os.environ.get("ACCELHARNESS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "accelharness"
