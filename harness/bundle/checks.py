"""Every check a bundle's rows pass before they reach a store, run as SQL over its staged tables.

An imported row passes the checks a freshly measured one does (harness.core.records: STATUSES,
MEASURED, MODES, VARIANTS, durations finite and > 0, the reason of a failure; the bounds of
harness.core.bounds), and what only data from elsewhere needs: each column of its schema's type, no
NULL where the schema has NOT NULL, unique keys, rows that belong to a run or result of the bundle,
identifiers of a fixed syntax (harness.store.IDENTIFIER: never a path), samples within their result's
iterations, and each result's content hash recomputed from its rows (harness.store.hash_results_sql),
never taken as given. What a row's figures are made of is recomputed too: a ceiling's value and spread from
its samples, one ceiling per run, target, kind and precision class (the one its rows are held against), a
result's rates from its samples as the store made them (harness.core.stats, harness.core.generation),
its achieved rates and fractions from those, its work and that ceiling (harness.store.roofline_sql), and a
fraction an order of magnitude above its ceiling refused (harness.core.roofline.ABOVE_CEILING: no machine's,
a counting or unit error). Text is bounded by what a fresh run stores (harness.core.bounds): an output text
by its tokens, details by its iterations, any other text cell by MAX_TEXT_CELL_BYTES. A failed check is a
BundleError naming the member, the row (counted from 1, in the member's order) and the column; a value is
shown cut short and without control characters."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import duckdb

from harness.bundle.fmt import BundleError
from harness.core.bounds import (
    DETAILS_BYTES_PER_ITERATION,
    MAX_AUDIO_SECONDS,
    MAX_BATCH,
    MAX_DEPTH,
    MAX_ITERATIONS,
    MAX_NEW_TOKENS,
    MAX_ROUNDS,
    MAX_SEQUENCE,
    MAX_TEXT_CELL_BYTES,
    MAX_TOKEN_TEXT_CHARS,
)
from harness.core.labels import target_label
from harness.core.precision import MEANINGS
from harness.core.records import MEASURED, MODES, STATUSES, VARIANTS, WORK_FIELDS
from harness.core.roofline import (
    ABOVE_CEILING,
    BANDWIDTH_CLASS,
    CEILING_KINDS,
    UNITS,
    precision_class,
    precision_class_sql,
)
from harness.core.terminal import quoted_text
from harness.store import (
    ROOFLINE_COLUMNS,
    RUN_STATUSES,
    RUN_TABLES,
    SCHEMA_VERSION,
    current_columns,
    hash_results_sql,
    is_identifier_sql,
    quoted,
    required_columns,
    roofline_sql,
)

SHOWN_CHARS = 60  # of a value in a message
POSITIVE = "a finite number > 0"
IDENTIFIER_RULE = "1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit, without '..'"


@dataclass(frozen=True)
class Rule:
    table: str
    column: str
    bad: str  # an SQL condition, true on a row that breaks the rule
    valid: str  # what is valid, for the message


def _one_of(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def _outside(column: str, low: int, high: int) -> str:
    return f"NOT ({column} BETWEEN {low} AND {high})"


def _not_positive(column: str) -> str:
    return f"NOT (isfinite({column}) AND {column} > 0)"


def _not_positive_list(column: str) -> str:
    return f"len(list_filter({column}, lambda x: x IS NULL OR NOT (isfinite(x) AND x > 0))) > 0"


LATENCIES = ("latency_mean_ms", "latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms",
             "latency_min_ms", "latency_max_ms", "throughput_per_s", "ttft_ms", "tpot_ms", "tpot_p90_ms",
             "tokens_per_s", "prefill_tokens_per_s", "decode_tokens_per_s", "encoder_ms",
             "real_time_factor")  # fmt: skip
IDENTIFIERS = {
    "runs": ("run_id", "run_uuid", "machine_id", "machine_label"),
    "results": ("result_id", "run_id", "device"),
    "ceilings": ("run_id", "device", "reused_from"),  # reused_from: the run that measured a reused ceiling
}
CEILING_CLASSES = (BANDWIDTH_CLASS, *sorted({c for p in MEANINGS if (c := precision_class(p))}))
# a ceiling's figures as harness.core.roofline.ceiling_figures gives them, from its own amount and samples
CEILING_VALUE = "amount / (list_min(samples_ms) / 1000.0) / 1e9"
CEILING_SPREAD = "list_median(samples_ms) / list_min(samples_ms) - 1.0"
# What makes a ceiling one: a run holds one per target, kind and precision class, the one harness.store.roofline_sql
# holds the target's rows against (a second would leave a reader to guess which; export --bundle writes that one).
CEILING_KEY = ("run_id", "hardware", "engine", "provider", "device", "kind", "precision")
# Each rate a roofline figure multiplies (harness.store.roofline_sql), by mode, and the work that puts it to use.
RATE_WORK = {
    "generate": {"decode_tokens_per_s": ("bytes_per_token",), "prefill_tokens_per_s": ("prefill_flops_per_token",)},
    "inference": {"throughput_per_s": ("bytes_per_item", "flops_per_item")},
}
# The JSON columns whose size is the case's (token ids per batch row and position, the run's --prompt): bounded by
# the bundle's own size, never by a text cell's.
SIZED_BY_CASE = {("results", "generated_tokens"), ("results", "prompt_ids"), ("runs", "arguments")}
# Those rates as the store made them from a result's samples (harness.store's _result_columns): items/s by
# harness.core.stats.summarize (batch / the mean latency), pp and tg tokens/s by harness.core.generation's
# generation_figures (batch x prompt / the median TTFT; batch x the decode steps / their summed time; neither without
# a TTFT), speech without a prompt as summarize_generation gives it none. In SQL over every result at once, as
# CEILING_VALUE is ceiling_figures': a bundle's million samples read into Python to call those took 31 s.
# tests/test_bundle_recompute.py holds a genuine run's stored rates to those functions, and imports them through these.
PROMPT_SQL = (
    "CASE WHEN coalesce(TRY_CAST(json_extract_string(details, '$.audio_seconds') AS DOUBLE), 0) <> 0 THEN NULL "
    "ELSE seq_len END"
)
RATES_SQL = {
    "throughput_per_s": "CASE WHEN avg(s.latency_ms) > 0 THEN r.batch_size * 1000.0 / avg(s.latency_ms) END",
    "prefill_tokens_per_s": "CASE WHEN r.prompt > 0 AND median(s.ttft_ms) > 0 "
    "THEN r.batch_size * r.prompt * 1000.0 / median(s.ttft_ms) END",
    "decode_tokens_per_s": "CASE WHEN count(s.ttft_ms) > 0 AND sum(list_sum(s.steps_ms)) > 0 "
    "THEN r.batch_size * sum(len(s.steps_ms)) * 1000.0 / sum(list_sum(s.steps_ms)) END",
}


def _differs(column: str, expected: str) -> str:
    """A stored figure that is not the one recomputed (NULL exactly where the recomputed one is NULL)."""
    return (f"(({column}) IS NULL) <> (({expected}) IS NULL) OR abs({column} - ({expected})) > "
            f"1e-9 * greatest(abs({expected}), 1e-300)")  # fmt: skip


NAMED = ("model", "family", "weights", "hardware", "engine", "requested_precision", "precision")
RULES = [
    *(Rule(t, c, f"NOT {is_identifier_sql(c)}", IDENTIFIER_RULE) for t, cs in IDENTIFIERS.items() for c in cs),
    Rule("runs", "status", f"status NOT IN {_one_of(RUN_STATUSES)}", f"one of {', '.join(RUN_STATUSES)}"),
    Rule("runs", "memory_gb", "NOT (isfinite(memory_gb) AND memory_gb >= 0)", "a finite number >= 0"),
    Rule("runs", "cpu_cores", "cpu_cores < 1", "a whole number >= 1"),
    Rule("results", "status", f"status NOT IN {_one_of(STATUSES)}", f"one of {', '.join(STATUSES)}"),
    Rule("results", "error", "status <> 'ok' AND coalesce(trim(error), '') = ''", "the reason of a status not ok"),
    *(Rule("results", c, f"trim({c}) = ''", "a non-empty text") for c in NAMED),
    Rule("results", "mode", f"mode IS NULL OR mode NOT IN {_one_of(MODES)}", f"one of {', '.join(MODES)}"),
    Rule("results", "variant", f"variant NOT IN {_one_of(VARIANTS)}", f"NULL or one of {', '.join(VARIANTS)}"),
    Rule("results", "batch_size", _outside("batch_size", 1, MAX_BATCH), f"1 to {MAX_BATCH:,}"),
    Rule("results", "seq_len", _outside("seq_len", 1, MAX_SEQUENCE), f"NULL or 1 to {MAX_SEQUENCE:,}"),
    Rule("results", "new_tokens", _outside("new_tokens", 1, MAX_NEW_TOKENS), f"NULL or 1 to {MAX_NEW_TOKENS:,}"),
    Rule("results", "iterations", _outside("iterations", 1, MAX_ITERATIONS), f"NULL or 1 to {MAX_ITERATIONS:,}"),
    Rule("results", "tokens_matched", "tokens_matched < 0", "NULL or a whole number >= 0"),
    *(Rule("results", c, _not_positive(c), f"NULL or {POSITIVE}") for c in LATENCIES),
    *(
        Rule("results", c, f"NOT (isfinite({c}) AND {c} >= 0)", "NULL or a finite number >= 0")
        for c in ("latency_std_ms", "latency_cv")
    ),
    Rule("samples", "iteration", _outside("iteration", 0, MAX_ITERATIONS - 1), f"0 to {MAX_ITERATIONS - 1:,}"),
    Rule("samples", "round", _outside("round", 0, MAX_ROUNDS), f"NULL or 0 to {MAX_ROUNDS:,}"),
    *(Rule("samples", c, _not_positive(c), POSITIVE) for c in ("latency_ms", "ttft_ms", "tpot_ms")),
    Rule("samples", "steps_ms", _not_positive_list("steps_ms"), f"NULL or a list of numbers each {POSITIVE}"),
    Rule("samples", "steps_ms", f"len(steps_ms) > {MAX_NEW_TOKENS}", f"at most {MAX_NEW_TOKENS:,} steps"),
    Rule("operators", "calls", "calls < 1", "a whole number >= 1"),
    Rule(
        "operators", "profile_iterations", _outside("profile_iterations", 1, MAX_ITERATIONS), f"1 to {MAX_ITERATIONS:,}"
    ),
    Rule("operators", "total_ms", "NOT (isfinite(total_ms) AND total_ms >= 0)", "a finite number >= 0"),
    Rule("controls", "iterations", _outside("iterations", 0, MAX_ITERATIONS), f"0 to {MAX_ITERATIONS:,}"),
    Rule("controls", "samples_ms", _not_positive_list("samples_ms"), f"NULL or a list of numbers each {POSITIVE}"),
    Rule("controls", "samples_ms", f"len(samples_ms) > {MAX_ITERATIONS}", f"at most {MAX_ITERATIONS:,} samples"),
    Rule("controls", "median_ms", _not_positive("median_ms"), f"NULL or {POSITIVE}"),
    Rule("results", "depth", _outside("depth", 0, MAX_DEPTH), f"NULL or 0 to {MAX_DEPTH:,}"),
    Rule(
        "results", "audio_seconds", _outside("audio_seconds", 1, MAX_AUDIO_SECONDS), f"NULL or 1 to {MAX_AUDIO_SECONDS}"
    ),
    *(Rule("results", c, _not_positive(c), f"NULL or {POSITIVE}") for c in WORK_FIELDS),
    Rule("ceilings", "kind", f"kind NOT IN {_one_of(CEILING_KINDS)}", f"one of {', '.join(CEILING_KINDS)}"),
    Rule(
        "ceilings", "precision", f"precision NOT IN {_one_of(CEILING_CLASSES)}", f"one of {', '.join(CEILING_CLASSES)}"
    ),
    *(Rule("ceilings", c, f"trim({c}) = ''", "a non-empty text") for c in ("hardware", "engine", "workload")),
    Rule("ceilings", "amount", _not_positive("amount"), POSITIVE),
    Rule("ceilings", "iterations", _outside("iterations", 0, MAX_ITERATIONS), f"0 to {MAX_ITERATIONS:,}"),
    Rule("ceilings", "samples_ms", _not_positive_list("samples_ms"), f"NULL or a list of numbers each {POSITIVE}"),
    Rule("ceilings", "samples_ms", "coalesce(len(samples_ms), 0) <> iterations", "exactly its iterations' samples"),
    Rule(
        "ceilings",
        "error",
        "coalesce(len(samples_ms), 0) = 0 AND coalesce(trim(error), '') = ''",
        "the reason a ceiling without samples has none",
    ),
    Rule("ceilings", "value", _differs("value", CEILING_VALUE), f"{CEILING_VALUE}, recomputed on import"),
    Rule("ceilings", "spread", _differs("spread", CEILING_SPREAD), f"{CEILING_SPREAD}, recomputed on import"),
    *(Rule("ceilings", c, _not_positive(c), f"NULL or {POSITIVE}") for c in ("budget_ms", "calibration_s")),
]


def _longest_text(column: str) -> str:
    """The longest text of a JSON list of texts, in characters."""
    return f"list_max(list_transform(json_extract_string({column}, '$[*]'), lambda s: length(s)))"


@cache
def text_rules() -> list[Rule]:
    """Every text a bundle's row carries, at most what a fresh run stores: an output text MAX_TOKEN_TEXT_CHARS per
    token its case generates (new_tokens, else the most a case may), its batch's texts one per batch row, details
    MAX_TEXT_CELL_BYTES and a number per iteration, any other text cell MAX_TEXT_CELL_BYTES (SIZED_BY_CASE aside)."""
    per_text = f"{MAX_TOKEN_TEXT_CHARS} * coalesce(new_tokens, {MAX_NEW_TOKENS})"
    per_token = f"at most {MAX_TOKEN_TEXT_CHARS:,} characters per token generated (new_tokens)"
    details = f"{MAX_TEXT_CELL_BYTES} + {DETAILS_BYTES_PER_ITERATION} * coalesce(iterations, 0)"
    texts = (
        f"json_type(output_texts) <> 'ARRAY' OR json_array_length(output_texts) > batch_size "
        f"OR {_longest_text('output_texts')} > {per_text}"
    )
    rules = [
        Rule("results", "output_text", f"length(output_text) > {per_text}", f"NULL or {per_token}"),
        Rule("results", "output_texts", texts, f"NULL or a JSON list of at most batch_size texts, each {per_token}"),
        Rule(
            "results",
            "details",
            f"strlen(CAST(details AS VARCHAR)) > {details}",
            f"NULL or at most {MAX_TEXT_CELL_BYTES:,} bytes and {DETAILS_BYTES_PER_ITERATION} per iteration",
        ),
    ]
    bounded = {(rule.table, rule.column) for rule in rules} | SIZED_BY_CASE
    for table in RUN_TABLES:
        for column, kind, _ in current_columns()[table]:
            if kind in ("VARCHAR", "JSON") and (table, column) not in bounded:
                too_long = f"strlen(CAST({quoted(column)} AS VARCHAR)) > {MAX_TEXT_CELL_BYTES}"
                rules.append(Rule(table, column, too_long, f"NULL or at most {MAX_TEXT_CELL_BYTES:,} bytes"))
    return rules


UNIQUE = {"runs": [("run_id",)], "results": [("result_id",), ("run_id", "result_key")],
          "samples": [("result_id", "iteration")]}  # fmt: skip
# (table, column, the table holding the key it names, that key)
LINKS = [("results", "run_id", "runs", "run_id"), ("hardware", "run_id", "runs", "run_id"),
         ("controls", "run_id", "runs", "run_id"), ("ceilings", "run_id", "runs", "run_id"),
         ("samples", "result_id", "results", "result_id"),
         ("operators", "result_id", "results", "result_id")]  # fmt: skip


def shown(value: object) -> str:
    """A value from a bundle as a message may show it."""
    return quoted_text(value, SHOWN_CHARS)


def _refuse(path: Path, table: str, row: int, column: str, what: str) -> BundleError:
    return BundleError(f"{path}: {table}.parquet row {row + 1}, column {column}: {what}; nothing was imported")


def _columns(connection: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    return dict(connection.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND table_name = ? ORDER BY column_index", [table],
    ).fetchall())  # fmt: skip


def check_columns(connection: duckdb.DuckDBPyConnection, path: Path, tables: list[str]) -> None:
    """Before the migration: each staged table's columns are its schema's, each of that column's type or
    cast to it row by row (the first row that does not cast is named), so every later check, the
    migration and the insert meet the store's own types."""
    current = current_columns()
    for table in tables:
        staged = _columns(connection, table)
        extra = sorted(set(staged) - {column for column, _, _ in current[table]})
        if extra:
            raise BundleError(f"{path}: table {table} has columns schema {SCHEMA_VERSION} does not: {extra[:10]}")
        for column, kind, _ in current[table]:
            if column in staged and staged[column] != kind:
                _cast(connection, path, table, column, staged[column], kind)


def _cast(connection: duckdb.DuckDBPyConnection, path: Path, table: str, column: str, found: str, kind: str) -> None:
    name = quoted(column)
    bad = connection.execute(
        f"SELECT rowid, CAST({name} AS VARCHAR) FROM {table} WHERE {name} IS NOT NULL "
        f"AND TRY_CAST({name} AS {kind}) IS NULL ORDER BY rowid LIMIT 1"
    ).fetchone()
    if bad is not None:
        what = f"{shown(bad[1])} is {found}, not {kind} (the type of {table}.{column})"
        raise _refuse(path, table, bad[0], column, what)
    connection.execute(f"ALTER TABLE {table} ALTER {name} SET DATA TYPE {kind}")


def check_rows(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """After the migration (every column the store's): the rows themselves."""
    present = {r[0] for r in connection.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
    ).fetchall()}  # fmt: skip
    missing = [table for table in RUN_TABLES if table not in present]
    if missing:
        raise BundleError(f"{path} is damaged: it has no {', '.join(missing)} table (schema {SCHEMA_VERSION} has)")
    _check_nulls(connection, path)
    _check_unique(connection, path)
    for rule in [*RULES, *text_rules()]:
        _first(connection, path, rule.table, rule.column, rule.bad, f"is not valid (valid: {rule.valid})")
    for table, column, owner, key in LINKS:
        bad = f"{column} NOT IN (SELECT {key} FROM {owner})"
        _first(connection, path, table, column, bad, f"is no {owner[:-1]} of this bundle")
    _check_samples_per_result(connection, path)
    _check_hashes(connection, path)
    _check_one_ceiling(connection, path)
    _check_rates(connection, path)
    _check_roofline(connection, path)
    _check_above_ceiling(connection, path)


def _first(connection: duckdb.DuckDBPyConnection, path: Path, table: str, column: str, bad: str, what: str) -> None:
    row = connection.execute(
        f"SELECT rowid, CAST({quoted(column)} AS VARCHAR) FROM {table} WHERE {bad} ORDER BY rowid LIMIT 1"
    ).fetchone()
    if row is not None:
        raise _refuse(path, table, row[0], column, f"{shown(row[1])} {what}")


def _check_nulls(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    for table in RUN_TABLES:
        for column in sorted(required_columns().get(table, ())):
            _first(connection, path, table, column, f"{quoted(column)} IS NULL", "is not valid (valid: a value)")


def _check_unique(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    for table, keys in UNIQUE.items():
        for key in keys:
            columns = ", ".join(key)
            row = connection.execute(
                f"SELECT rowid, CAST({key[-1]} AS VARCHAR) FROM (SELECT rowid, *, row_number() OVER "
                f"(PARTITION BY {columns} ORDER BY rowid) AS copy FROM {table} WHERE {key[-1]} IS NOT NULL) "
                "WHERE copy = 2 ORDER BY rowid LIMIT 1"
            ).fetchone()
            if row is not None:
                what = f"{shown(row[1])} is a second row of the same {' and '.join(key)} (each is unique)"
                raise _refuse(path, table, row[0], key[-1], what)


def _check_samples_per_result(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A result holds at most its iterations' samples (the store writes exactly them) and at most
    MAX_ITERATIONS; a measured one (ok, mismatch) at least one."""
    row = connection.execute(
        "SELECT r.rowid, r.result_id, r.iterations, r.status, coalesce(s.n, 0) FROM results r LEFT JOIN "
        "(SELECT result_id, count(*) AS n FROM samples GROUP BY result_id) s USING (result_id) "
        f"WHERE coalesce(s.n, 0) > least(coalesce(r.iterations, {MAX_ITERATIONS}), {MAX_ITERATIONS}) "
        f"OR (r.status IN {_one_of(MEASURED)} AND coalesce(s.n, 0) = 0) ORDER BY r.rowid LIMIT 1"
    ).fetchone()
    if row is not None:
        rowid, result_id, iterations, status, count = row
        raise _refuse(
            path, "results", rowid, "iterations",
            f"result {shown(result_id)} (status {shown(status)}, iterations {iterations}) has {count:,} samples "
            f"(valid: at most its iterations and at most {MAX_ITERATIONS:,}; at least 1 for status "
            f"{' or '.join(MEASURED)})",
        )  # fmt: skip


def _check_hashes(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Each result's content hash recomputed from its rows: a result carrying another's hash (its
    numbers changed, the hash kept) would otherwise pass for it, here and in every store after."""
    connection.execute("CREATE TEMP TABLE given_hashes AS SELECT rowid AS row, result_id, content_hash FROM results")
    try:
        connection.execute("UPDATE results SET content_hash = NULL")
        connection.execute(hash_results_sql())
        row = connection.execute(
            "SELECT g.row, g.result_id, g.content_hash, r.content_hash FROM given_hashes g JOIN results r "
            "USING (result_id) WHERE g.content_hash IS DISTINCT FROM r.content_hash ORDER BY g.row LIMIT 1"
        ).fetchone()
    finally:
        connection.execute("DROP TABLE given_hashes")
    if row is not None:
        what = (
            f"result {shown(row[1])} carries the content hash {shown(row[2])}, but its rows hash to {row[3]} "
            "(a hash is recomputed on import, never taken as given)"
        )
        raise _refuse(path, "results", row[0], "content_hash", what)


def _check_roofline(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Each result's achieved rates and fractions recomputed from its work, its figures and its run's
    ceilings (harness.store.roofline_sql): a fraction is never taken as given."""
    given = ", ".join(f"{c} AS given_{c}" for c in ROOFLINE_COLUMNS)
    connection.execute(f"CREATE TEMP TABLE given_roofline AS SELECT rowid AS row, result_id, {given} FROM results")
    try:
        for statement in roofline_sql("true"):
            connection.execute(statement)
        differs = " OR ".join(_differs(f"g.given_{c}", f"r.{c}") for c in ROOFLINE_COLUMNS)
        columns = ", ".join(f"g.given_{c}, r.{c}" for c in ROOFLINE_COLUMNS)
        row = connection.execute(
            f"SELECT g.row, g.result_id, {columns} FROM given_roofline g JOIN results r USING (result_id) "
            f"WHERE {differs} ORDER BY g.row LIMIT 1"
        ).fetchone()
    finally:
        connection.execute("DROP TABLE given_roofline")
    if row is not None:
        pairs = list(zip(row[2::2], row[3::2], strict=True))
        name, (found, expected) = next((c, p) for c, p in zip(ROOFLINE_COLUMNS, pairs, strict=True)
                                       if (p[0] is None) != (p[1] is None) or p[0] != p[1])  # fmt: skip
        what = (
            f"result {shown(row[1])} carries {name} {shown(found)}, but its work, figures and its run's "
            f"ceilings give {expected} (recomputed on import, never taken as given)"
        )
        raise _refuse(path, "results", row[0], name, what)


def _check_one_ceiling(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """One ceiling per CEILING_KEY: with two (one 21 times the other), which one a row's fraction is of would
    be the later's by rule alone, and a reader of the report shown both could not tell."""
    key = ", ".join(CEILING_KEY)
    row = connection.execute(
        f"SELECT rowid, first_row, first_value, value, {key} FROM (SELECT rowid, value, {key}, row_number() OVER w AS "
        "copy, first_value(rowid) OVER w AS first_row, first_value(value) OVER w AS first_value FROM ceilings "
        f"WINDOW w AS (PARTITION BY {key} ORDER BY rowid)) WHERE copy = 2 ORDER BY rowid LIMIT 1"
    ).fetchone()
    if row is None:
        return
    rowid, first_row, first_value, value, *found = row
    ceiling = dict(zip(CEILING_KEY, found, strict=True))
    unit = UNITS[ceiling["kind"]]  # a kind of CEILING_KINDS: the rules checked it
    values = " and ".join("no value" if v is None else f"{v:.4g} {unit}" for v in (first_value, value))
    what = (
        f"a second {shown(ceiling['kind'])} ceiling ({shown(ceiling['precision'])}) of run {shown(ceiling['run_id'])} "
        f"on {shown(target_label(ceiling))}: rows {first_row + 1} and {rowid + 1} hold {values} (valid: one per run, "
        "target, kind and precision class, the one its rows are held against, as export --bundle writes it)"
    )
    raise _refuse(path, "ceilings", rowid, "kind", what)


def _check_rates(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """The rates a row's achieved figures multiply, recomputed from its samples (RATES_SQL): a row whose tokens/s
    were multiplied (with its fractions, and its content hash recomputed, as anyone can) is refused here."""
    expected = ", ".join(f"{sql} AS {rate}" for rate, sql in RATES_SQL.items())
    connection.execute(
        f"CREATE TEMP TABLE expected_rates AS SELECT r.result_id, count(s.latency_ms) AS samples, {expected} FROM "
        f"(SELECT *, {PROMPT_SQL} AS prompt FROM results) r LEFT JOIN samples s USING (result_id) "
        "GROUP BY r.result_id, r.batch_size, r.prompt"
    )
    try:
        for mode, rates in RATE_WORK.items():
            for rate, works in rates.items():
                _first_rate_differing(connection, path, mode, rate, works)
    finally:
        connection.execute("DROP TABLE expected_rates")


def _first_rate_differing(
    connection: duckdb.DuckDBPyConnection, path: Path, mode: str, rate: str, works: tuple[str, ...]
) -> None:
    """Refuse the first row of `mode` whose `rate`, put to use by one of `works`, is not its samples'."""
    used = " OR ".join(f"r.{work} IS NOT NULL" for work in works)
    differs = _differs(f"r.{rate}", f"e.{rate}")
    row = connection.execute(
        f"SELECT r.rowid, r.result_id, r.{rate}, e.{rate}, e.samples FROM results r JOIN expected_rates e "
        f"USING (result_id) WHERE r.mode = '{mode}' AND ({used}) AND ({differs}) ORDER BY r.rowid LIMIT 1"
    ).fetchone()
    if row is not None:
        rowid, result_id, given, value, samples = row
        what = (
            f"result {shown(result_id)} carries {rate} {shown(given)}, but its {samples} samples give {value} "
            "(recomputed on import, never taken as given)"
        )
        raise _refuse(path, "results", rowid, rate, what)


def _check_above_ceiling(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A fraction (as _check_roofline recomputed it) at most ABOVE_CEILING x (1 + its ceiling's spread): above
    it, no machine's figure but a counting or unit error in the row's work (bytes per token in thousands)."""
    target = " AND ".join(f"c.{c} IS NOT DISTINCT FROM r.{c}" for c in CEILING_KEY[:5])  # the run and target
    fractions = " UNION ALL ".join(
        f"SELECT rowid, result_id, {', '.join(CEILING_KEY[:5])}, '{kind}' AS kind, {cls} AS class, {kind}_fraction "
        f"AS fraction FROM results WHERE {kind}_fraction IS NOT NULL"
        for kind, cls in (("bandwidth", f"'{BANDWIDTH_CLASS}'"), ("compute", precision_class_sql("precision")))
    )
    row = connection.execute(
        f"SELECT r.rowid, r.result_id, r.kind, r.fraction, c.value, coalesce(c.spread, 0) FROM ({fractions}) r JOIN "
        f"ceilings c ON "
        f"{target} AND c.kind = r.kind AND c.precision = r.class WHERE r.fraction > {ABOVE_CEILING} * "
        "(1 + coalesce(c.spread, 0)) ORDER BY r.rowid LIMIT 1"
    ).fetchone()
    if row is not None:
        rowid, result_id, kind, fraction, value, spread = row
        what = (
            f"result {shown(result_id)} comes to {fraction:.4g} times its {kind} ceiling ({value:.4g} {UNITS[kind]}, "
            f"spread {spread:.1%}) (valid: at most {ABOVE_CEILING:g} x (1 + the spread); more is no machine's "
            "figure but a counting or unit error in its work)"
        )
        raise _refuse(path, "results", rowid, f"{kind}_fraction", what)
