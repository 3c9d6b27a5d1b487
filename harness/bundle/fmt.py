"""The bundle file: a zip (stored, not compressed: Parquet is) of one Parquet file per run table and
manifest.json, and every check a bundle passes before a store is touched.

A bundle is data from another machine: its size, member count and names, the manifest's shape and
versions, each file's sha256 and row count are checked, and its tables against the schema it names,
before anything is written; a failed check is a BundleError naming the file and what was wrong."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from harness.store import RUN_TABLES, SCHEMA_VERSION, StoreError

BUNDLE_FORMAT = 1  # the version of this layout; a bundle with a higher one is refused
MANIFEST = "manifest.json"
MEMBERS = {f"{table}.parquet": table for table in RUN_TABLES}
REQUIRED = ("runs", "results", "samples")
MAX_MANIFEST_BYTES = 64 * 2**20
MAX_MEMBER_BYTES = 16 * 2**30  # one table's Parquet file
MAX_RUNS = 100_000  # runs named by one manifest
REDACTIONS = ("public",)


class BundleError(StoreError):
    """A bundle that cannot be exported or imported as asked: bad, damaged, newer, or in conflict."""


@dataclass
class Bundle:
    """A checked bundle: its manifest, and its Parquet files extracted under `directory`."""

    path: Path
    sha256: str
    manifest: dict[str, Any]
    files: dict[str, Path]  # table -> extracted Parquet file

    @property
    def schema_version(self) -> int:
        return self.manifest["schema_version"]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def write_bundle(path: Path, manifest: dict[str, Any], files: dict[str, Path]) -> None:
    """Write the zip through a temporary name, renamed into place: never a half bundle at `path`."""
    partial = path.with_name(path.name + ".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(MANIFEST, json.dumps(manifest, indent=2, default=str))
        for table, file in files.items():
            archive.write(file, f"{table}.parquet")
    partial.replace(path)


def read_bundle(path: Path, directory: Path) -> Bundle:
    """Check the bundle at `path` and extract its tables into `directory`; BundleError if anything is off."""
    if not path.is_file():
        raise BundleError(f"no bundle at {path}")
    if not zipfile.is_zipfile(path):
        raise BundleError(f"{path} is not an accelharness bundle (not a zip file)")
    try:
        with zipfile.ZipFile(path) as archive:
            return _read(path, archive, directory)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise BundleError(f"{path} is damaged: {exc}") from None


def _read(path: Path, archive: zipfile.ZipFile, directory: Path) -> Bundle:
    members = {info.filename: info for info in archive.infolist()}
    unknown = sorted(set(members) - set(MEMBERS) - {MANIFEST})
    if unknown or MANIFEST not in members:
        raise BundleError(
            f"{path} is not an accelharness bundle: it holds {', '.join(unknown[:5]) or 'no ' + MANIFEST}; a bundle "
            f"holds {MANIFEST} and {', '.join(MEMBERS)}"
        )
    too_big = [
        n for n, i in members.items() if i.file_size > (MAX_MANIFEST_BYTES if n == MANIFEST else MAX_MEMBER_BYTES)
    ]
    if too_big:
        raise BundleError(
            f"{path}: {too_big[0]} is larger than a bundle member may be ({members[too_big[0]].file_size} bytes)"
        )
    damaged = archive.testzip()
    if damaged is not None:
        raise BundleError(f"{path} is damaged: {damaged} fails its CRC check; nothing was imported")
    manifest = _manifest(path, archive.read(MANIFEST))
    listed = set(manifest["files"])
    present = set(members) - {MANIFEST}
    if listed != present:
        raise BundleError(f"{path} is damaged: its manifest lists {sorted(listed)}, the bundle holds {sorted(present)}")
    files = {}
    for name in sorted(present):
        target = directory / name  # our own name: never a path from the archive
        with archive.open(name) as source, open(target, "wb") as sink:
            while chunk := source.read(2**20):
                sink.write(chunk)
        _check_file(path, name, target, manifest["files"][name])
        files[MEMBERS[name]] = target
    return Bundle(path, file_sha256(path), manifest, files)


def _manifest(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleError(f"{path} is damaged: its {MANIFEST} is not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path} is damaged: its {MANIFEST} is not an object")
    version, schema = manifest.get("bundle_format"), manifest.get("schema_version")
    if not isinstance(version, int) or not isinstance(schema, int) or version < 1 or schema < 1:
        raise BundleError(f"{path}: {MANIFEST} needs whole numbers bundle_format and schema_version >= 1")
    if version > BUNDLE_FORMAT:
        raise BundleError(
            f"{path} is bundle format {version}; this accelharness reads format {BUNDLE_FORMAT}: "
            "upgrade accelharness to import it"
        )
    if schema > SCHEMA_VERSION:
        raise BundleError(
            f"{path} was exported from a newer store (schema version {schema}; this accelharness reads 1-"
            f"{SCHEMA_VERSION}): upgrade accelharness to import it"
        )
    files, runs = manifest.get("files"), manifest.get("runs")
    if not isinstance(files, dict) or not isinstance(runs, list) or len(runs) > MAX_RUNS:
        raise BundleError(f"{path}: {MANIFEST} needs 'files' (an object) and 'runs' (a list of at most {MAX_RUNS})")
    for name, entry in files.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not isinstance(entry.get("rows"), int)
        ):
            raise BundleError(
                f"{path}: {MANIFEST} entry for '{str(name)[:80]}' needs sha256 (text) and rows (a number)"
            )
    missing = [table for table in REQUIRED if f"{table}.parquet" not in files]
    if missing:
        raise BundleError(f"{path} is damaged: it has no {', '.join(missing)} table")
    return manifest


def _check_file(path: Path, name: str, file: Path, entry: dict[str, Any]) -> None:
    digest = file_sha256(file)
    if digest != entry["sha256"]:
        raise BundleError(f"{path} is damaged: {name}'s sha256 is {digest}, its manifest says {entry['sha256']}")
    try:
        rows = pq.ParquetFile(file).metadata.num_rows
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet
        raise BundleError(f"{path} is damaged: {name} is not a Parquet file ({exc})") from None
    if rows != entry["rows"]:
        raise BundleError(f"{path} is damaged: {name} holds {rows} rows, its manifest says {entry['rows']}")
