"""Whether an output path can be written, asked before a run measures anything: a report directory
that is a file, or a read-only one, must not cost a whole run before it is found out.

Each check creates nothing that outlives it (an anonymous temporary file at most), and asks the
file system itself rather than the permission bits: root passes every permission check, but not
a read-only mount.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _nearest_existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists: where creating it would start."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _can_create_in(directory: Path) -> str | None:
    """Why no file can be created in the existing `directory`, or None."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as exc:
        return f"{directory} is not writable ({exc.strerror or exc})"


def unwritable_directory(path: Path) -> str | None:
    """Why files cannot be written in directory `path` (created with its parents when missing), or None."""
    existing = _nearest_existing(Path(path))
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    return _can_create_in(existing)


def unwritable_file(path: Path) -> str | None:
    """Why file `path` cannot be written (created, with its parents, when missing), or None."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory, not a file"
    if not path.exists():
        return unwritable_directory(path.parent)
    try:  # opened for appending and closed: its bytes and times stay as they are
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        return f"{path} is not writable ({exc.strerror or exc})"
    return None
