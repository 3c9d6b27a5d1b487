"""`accelharness import BUNDLE…` and `accelharness merge A B --db OUT`: rows from other stores, added
to this one without duplicates and without overwriting.

Every bundle is checked before the store is opened (harness.bundle.fmt). Each is loaded into a
database in memory attached to the store's connection and migrated there by the store's own
migrations, then added in ONE transaction for all of them: a run already here (same run uuid) and a
result already here with the same content hash are skipped and counted; the same run id or result key
with other content is a conflict, and any conflict rolls everything back, naming them. A ceiling that
arrives holds its run's rows here as one measured after them does (harness.store.roofline_sql: the latest of
its target, kind and class), so a run brought in two bundles, before and after a resume, has every row's
fractions of one ceiling. A kill or Ctrl-C before the commit leaves the store as it was. An import that adds
anything is logged in `imports`; importing a bundle again adds nothing and is not logged again."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import psutil
import pyarrow as pa

from harness.bundle.checks import check_columns, check_rows
from harness.bundle.fmt import Bundle, BundleError, read_bundle
from harness.core.bounds import MAX_BUNDLES
from harness.core.faults import injected_faults
from harness.core.terminal import terminal_text
from harness.store import Store, StoreError, current_columns, open_store, quoted, roofline_sql

MAX_CONFLICTS_NAMED = 10
# A run here that the bundle holds later in its life (completed where this store has it running or
# interrupted: exported again after it finished) moves forward; never back (harness.store.RUN_STATUSES).
FORWARD = """
UPDATE runs SET status = b.status, finished_at = b.finished_at FROM {b}.runs b
WHERE runs.run_id = b.run_id AND runs.run_uuid = b.run_uuid AND b.status = 'completed' AND runs.status <> 'completed'
"""
# Results of the bundle that are here already: by result id, or by (run, result key).
MATCHES = """
SELECT b.result_id, b.run_id, coalesce(b.result_key, b.result_id) AS key, b.content_hash = t.content_hash AS same
FROM {b}.results b JOIN results t ON t.result_id = b.result_id
UNION
SELECT b.result_id, b.run_id, coalesce(b.result_key, b.result_id), b.content_hash = t.content_hash
FROM {b}.results b JOIN results t ON t.run_id = b.run_id AND t.result_key = b.result_key
"""


@dataclass
class ImportCount:
    bundle: str
    runs_added: int = 0
    results_added: int = 0
    results_skipped: int = 0
    samples_added: int = 0
    rows_added: int = 0  # hardware, operator and control rows
    runs_completed: int = 0  # runs here that the bundle holds completed

    @property
    def added_anything(self) -> bool:
        return bool(
            self.runs_added or self.results_added or self.samples_added or self.rows_added or self.runs_completed
        )


class ImportConflict(BundleError):
    """Rows of a bundle that have the key of rows here, with other content."""


def import_bundles(db_path: Path, paths: list[Path]) -> list[ImportCount]:
    """Import every bundle into the store at db_path, all or nothing."""
    if not paths or len(paths) > MAX_BUNDLES:
        raise BundleError(f"import takes 1 to {MAX_BUNDLES} bundles (got {len(paths)})")
    db_path = Path(db_path)
    with tempfile.TemporaryDirectory(prefix="accelharness-import-") as directory:
        bundles = []
        for number, path in enumerate(paths):
            extracted = Path(directory) / str(number)
            extracted.mkdir()
            bundles.append(read_bundle(Path(path), extracted))
        if db_path.exists():
            with open_store(db_path) as store:
                return _import(store, _unique(bundles))
        return _import_new(db_path, _unique(bundles))


def _import_new(db_path: Path, bundles: list[Bundle]) -> list[ImportCount]:
    """Into a store that does not exist yet: made beside it under another name and put in place only
    when complete, so a kill at any point leaves no store at db_path (only the partial file)."""
    if not db_path.parent.is_dir():
        raise StoreError(f"--db {db_path}: directory {db_path.parent} does not exist")
    _remove_stale_partials(db_path)
    partial = db_path.with_name(f".{db_path.name}.importing-{os.getpid()}")
    try:
        with open_store(partial) as store:
            counts = _import(store, bundles)
            store.connection.execute("CHECKPOINT")  # every row in the file itself, none left in its .wal
        appeared = StoreError(f"{db_path} appeared during the import; it was left as it is, nothing imported")
        try:
            os.link(partial, db_path)  # never over a store that appeared meanwhile
        except FileExistsError:
            raise appeared from None
        except OSError:  # a file system without hard links
            if db_path.exists():
                raise appeared from None
            os.replace(partial, db_path)
        return counts
    finally:
        for leftover in (partial, Path(f"{partial}.wal")):
            leftover.unlink(missing_ok=True)


def _remove_stale_partials(db_path: Path) -> None:
    """The partial files of earlier imports into db_path that were killed (kill -9 leaves one): removed
    once the process that wrote each is gone. Never a store: only the `.NAME.importing-PID` names."""
    for partial in db_path.parent.glob(f".{db_path.name}.importing-*"):
        pid = partial.name.rpartition("-")[2].removesuffix(".wal")
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            partial.unlink(missing_ok=True)


def _unique(bundles: list[Bundle]) -> list[Bundle]:
    """One of each bundle (by content): the same file named twice is imported once."""
    by_hash: dict[str, Bundle] = {}
    for bundle in bundles:
        by_hash.setdefault(bundle.sha256, bundle)
    return list(by_hash.values())


def _import(store: Store, bundles: list[Bundle]) -> list[ImportCount]:
    connection = store.connection
    home = connection.execute("SELECT current_database()").fetchone()[0]
    names = [_stage(connection, home, bundle, number) for number, bundle in enumerate(bundles)]
    counts: list[ImportCount] = []
    connection.execute("BEGIN TRANSACTION")
    try:
        conflicts: list[str] = []
        for bundle, name in zip(bundles, names, strict=True):
            count, found = _add(connection, bundle, name)
            counts.append(count)
            conflicts += found
        if conflicts:
            shown = "; ".join(conflicts[:MAX_CONFLICTS_NAMED])
            more = f" (and {len(conflicts) - MAX_CONFLICTS_NAMED} more)" if len(conflicts) > MAX_CONFLICTS_NAMED else ""
            raise ImportConflict(
                f"{len(conflicts)} conflict(s), nothing imported: the same key with other content is never "
                f"overwritten: {shown}{more}"
            )
        for bundle, count in zip(bundles, counts, strict=True):
            if count.added_anything:
                _log(connection, bundle, count)
        _hold_if_asked()
        connection.execute("COMMIT")
    except duckdb.Error as exc:  # a check missed it: still one line, and nothing imported
        with contextlib.suppress(duckdb.Error):
            connection.execute("ROLLBACK")
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BundleError(f"the import failed, nothing imported: {terminal_text(reason)[:300]}") from None
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    finally:
        for name in names:
            connection.execute(f"DETACH {name}")
    return counts


def _stage(connection: duckdb.DuckDBPyConnection, home: str, bundle: Bundle, number: int) -> str:
    """The bundle's tables in an in-memory database attached as bundle_N, each column of the store's type,
    migrated to this schema, every row checked (harness.bundle.checks)."""
    name = f"bundle_{number}"
    connection.execute(f"ATTACH ':memory:' AS {name}")
    connection.execute(f"USE {name}")
    try:
        for table, file in bundle.files.items():
            connection.execute(f"CREATE TABLE {table} AS SELECT * FROM read_parquet(?)", [str(file)])
        check_columns(connection, bundle.path, list(bundle.files))
        connection.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)")
        connection.execute("INSERT INTO schema_version VALUES (?, now())", [bundle.schema_version])
        Store(connection, bundle.path).ensure_schema()  # an older bundle migrated by the store's own migrations
        check_rows(connection, bundle.path)
    except duckdb.Error as exc:
        reason = terminal_text((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:300]
        raise BundleError(
            f"{bundle.path} does not hold the tables of schema {bundle.schema_version}: {reason}"
        ) from None
    finally:
        connection.execute(f"USE {quoted(home)}")
    return name


def _add(connection: duckdb.DuckDBPyConnection, bundle: Bundle, b: str) -> tuple[ImportCount, list[str]]:
    """Add the staged bundle's new rows (inside the caller's transaction); the conflicts it has."""
    count = ImportCount(bundle.path.name)
    conflicts = [
        f"run {run_id}: another run (uuid {here}) has this id here; the bundle's is {there}"
        for run_id, there, here in connection.execute(
            f"SELECT b.run_id, b.run_uuid, t.run_uuid FROM {b}.runs b JOIN runs t USING (run_id) "
            "WHERE b.run_uuid IS DISTINCT FROM t.run_uuid"
        ).fetchall()
    ]
    matches = connection.execute(MATCHES.format(b=b)).fetchall()
    conflicts += sorted(
        {f"run {run_id} result {key}: other content here" for _, run_id, key, same in matches if not same}
    )
    if conflicts:
        return count, conflicts
    present = pa.table({"result_id": pa.array(sorted({m[0] for m in matches}), pa.string())})
    connection.register("present", present)
    new = f"SELECT result_id FROM {b}.results WHERE result_id NOT IN (SELECT result_id FROM present)"
    count.results_skipped = len(present)
    count.runs_completed = connection.execute(FORWARD.format(b=b)).fetchone()[0]
    count.runs_added = _insert(
        connection, "runs", f"SELECT * FROM {b}.runs WHERE run_id NOT IN (SELECT run_id FROM runs)"
    )
    count.samples_added = _insert(connection, "samples", f"SELECT * FROM {b}.samples WHERE result_id IN ({new})")
    count.rows_added = _insert(connection, "operators", f"SELECT * FROM {b}.operators WHERE result_id IN ({new})")
    count.results_added = _insert(connection, "results", f"SELECT * FROM {b}.results WHERE result_id IN ({new})")
    for table in ("hardware", "controls", "ceilings"):  # rows of a run, without a key: added unless the same is here
        columns = ", ".join(quoted(c) for c, _, _ in current_columns()[table])
        added = _insert(connection, table, f"SELECT {columns} FROM {b}.{table} EXCEPT SELECT {columns} FROM {table}")
        if table == "ceilings" and added:
            _hold_against_latest(connection, b)
        count.rows_added += added
    connection.unregister("present")
    return count, []


def _hold_against_latest(connection: duckdb.DuckDBPyConnection, b: str) -> None:
    """A ceiling that arrives after a run's rows holds them, as Store.add_ceiling's does: where this store held
    the run already (a bundle exported before a resume, then one after), every row of it is held against the latest
    ceiling again, so the store, and any bundle exported from it, has each row's fractions of the one ceiling."""
    for statement in roofline_sql(f"run_id IN (SELECT run_id FROM {b}.ceilings)"):
        connection.execute(statement)


def _insert(connection: duckdb.DuckDBPyConnection, table: str, select: str) -> int:
    return connection.execute(f"INSERT INTO {table} BY NAME {select}").fetchone()[0]


def _log(connection: duckdb.DuckDBPyConnection, bundle: Bundle, count: ImportCount) -> None:
    manifest = bundle.manifest
    redaction = manifest.get("redacted")
    redacted = str(redaction.get("level"))[:40] if isinstance(redaction, dict) else None
    connection.execute(
        "INSERT INTO imports VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            bundle.sha256, bundle.path.name, datetime.now(UTC).replace(tzinfo=None), manifest["bundle_format"],
            bundle.schema_version, str(manifest.get("accelharness_version"))[:40], redacted, count.runs_added,
            count.results_added, count.results_skipped, count.samples_added,
        ],
    )  # fmt: skip


def _hold_if_asked() -> None:
    """Testing hook (ACCELHARNESS_INJECT_FAULT=import-hang): stop inside the transaction, every row
    added and none committed, so a test can kill or interrupt the import at its worst moment."""
    if "import-hang" in injected_faults():
        print("import: holding the transaction (import-hang)", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)


def merge_stores(sources: list[Path], db_path: Path) -> list[ImportCount]:
    """`merge A B --db OUT`: each source exported whole to a bundle, the bundles imported into OUT."""
    from harness.bundle.export import export_bundle

    target = Path(db_path)
    for source in sources:  # the same file by name, symlink or hard link: merging would write into a source
        if Path(source).resolve() == target.resolve() or (
            target.exists() and Path(source).exists() and os.path.samefile(source, target)
        ):
            raise BundleError(f"--db {db_path} is one of the stores to merge ({source}); merge into another file")
    with tempfile.TemporaryDirectory(prefix="accelharness-merge-") as directory:
        bundles = []
        for number, source in enumerate(sources):
            if not Path(source).is_file():
                raise StoreError(f"no store at {source}")
            bundles.append(export_bundle(Path(source), Path(directory) / f"{number}-{Path(source).stem}.zip").path)
        return import_bundles(Path(db_path), bundles)
