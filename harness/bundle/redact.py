"""`export --bundle --redact public`: drop what identifies a person or a network from a bundle.

Hostnames (the column, and wherever a run's hostname or the exporting user's name appears in text),
file system paths, URLs and IP addresses in every text column, client addresses and page origins, and
user agents beyond the browser and its version. Measurements, keys and hashes are kept: a redacted
result has the same content hash as the original (harness.store.RESULT_CONTENT_COLUMNS)."""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa

REMOVED = [
    "runs.hostname and every occurrence of a run's hostname or the exporting user's name in text",
    "file system paths, URLs and IP addresses in every text column",
    "client addresses and page origins of served devices",
    "user agents beyond the browser and its version; user agent data (device model, platform version)",
    "host facts other than platform, Python, CPU, cores, memory, accelharness version and git commit",
]
HOST_KEPT = ("platform", "python_version", "cpu_model", "cpu_cores", "cpu_physical_cores", "memory_gb",
             "harness_version", "git_sha")  # fmt: skip
DROPPED_KEYS = {"hostname", "client_address", "page_origin", "page_reported_origin", "origin", "user_agent_data"}
# Operator rows name graph nodes ("/encoder/layer.0/MatMul": not a path) and kernels: nothing personal.
UNTOUCHED = {"operators", "samples"}
IDENTITIES = {"result_id", "run_id", "run_uuid", "result_key", "content_hash", "machine_id", "device", "suite_id"}
URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
IPV4 = re.compile(r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?::\d+)?(?![\w.])")
IPV6 = re.compile(
    r"(?<![\w:])(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*)?::(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*)?(?![\w:])"
)
IPV6_FULL = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?![\w:])")
POSIX_PATH = re.compile(r"(?<![\w.:/<>~-])(?:~)?/[^\s\"'<>|,;()\[\]]+")
WINDOWS_PATH = re.compile(r"\b[A-Za-z]:[\\/][^\s\"'<>|,;()]*")
BROWSER = re.compile(r"(Edg|OPR|Firefox|Chrome|HeadlessChrome|Version)/([\d.]+)")


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


def scrubber(names: set[str]) -> Callable[[str], str]:
    """Text with paths, URLs, addresses and the given names (hostnames, user names) replaced."""
    words = sorted({n for n in names if n and len(n) >= 3}, key=len, reverse=True)
    literal = re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE) if words else None

    def scrub(text: str) -> str:
        text = URL.sub("<address>", text)
        text = IPV4.sub("<address>", text)
        text = IPV6_FULL.sub("<address>", IPV6.sub("<address>", text))
        text = WINDOWS_PATH.sub("<path>", POSIX_PATH.sub("<path>", text))
        return literal.sub("<name>", text) if literal else text

    return scrub


def _redact_json(value: Any, scrub: Callable[[str], str]) -> Any:
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            if key in DROPPED_KEYS:
                continue
            kept[key] = browser_and_version(item) if key == "user_agent" else _redact_json(item, scrub)
        return kept
    if isinstance(value, list):
        return [_redact_json(item, scrub) for item in value]
    return scrub(value) if isinstance(value, str) else value


def _redact_cell(value: Any, is_json: bool, scrub: Callable[[str], str]) -> Any:
    if value is None:
        return None
    if is_json:
        try:
            return json.dumps(_redact_json(json.loads(value), scrub))
        except json.JSONDecodeError:
            return scrub(value)
    return scrub(value)


def redact_public(staging: duckdb.DuckDBPyConnection, tables: tuple[str, ...]) -> None:
    """Rewrite the staged tables in place (an in-memory copy: the store is never touched)."""
    names = {getpass.getuser()}
    for hostname, host in staging.execute("SELECT hostname, host FROM runs").fetchall():
        names |= {hostname, (hostname or "").split(".")[0]}
        names.add((json.loads(host) if host else {}).get("hostname"))
    names.discard(None)
    scrub = scrubber(names)
    staging.execute("UPDATE runs SET hostname = NULL")
    for run_id, host in staging.execute("SELECT run_id, host FROM runs WHERE host IS NOT NULL").fetchall():
        facts = json.loads(host)
        kept = {key: facts[key] for key in HOST_KEPT if key in facts}
        staging.execute("UPDATE runs SET host = ? WHERE run_id = ?", [json.dumps(kept), run_id])
    for table in tables:
        if table not in UNTOUCHED:
            _redact_table(staging, table, scrub)


def _redact_table(staging: duckdb.DuckDBPyConnection, table: str, scrub: Callable[[str], str]) -> None:
    columns = staging.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND table_name = ? ORDER BY column_index",
        [table],
    ).fetchall()
    text = [(name, kind == "JSON") for name, kind in columns if kind in ("VARCHAR", "JSON") and name not in IDENTITIES]
    if not text or not staging.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]:
        return
    rows = staging.sql(f"SELECT * FROM {table}").to_arrow_table()
    for name, is_json in text:
        values = [_redact_cell(v, is_json, scrub) for v in rows.column(name).to_pylist()]
        rows = rows.set_column(rows.schema.get_field_index(name), name, pa.array(values, pa.string()))
    staging.execute(f"DELETE FROM {table}")
    staging.register("redacted", rows)
    staging.execute(f"INSERT INTO {table} BY NAME SELECT * FROM redacted")
    staging.unregister("redacted")
