"""Issue 42, import's part and the CSV item: import checks what it can recompute, and CSV carries no escape.

One real run (module-scoped): llama-tiny on ONNX Runtime's CPU EP with its ceilings measured, inference and
generate at fp32 and q4 (inference rows hold FLOPs per item against the fp32 and int4 compute ceilings, generate
rows bytes per token against the bandwidth ceiling too), exported; then the run as a stop before its last case
leaves it, exported, resumed (its target's ceilings measured again: --ceilings fresh, which a resumed run keeps;
by default it takes its own) and exported once more. Every hostile bundle
is the first export rewritten as the issue found it (test_bundle_hostile.craft: well-formed, only its content
hostile); each is imported through the CLI: exit 2, one line, no traceback, the store untouched."""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from conftest import run_cli
from test_bundle_hostile import Tables, craft, read_members, refused, set_column

from harness.bundle.checks import RATES_SQL
from harness.core.bounds import MAX_TOKEN_TEXT_CHARS
from harness.core.escaping import csv_cell
from harness.core.generation import generation_figures
from harness.core.roofline import ABOVE_CEILING
from harness.core.stats import summarize
from harness.store import ROOFLINE_COLUMNS, hash_results_sql, open_store

RUN = ["native", "--model", "llama-tiny", "--engines", "onnxruntime", "--hardware", "cpu", "--mode",
       "inference,generate", "--new-tokens", "4", "--sequence-lengths", "8", "--precision", "fp32,q4",
       "--iterations", "3", "--warmup", "0", "--min-duration", "0", "--no-reports", "--ceilings", "fresh"]  # fmt: skip
CEILINGS = {"ACCELHARNESS_NO_CEILINGS": "0"}  # conftest makes --no-ceilings the suite's default
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x07\x9b31m\u202e"  # a window title, clear screen, BEL, a C1 CSI, a bidi override


@dataclass(frozen=True)
class Measured:
    source: Path  # the store the run was measured into (resumed by the end of the fixture)
    bundle: Path  # export --bundle of the completed run
    home: Path  # a store the genuine bundle was imported into
    interrupted: Path  # export of the run stopped before its last case
    resumed: Path  # export of the same run once resumed and completed


def export(db: Path, bundle: Path) -> Path:
    done = run_cli("export", "--bundle", str(bundle), "--db", str(db))
    assert done.returncode == 0, done.stderr
    return bundle


def stop_before_last_case(db: Path) -> None:
    """The run as a stop before its q4 generate case leaves it: that row not stored, the run interrupted."""
    with open_store(db) as store:
        last = "SELECT result_id FROM results WHERE mode = 'generate' AND precision = 'q4'"
        store.connection.execute(f"DELETE FROM samples WHERE result_id IN ({last})")
        store.connection.execute(f"DELETE FROM results WHERE result_id IN ({last})")
        store.connection.execute("UPDATE runs SET status = 'interrupted'")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Measured:
    directory = tmp_path_factory.mktemp("recompute")
    source, home = directory / "source.duckdb", directory / "home.duckdb"
    where = ["--db", str(source), "--output-dir", str(directory / "out")]
    done = run_cli(*RUN, *where, env=CEILINGS)
    assert done.returncode == 0, done.stderr
    bundle = export(source, directory / "genuine.bundle")
    assert run_cli("import", str(bundle), "--db", str(home)).returncode == 0
    stop_before_last_case(source)
    interrupted = export(source, directory / "interrupted.bundle")
    done = run_cli(*RUN, *where, "--resume", env=CEILINGS)
    assert done.returncode == 0 and "{'ok': 1}" in done.stdout, done.stdout + done.stderr
    return Measured(source, bundle, home, interrupted, export(source, directory / "resumed.bundle"))


@pytest.fixture
def store(measured: Measured, tmp_path: Path) -> Path:
    """A copy of the store holding the genuine run: what a refused import must leave as it was."""
    copy = tmp_path / "store.duckdb"
    shutil.copy(measured.home, copy)
    return copy


def rows(tables: Tables, table: str) -> list[dict[str, Any]]:
    return tables[table].to_pylist()


def edit_rows(tables: Tables, table: str, column: str, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Set `column` of every row of `table` to edit(row) (the row as it was)."""
    values = [edit(row) for row in rows(tables, table)]
    set_column(tables, table, column, lambda _: values)


def rehash(tables: Tables) -> None:
    """Each result's content hash recomputed from its rows by the store's own definition, as anyone can."""
    with duckdb.connect() as connection:
        for table in ("results", "samples"):
            connection.register(f"given_{table}", tables[table])
            connection.execute(f"CREATE TABLE {table} AS SELECT * FROM given_{table}")
        connection.execute(hash_results_sql("result_id IS NOT NULL"))
        hashes = dict(connection.execute("SELECT result_id, content_hash FROM results").fetchall())
    edit_rows(tables, "results", "content_hash", lambda row: hashes[row["result_id"]])


# --- no false refusal: every kind of genuine row the store has ---------------------------------------------------


def rates_of(row: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, float | None]:
    """A row's rates from its samples by the functions the store made them with (no speech row here)."""
    ttfts = [s["ttft_ms"] for s in samples if s["ttft_ms"] is not None]
    steps = [s["steps_ms"] for s in samples if s["steps_ms"] is not None]
    generate = row["mode"] == "generate"
    generation = generation_figures(row["batch_size"], row["seq_len"], ttfts, steps) if generate else {}
    summary = summarize([s["latency_ms"] for s in samples], row["batch_size"])
    return {"throughput_per_s": summary.throughput_per_s if summary else None,
            **{r: generation.get(r) for r in ("prefill_tokens_per_s", "decode_tokens_per_s")}}  # fmt: skip


def test_the_genuine_bundle_holds_every_kind_of_row_and_imports_recomputed(measured: Measured, tmp_path: Path) -> None:
    """Inference rows (FLOPs per item, fp32 and int4 compute) and generate rows (bytes per token, bandwidth, and
    FLOPs per prompt token) are recomputed on import to what their store computed: rates, fractions, the bound."""
    _, tables = read_members(measured.bundle)
    results = rows(tables, "results")
    kinds = {(r["mode"], r["precision"]) for r in results if r["compute_fraction"] is not None}
    assert kinds == {(m, p) for m in ("inference", "generate") for p in ("fp32", "q4")}
    assert all(r["bandwidth_fraction"] is not None for r in results if r["mode"] == "generate")
    for r in results:  # the store's rates are these functions' of its samples, exactly; import's (RATES_SQL) agree
        samples = sorted((s for s in rows(tables, "samples") if s["result_id"] == r["result_id"]),
                         key=lambda s: s["iteration"])  # fmt: skip
        assert {rate: r[rate] for rate in RATES_SQL} == rates_of(r, samples), r["mode"]
    ceilings = {(c["kind"], c["precision"]): c for c in rows(tables, "ceilings")}
    for r in results:  # each figure within the bound import holds it to, far within
        compute = ceilings["compute", "int4" if r["precision"] == "q4" else "fp32"]
        assert r["compute_fraction"] <= ABOVE_CEILING * (1 + compute["spread"])
        assert (r["bandwidth_fraction"] or 0) <= ABOVE_CEILING * (1 + ceilings["bandwidth", "bytes"]["spread"])
    same = craft(measured.bundle, tmp_path / "same.bundle")  # written again by another Parquet writer
    done = run_cli("import", str(same), "--db", str(tmp_path / "a.duckdb"))
    assert done.returncode == 0 and "4 results (12 samples) added" in done.stdout, done.stdout + done.stderr


def test_a_resumed_run_exports_the_ceiling_its_rows_are_held_against_and_imports(
    measured: Measured, tmp_path: Path
) -> None:
    """The resume measured the target's ceilings again (--ceilings fresh: the source holds two per kind and class);
    its bundle carries the later, which its rows are held against. A store given the bundle from before the resume
    and then the one after holds every row against that later one, and a bundle of that store imports too."""
    with open_store(measured.source, read_only=True) as source:
        twice = source.query("SELECT kind, precision, count(*) AS n FROM ceilings GROUP BY ALL HAVING n > 1")
    assert twice, "the resume measured no ceiling again"
    _, tables = read_members(measured.resumed)
    keys = [(c["kind"], c["precision"]) for c in rows(tables, "ceilings")]
    assert len(keys) == len(set(keys)) == 3
    both = tmp_path / "both.duckdb"
    for bundle in (measured.interrupted, measured.resumed):
        done = run_cli("import", str(bundle), "--db", str(both))
        assert done.returncode == 0, done.stderr
    with open_store(both, read_only=True) as store:
        held = store.query(f"SELECT {', '.join(ROOFLINE_COLUMNS)} FROM results ORDER BY result_id")
    with open_store(measured.source, read_only=True) as source:
        assert held == source.query(f"SELECT {', '.join(ROOFLINE_COLUMNS)} FROM results ORDER BY result_id")
    again = export(both, tmp_path / "again.bundle")
    done = run_cli("import", str(again), "--db", str(tmp_path / "third.duckdb"))
    assert done.returncode == 0 and "4 results" in done.stdout, done.stdout + done.stderr


# --- one ceiling per run, target, kind and precision class -------------------------------------------------------


def a_second_ceiling(tables: Tables) -> None:
    """The bandwidth ceiling again, 21 times the genuine one (its amount and value both: consistent)."""
    ceilings = tables["ceilings"]
    genuine = next(c for c in ceilings.to_pylist() if c["kind"] == "bandwidth")
    second = genuine | {"amount": genuine["amount"] * 21, "value": genuine["value"] * 21}
    tables["ceilings"] = pa.concat_tables([ceilings, pa.Table.from_pylist([second], ceilings.schema)])


def test_two_bandwidth_ceilings_of_one_target_are_refused_naming_both(measured: Measured, store: Path,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    _, tables = read_members(measured.bundle)
    count = tables["ceilings"].num_rows
    first = next(i for i, c in enumerate(rows(tables, "ceilings")) if c["kind"] == "bandwidth") + 1
    bundle = craft(measured.bundle, tmp_path / "second.bundle", a_second_ceiling)
    refused(bundle, store, f"ceilings.parquet row {count + 1}, column kind", "a second 'bandwidth' ceiling ('bytes')",
            f"rows {first} and {count + 1}", "cpu/onnxruntime", "GB/s")  # fmt: skip


# --- rates, achieved rates and fractions recomputed; a fraction bounded ------------------------------------------


def scaled_work(factor: float) -> Callable[[Tables], None]:
    """Each generate row's bytes per token, achieved GB/s and bandwidth fraction times `factor`: consistent."""

    def change(tables: Tables) -> None:
        for column in ("bytes_per_token", "achieved_gbps", "bandwidth_fraction"):
            edit_rows(tables, "results", column,
                      lambda r, c=column: r[c] * factor if r["mode"] == "generate" else r[c])  # fmt: skip

    return change


def test_work_scaled_1000_times_with_its_figures_is_refused_above_the_ceiling(
    measured: Measured, tmp_path: Path
) -> None:
    """The issue's bundle: bytes per token, achieved rate and fraction all x1000 and consistent (the hash covers
    none of them), which imported and drew a row at 28.5 times its bandwidth ceiling. x1000 as found; more where
    this machine's row came so low that x1000 would stay under the bound."""
    _, tables = read_members(measured.bundle)
    spread = next(c["spread"] for c in rows(tables, "ceilings") if c["kind"] == "bandwidth")
    highest = max(r["bandwidth_fraction"] for r in rows(tables, "results") if r["mode"] == "generate")
    factor = max(1000.0, 2 * ABOVE_CEILING * (1 + spread) / highest)
    bundle = craft(measured.bundle, tmp_path / "x1000.bundle", scaled_work(factor))
    refused(bundle, tmp_path / "new.duckdb", "column bandwidth_fraction", "times its bandwidth ceiling",
            f"at most {ABOVE_CEILING:g} x (1 + the spread)")  # fmt: skip


RATES = {  # a rate times 1000 with the figures made of it, the content hash recomputed: (mode, rate, figures)
    "tg tokens/s": ("generate", "decode_tokens_per_s", ("achieved_gbps", "bandwidth_fraction")),
    "items/s": ("inference", "throughput_per_s", ("achieved_gflops", "compute_fraction")),
}


@pytest.mark.parametrize("rate", RATES, ids=list(RATES))
def test_a_rate_scaled_with_its_figures_and_hash_is_refused_by_its_samples(
    measured: Measured, store: Path, tmp_path: Path, rate: str
) -> None:
    mode, column, figures = RATES[rate]

    def change(tables: Tables) -> None:
        for each in (column, *figures):
            edit_rows(tables, "results", each, lambda r, c=each: r[c] * 1000 if r["mode"] == mode else r[c])
        rehash(tables)

    bundle = craft(measured.bundle, tmp_path / "rate.bundle", change)
    refused(bundle, store, f"column {column}", "but its 3 samples give", "never taken as given",
            real=rate == next(iter(RATES)))  # fmt: skip


# --- text bounded by what a fresh run stores ----------------------------------------------------------------------

TEN_MB = "x" * 10_000_000
LONG = {  # column: (its value, what the refusal says is valid)
    "output_text": (TEN_MB, f"at most {MAX_TOKEN_TEXT_CHARS:,} characters per token generated"),
    "output_texts": (json.dumps([TEN_MB]), "a JSON list of at most batch_size texts"),
    "error": ("y" * 2_000_000, "NULL or at most 1,048,576 bytes"),
    "details": (json.dumps({"pad": "z" * 2_000_000}), "bytes and 32 per iteration"),
    "token_reference": ("r" * 2_000_000, "NULL or at most 1,048,576 bytes"),
}


@pytest.mark.parametrize("column", LONG, ids=list(LONG))
def test_text_past_what_a_fresh_run_stores_is_refused(measured: Measured, tmp_path: Path, column: str) -> None:
    value, valid = LONG[column]

    def change(tables: Tables) -> None:
        edit_rows(tables, "results", column, lambda r: value if r["mode"] == "generate" else r[column])

    bundle = craft(measured.bundle, tmp_path / "long.bundle", change)
    first = next(i for i, r in enumerate(rows(read_members(measured.bundle)[1], "results")) if r["mode"] == "generate")
    refused(bundle, tmp_path / "new.duckdb", f"results.parquet row {first + 1}, column {column}", valid,
            real=column == next(iter(LONG)))  # fmt: skip


# --- CSV cells carry no control character -------------------------------------------------------------------------


def test_csv_cell_strips_escapes_and_keeps_tabs_and_line_breaks() -> None:
    assert csv_cell(f"a{ESCAPES}b\tc\nd\re") == "ab\tc\nd\re"
    assert csv_cell(f"\x1b[0m=HYPERLINK(1){ESCAPES}") == "'=HYPERLINK(1)"  # a formula behind an escape, found
    assert csv_cell("\tx") == "'\tx" and csv_cell(-1.5) == -1.5 and csv_cell("é plain") == "é plain"


def test_escapes_in_stored_text_never_reach_a_csv_cell(measured: Measured, tmp_path: Path) -> None:
    """A bundle's text keeps what it came with (it is not refused: the store keeps text as it came); every CSV
    written from it, the report's, `query --format csv` and `export --format csv`, has none of its escapes."""

    def escaped(row: dict[str, Any], column: str) -> str | None:
        return f"fine{ESCAPES} text\x07 end" if row["mode"] == "generate" else row[column]

    def change(tables: Tables) -> None:
        for column in ("output_text", "token_reference"):
            edit_rows(tables, "results", column, lambda r, c=column: escaped(r, c))

    bundle = craft(measured.bundle, tmp_path / "escapes.bundle", change)
    db = tmp_path / "escapes.duckdb"
    assert run_cli("import", str(bundle), "--db", str(db)).returncode == 0
    report = tmp_path / "r.csv"
    assert run_cli("report", "--run", "all", "--format", "csv", "--out", str(report), "--db", str(db)).returncode == 0
    query = run_cli("query", "--sql", "SELECT output_text, token_reference FROM results", "--format", "csv",
                    "--db", str(db))  # fmt: skip
    exported = run_cli("export", "--out", str(tmp_path / "export"), "--format", "csv", "--db", str(db))
    assert query.returncode == 0 and exported.returncode == 0, query.stderr + exported.stderr
    texts = {"report": report.read_text(), "query": query.stdout, "results.csv": (tmp_path / "export/results.csv")
             .read_text()}  # fmt: skip
    for name, text in texts.items():
        found = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
        assert "fine text end" in found, name
        assert not any(ch in text for ch in "\x1b\x07\x9b\u202e"), name
