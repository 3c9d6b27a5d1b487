"""`export --bundle --redact public`: drop what identifies a person or a network from a bundle.

Removed from every text column of every table (JSON text included, redacted value by value): file system
paths (absolute, relative, with spaces, Windows, UNC, `~user`, `file:` URLs), URLs, e-mail addresses, IP
addresses (v4 and v6), host names (this machine's, the runs', the Ray nodes', and the name in "node HOST
(...)" text) and user names (the exporting user's, and any a home directory names). Also dropped: the
hostname column, client addresses and page origins, user agents beyond the browser and its version.
Kept: model names, EP names, versions, numbers, keys and hashes. A redacted result keeps its content hash
(harness.store.RESULT_CONTENT_COLUMNS leave out the notes redaction rewrites); a result whose measured
columns had to change is hashed again, so a bundle never carries a hash its rows disagree with."""

from __future__ import annotations

import getpass
import json
import re
import socket
from collections.abc import Callable, Iterator
from typing import Any

import duckdb
import pyarrow as pa

from harness.store import RESULT_CONTENT_COLUMNS, hash_results_sql, is_identifier_sql

REMOVED = [
    "runs.hostname; host names (this machine's, the runs', Ray nodes', 'node HOST' text) and user names in text",
    "file system paths (absolute, relative, with spaces, Windows, UNC, ~user, file: URLs), URLs, e-mail "
    "addresses and IP addresses (v4 and v6) in every text column, JSON text included",
    "client addresses and page origins of served devices",
    "user agents beyond the browser and its version; user agent data (device model, platform version)",
    "host facts other than platform, Python, CPU, cores, memory, accelharness version and git commit",
]
HOST_KEPT = ("platform", "python_version", "cpu_model", "cpu_cores", "cpu_physical_cores", "memory_gb",
             "harness_version", "git_sha")  # fmt: skip
DROPPED_KEYS = {"hostname", "client_address", "page_origin", "page_reported_origin", "origin", "user_agent_data"}
HOST_KEYS = {"hostname", "host", "node_name", "node_ip"}  # JSON keys whose text values name a machine
# Operator rows name graph nodes ("/encoder/layer.0/MatMul": path-shaped, not a path) and kernels: only
# what is an identity in any text (known names, URLs, e-mail and IP addresses) is removed from them.
NAMES_ONLY = {"operators"}
IDENTITIES = {"result_id", "run_id", "run_uuid", "result_key", "content_hash", "machine_id", "device", "suite_id"}
MIN_NAME = 2  # names are matched as whole words; one letter would still be any initial
# What the rows themselves name (models, targets, precisions) is never taken for a host or user name.
VOCABULARY_SQL = """SELECT DISTINCT unnest([model, family, weights, hardware, engine, provider, precision,
    requested_precision, mode, variant]) FROM results"""

_C = r"[^\s\"'<>|,;()\[\]{}]"  # a character a path may hold
# A path with spaces: later words that hold a separator continue it ("My Projects/secret/model.onnx"),
# and so does one last word that ends in a file extension ("/home/me/My model.onnx").
_MORE = rf"(?:[ \t]+{_C}*[/\\]{_C}*)*(?:[ \t]+[\w.-]*\.[A-Za-z][A-Za-z0-9]{{0,7}}(?![\w/\\.-]))?"
URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
FILE_URL = re.compile(rf"\bfile:{_C}+{_MORE}", re.IGNORECASE)
EMAIL = re.compile(r"(?<![\w.%+-])[\w.%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
UNC = re.compile(rf"(?<![\w\\])\\{{2,}}[^\s\\\"'<>|]+\\+{_C}*{_MORE}")
WINDOWS_PATH = re.compile(rf"\b[A-Za-z]:[\\/]{_C}*{_MORE}")
HOME = re.compile(rf"(?<![\w~])~(?:[A-Za-z_][\w.-]*(?:/{_C}*)?|/{_C}*){_MORE}")
POSIX_PATH = re.compile(rf"(?<![\w.:/<>~\\-])/{_C}+{_MORE}")
RELATIVE_PATH = re.compile(
    rf"(?<![\w/\\.~<-])(?:\.\.?[/\\]{_C}*|[\w.-]+(?:/[\w.-]+){{2,}}/?|[\w.-]+/[\w.-]*\.[A-Za-z][A-Za-z0-9]{{0,7}}"
    rf"(?![\w/.-])){_MORE}"
)
# A home directory names its user: the name is removed wherever else it appears.
HOME_USER = re.compile(r"(?:/home/|/Users/|[A-Za-z]:\\+Users\\+|~)([A-Za-z_][\w.-]*)")
IPV4 = re.compile(r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?::\d+)?(?![\w.])")
IPV6_MAPPED = re.compile(r"(?<![\w:])[0-9A-Fa-f:]*:(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
IPV6 = re.compile(
    r"(?<![\w:])(?=[0-9A-Fa-f:]*[0-9A-Fa-f])(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*)?::(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*)?"
    r"(?:%[\w.-]+)?(?![\w:])"
)
IPV6_FULL = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?:%[\w.-]+)?(?![\w:])")
# "Ray node HOST (IP)", "node HOST (…)": the word after "node" or "host" that a parenthesis follows.
NODE_HOST = re.compile(r"\b((?:Ray )?node|host)\s+(?!<)([A-Za-z0-9][\w.-]*)(?=\s*\()", re.IGNORECASE)
RAY_NODE = re.compile(r"\b(Ray node)\s+(?!<)([A-Za-z0-9][\w.-]*)", re.IGNORECASE)
PATH_TAIL = re.compile(rf"<path>(?:[/\\]{_C}*{_MORE})?(?:<path>)*")  # what a known path left of a longer one
PATHS = (FILE_URL, UNC, WINDOWS_PATH, HOME, POSIX_PATH, RELATIVE_PATH, PATH_TAIL)
WHOLE_PATH = re.compile(r"\s*(?:/|~[\w/]|\.\.?[/\\]|[A-Za-z]:[\\/]|\\\\|file:)", re.IGNORECASE)
BROWSER = re.compile(r"(Edg|OPR|Firefox|Chrome|HeadlessChrome|Version)/([\d.]+)")
Scrub = Callable[[str], str]


def browser_and_version(agent: Any) -> str | None:
    """'Chrome 131.0.6778.85' from a user agent string (Safari's version is its Version/ token)."""
    if not isinstance(agent, str):
        return None
    found = dict(BROWSER.findall(agent))
    for token, name in (("Edg", "Edge"), ("OPR", "Opera"), ("Firefox", "Firefox"), ("HeadlessChrome", "Chrome"),
                        ("Chrome", "Chrome"), ("Version", "Safari")):  # fmt: skip
        if token in found:
            return f"{name} {found[token]}"
    return "unknown browser"


def _literal(words: set[str]) -> re.Pattern[str] | None:
    kept = sorted({w for w in words if w and len(w) >= MIN_NAME}, key=len, reverse=True)
    return re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, kept)) + r")(?![\w-])", re.I) if kept else None


def scrubber(names: set[str], paths: frozenset[str] = frozenset(), shapes: bool = True) -> Scrub:
    """Text with the given paths (as the run was given them, spaces and all), paths of any shape (unless
    `shapes` is off), URLs, e-mail and IP addresses, host names in "node HOST" text, and the given names
    (host and user names) replaced."""
    known = sorted((p for p in paths if len(p) >= MIN_NAME), key=len, reverse=True)
    names_re = _literal(names)

    def scrub(text: str) -> str:
        for path in known:
            text = text.replace(path, "<path>")
        text = URL.sub("<address>", text)
        text = EMAIL.sub("<email>", text)
        if shapes:
            for pattern in PATHS:
                text = pattern.sub(_path, text)
        text = IPV6_MAPPED.sub("<address>", text)
        text = IPV4.sub("<address>", text)
        text = IPV6_FULL.sub("<address>", IPV6.sub("<address>", text))
        text = names_re.sub("<name>", text) if names_re else text
        return RAY_NODE.sub(r"\1 <host>", NODE_HOST.sub(r"\1 <host>", text))

    return scrub


def _path(found: re.Match[str]) -> str:
    """A path's placeholder, keeping the punctuation that ends its sentence ("cannot load <path>: no such file")."""
    text = found.group(0)
    return "<path>" + text[len(text.rstrip(":.")) :]


def _redact_json(value: Any, scrub: Scrub, shapes: bool) -> Any:
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            if key in DROPPED_KEYS:
                continue
            kept[scrub(key)] = browser_and_version(item) if key == "user_agent" else _redact_json(item, scrub, shapes)
        return kept
    if isinstance(value, list):
        return [_redact_json(item, scrub, shapes) for item in value]
    if isinstance(value, str):  # a value that is a path is all path, whatever it holds (spaces, parentheses)
        return "<path>" if shapes and WHOLE_PATH.match(value) else scrub(value)
    return value


def _redact_cell(value: Any, is_json: bool, scrub: Scrub, shapes: bool) -> Any:
    if value is None:
        return None
    if is_json:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return scrub(value)
        redacted = _redact_json(parsed, scrub, shapes)
        return value if redacted == parsed else json.dumps(redacted)  # unchanged text stays byte for byte
    return scrub(value)


def _text_columns(staging: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, bool]]:
    """(name, is JSON) of a table's text columns, identities left out."""
    columns = staging.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND table_name = ? ORDER BY column_index",
        [table],
    ).fetchall()
    return [(name, kind == "JSON") for name, kind in columns if kind in ("VARCHAR", "JSON") and name not in IDENTITIES]


def _strings(value: Any) -> Iterator[tuple[str | None, str]]:
    """(the key it is under, or None) and every string in a JSON value."""
    todo: list[tuple[str | None, Any]] = [(None, value)]
    while todo:
        key, item = todo.pop()
        if isinstance(item, dict):
            todo += [(k, v) for k, v in item.items()]
        elif isinstance(item, list):
            todo += [(key, v) for v in item]
        elif isinstance(item, str):
            yield key, item


def _known(staging: duckdb.DuckDBPyConnection, tables: tuple[str, ...]) -> tuple[set[str], frozenset[str]]:
    """The names and paths the staged rows give away themselves: the exporting user and machine, every
    host-named JSON value (a run's host, a Ray node), users named by home directories, and the path
    arguments of each run (whole, so a path with spaces goes whole wherever it is quoted)."""
    names = {getpass.getuser(), socket.gethostname(), socket.gethostname().split(".")[0]}
    paths: set[str] = set()
    for (hostname,) in staging.execute("SELECT hostname FROM runs WHERE hostname IS NOT NULL").fetchall():
        names |= {hostname, hostname.split(".")[0]}
    for table in tables:
        for name, is_json in _text_columns(staging, table):
            for (cell,) in staging.execute(f"SELECT {name} FROM {table} WHERE {name} IS NOT NULL").fetchall():
                names |= set(HOME_USER.findall(cell)) | {found.group(2) for found in RAY_NODE.finditer(cell)}
                if not is_json:
                    continue
                for key, text in _strings(_loads(cell)):
                    if key in HOST_KEYS and not IPV4.fullmatch(text):
                        names |= {text, text.split(".")[0]}
                    if table == "runs" and name == "arguments" and WHOLE_PATH.match(text):
                        paths.add(text.strip())
    vocabulary = {str(word).lower() for (word,) in staging.execute(VOCABULARY_SQL).fetchall() if word}
    return {n for n in names if n.lower() not in vocabulary}, frozenset(paths)


def _loads(cell: str) -> Any:
    try:
        return json.loads(cell)
    except json.JSONDecodeError:
        return None


def redact_public(staging: duckdb.DuckDBPyConnection, tables: tuple[str, ...]) -> None:
    """Rewrite the staged tables in place (an in-memory copy: the store is never touched)."""
    names, paths = _known(staging, tables)
    staging.execute("UPDATE runs SET hostname = NULL")
    for run_id, host in staging.execute("SELECT run_id, host FROM runs WHERE host IS NOT NULL").fetchall():
        facts = json.loads(host)
        kept = {key: facts[key] for key in HOST_KEPT if key in facts}
        staging.execute("UPDATE runs SET host = ? WHERE run_id = ?", [json.dumps(kept), run_id])
    for table in tables:
        shapes = table not in NAMES_ONLY
        changed = _redact_table(staging, table, scrubber(names, paths, shapes), shapes)
        if table == "results":
            _rehash(staging, changed)
    # A label is an identifier (harness.run.machine's rule): one that named an address or a path is no
    # label once redacted ("<email>"), so it goes, as the hostname does; the machine keeps its id.
    staging.execute(f"UPDATE runs SET machine_label = NULL WHERE NOT {is_identifier_sql('machine_label')}")


def _redact_table(staging: duckdb.DuckDBPyConnection, table: str, scrub: Scrub, shapes: bool) -> set[str]:
    """Redact a table's text columns; returns the result ids whose measured (hashed) columns changed."""
    text = _text_columns(staging, table)
    if not text or not staging.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]:
        return set()
    rows = staging.sql(f"SELECT * FROM {table}").to_arrow_table()
    changed: set[str] = set()
    for name, is_json in text:
        before = rows.column(name).to_pylist()
        values = [_redact_cell(v, is_json, scrub, shapes) for v in before]
        if name in RESULT_CONTENT_COLUMNS and "result_id" in rows.column_names:
            ids = rows.column("result_id").to_pylist()
            changed |= {rid for rid, old, new in zip(ids, before, values, strict=True) if old != new}
        rows = rows.set_column(rows.schema.get_field_index(name), name, pa.array(values, pa.string()))
    staging.execute(f"DELETE FROM {table}")
    staging.register("redacted", rows)
    staging.execute(f"INSERT INTO {table} BY NAME SELECT * FROM redacted")
    staging.unregister("redacted")
    return changed


def _rehash(staging: duckdb.DuckDBPyConnection, result_ids: set[str]) -> None:
    """A result whose measured columns held something redaction removed is no longer the stored result:
    its content hash is computed again from what the bundle carries (harness.store's one definition)."""
    for result_id in sorted(result_ids):
        staging.execute(hash_results_sql("result_id = ?"), [result_id, result_id])
