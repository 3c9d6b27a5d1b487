"""The bundle file: a zip (stored, not compressed: Parquet is) of one Parquet file per run table and
manifest.json, and every check of the file before a store is touched.

A bundle is data from another machine, bounded before it is read (harness.core.bounds): its size, its
members (each named once, stored: a compressed member is refused before a byte is inflated), the
manifest's shape, versions and declared sizes and row counts, each file's CRC, sha256 and Parquet row
count, before anything is written; a failed check is a BundleError naming the file and what was wrong.
Its rows are checked once staged (harness.bundle.checks)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from harness.core.bounds import MAX_BUNDLE_BYTES, MAX_BUNDLE_ROWS, MAX_MANIFEST_BYTES, MAX_RUNS
from harness.core.terminal import quoted_text, terminal_text
from harness.store import RUN_TABLES, SCHEMA_VERSION, StoreError

BUNDLE_FORMAT = 1  # the version of this layout; a bundle with a higher one is refused
MANIFEST = "manifest.json"
MEMBERS = {f"{table}.parquet": table for table in RUN_TABLES}
REQUIRED = ("runs", "results", "samples")
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
    size = path.stat().st_size
    if size > MAX_BUNDLE_BYTES:
        raise BundleError(f"{path} is {size:,} bytes; a bundle is at most {MAX_BUNDLE_BYTES:,}")
    if not zipfile.is_zipfile(path):
        raise BundleError(f"{path} is not an accelharness bundle (not a zip file)")
    try:
        _count_members(path)
        with zipfile.ZipFile(path) as archive:
            return _read(path, archive, directory)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise BundleError(f"{path} is damaged: {exc}") from None


def _count_members(path: Path) -> None:
    """How many members the zip's end record declares, read before ZipFile() parses its directory (a
    1 GiB directory of millions of empty members would be millions of objects in memory)."""
    with open(path, "rb") as handle:
        end = zipfile._EndRecData(handle)  # the stdlib reader of that record (zip64 too)
    if end is None:
        raise BundleError(f"{path} is not an accelharness bundle (not a zip file)")
    count = end[zipfile._ECD_ENTRIES_TOTAL]
    if count > len(MEMBERS) + 1:
        raise BundleError(f"{path} holds {count:,} members; a bundle holds at most {len(MEMBERS) + 1}")


def _members(path: Path, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The archive's members, each named once, stored (as write_bundle writes them: never inflated
    here, so a member's bytes are bytes of the file, bounded by its size) and within its bound."""
    infos = archive.infolist()
    names = [info.filename for info in infos]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise BundleError(f"{path} is damaged: it holds {shown_name(twice[0])} twice; a bundle holds each member once")
    members = {info.filename: info for info in infos}
    unknown = sorted(set(members) - set(MEMBERS) - {MANIFEST})
    if unknown or MANIFEST not in members:
        holds = ", ".join(map(shown_name, unknown[:5])) or f"no {MANIFEST}"
        raise BundleError(
            f"{path} is not an accelharness bundle: it holds {holds}; a bundle holds {MANIFEST} and "
            f"{', '.join(MEMBERS)}"
        )
    for name, info in members.items():
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise BundleError(
                f"{path}: {name} is compressed (zip method {info.compress_type}, {info.compress_size:,} bytes for "
                f"{info.file_size:,}); a bundle's members are stored, as export --bundle writes them"
            )
    if members[MANIFEST].file_size > MAX_MANIFEST_BYTES:
        raise BundleError(
            f"{path}: {MANIFEST} is {members[MANIFEST].file_size:,} bytes; at most {MAX_MANIFEST_BYTES:,}"
        )
    return members


def shown_name(name: str) -> str:
    """A member name from an archive, as a message may show it."""
    return quoted_text(name, 80)


def _read(path: Path, archive: zipfile.ZipFile, directory: Path) -> Bundle:
    members = _members(path, archive)
    manifest = _manifest(path, archive.read(MANIFEST))
    listed = set(manifest["files"])
    present = set(members) - {MANIFEST}
    if listed != present:
        lists = ", ".join(sorted(map(shown_name, listed))[:10])
        raise BundleError(
            f"{path} is damaged: its manifest lists {lists}; the bundle holds {', '.join(sorted(present))}"
        )
    for name in present:
        if manifest["files"][name]["bytes"] != members[name].file_size:
            raise BundleError(
                f"{path} is damaged: {name} is {members[name].file_size:,} bytes, its manifest says "
                f"{manifest['files'][name]['bytes']:,}"
            )
    damaged = archive.testzip()
    if damaged is not None:
        raise BundleError(f"{path} is damaged: {damaged} fails its CRC check; nothing was imported")
    files, data = {}, 0
    for name in sorted(present):
        target = directory / name  # our own name: never a path from the archive
        _extract(archive, members[name], target)
        data += _check_file(path, name, target, manifest["files"][name])
        if data > MAX_BUNDLE_BYTES:
            raise BundleError(
                f"{path}: its tables hold {data:,} bytes of data once decompressed (by {name}); a bundle's tables "
                f"hold at most {MAX_BUNDLE_BYTES:,}"
            )
        files[MEMBERS[name]] = target
    return Bundle(path, file_sha256(path), manifest, files)


def _extract(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """Copy a member out in chunks, never more than its declared size."""
    left = info.file_size
    with archive.open(info) as source, open(target, "wb") as sink:
        while left > 0 and (chunk := source.read(min(2**20, left))):
            sink.write(chunk)
            left -= len(chunk)


def _manifest(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleError(f"{path} is damaged: its {MANIFEST} is not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path} is damaged: its {MANIFEST} is not an object")
    version, schema = manifest.get("bundle_format"), manifest.get("schema_version")
    if type(version) is not int or type(schema) is not int or version < 1 or schema < 1:  # bool is an int
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
            or type(entry.get("rows")) is not int
            or type(entry.get("bytes")) is not int
            or not 0 <= entry["rows"] <= MAX_BUNDLE_ROWS
        ):
            raise BundleError(
                f"{path}: {MANIFEST} entry for {shown_name(str(name))} needs sha256 (text), bytes (a whole number) "
                f"and rows (a whole number, at most {MAX_BUNDLE_ROWS:,} in a table)"
            )
    missing = [table for table in REQUIRED if f"{table}.parquet" not in files]
    if missing:
        raise BundleError(f"{path} is damaged: it has no {', '.join(missing)} table")
    return manifest


def _check_file(path: Path, name: str, file: Path, entry: dict[str, Any]) -> int:
    """Check an extracted member against its manifest entry; its data's size once decompressed, as its
    Parquet metadata declares it (its column chunks are compressed: read only up to the bound)."""
    digest = file_sha256(file)
    if digest != entry["sha256"]:
        raise BundleError(
            f"{path} is damaged: {name}'s sha256 is {digest}, its manifest says {shown_name(entry['sha256'])}"
        )
    try:
        metadata = pq.ParquetFile(file).metadata
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet
        raise BundleError(
            f"{path} is damaged: {name} is not a Parquet file ({terminal_text(str(exc))[:200]})"
        ) from None
    if metadata.num_rows != entry["rows"]:
        raise BundleError(
            f"{path} is damaged: {name} holds {metadata.num_rows} rows, its manifest says {entry['rows']}"
        )
    return sum(
        metadata.row_group(group).column(column).total_uncompressed_size
        for group in range(metadata.num_row_groups)
        for column in range(metadata.num_columns)
    )
