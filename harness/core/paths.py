"""Whether an output path can be written, asked before a run measures anything: a report directory
that is a file, or a read-only one, must not cost a whole run before it is found out.

Each check creates nothing that outlives it (an anonymous temporary file at most), and asks the
file system itself rather than the permission bits: root passes every permission check, but not
a read-only mount. And the one sanitized form of a file name made from stored text (safe_name), kept
inside its folder (inside).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from harness.core.bounds import MAX_NAME_CHARS


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


# --- file names made from stored text --------------------------------------------------------------
# A run id (or any stored text) that names a file may come from a bundle made elsewhere: it must not
# climb out of its folder (`../../victim`), hide itself (a leading dot) or carry bytes a file system or
# shell chokes on. One sanitized form for every such name; two different ids never share it.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_HASH_CHARS = 10


class UnsafePathError(ValueError):
    """A file name made from stored text that would resolve outside its output folder."""


def safe_name(text: str) -> str:
    """`text` as a file name: only [A-Za-z0-9._-], no leading dot, at most MAX_NAME_CHARS; when that
    changed anything, a short hash of the original is appended so two ids never collide."""
    kept = _UNSAFE.sub("_", text).lstrip(".")
    if kept == text and 0 < len(kept) <= MAX_NAME_CHARS:
        return kept
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return f"{kept[: MAX_NAME_CHARS - _HASH_CHARS - 1]}-{digest}" if kept else digest


def inside(directory: Path, name: str) -> Path:
    """directory/name, refused (UnsafePathError) unless it resolves, symlinks followed, inside directory."""
    folder = Path(directory).resolve()
    path = (folder / name).resolve()
    if path == folder or not path.is_relative_to(folder):
        raise UnsafePathError(f"the file name '{name}' would be written outside {directory}; refused")
    return Path(directory) / name
