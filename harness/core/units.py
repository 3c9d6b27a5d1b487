"""Units every part converts with: one definition each, so a megabyte is the same in every column."""

from __future__ import annotations

MB = 1024 * 1024  # bytes in a megabyte as the store's *_mb columns count them (MiB)
