"""Stored text on the way out (issue 30, items 6-9): a run id, a machine label, a model name or an error
can come from a bundle made elsewhere or a served device. One real run is measured, then its rows are
rewritten in DuckDB to hostile values; every command that writes or prints them is run through the CLI."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import pytest
from conftest import QUICK, run_cli, run_cli_process

from harness.analysis.machines import resolve_machine
from harness.analysis.tables import AnalysisError
from harness.core.escaping import csv_cell, markdown_text
from harness.core.paths import UnsafePathError, inside, safe_name
from harness.store import open_store

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\x9b1m"  # a window title, clear screen, red, a C1 CSI
LABEL = f"lab{ESCAPES}[bold]"
MODEL = "<img src=x onerror=alert(1)>"
ERROR = f'<script>alert(1)</script> | =HYPERLINK("http://evil","x"){ESCAPES}\nnext line'
FORMULAS = ("=", "+", "-", "@", "\t", "\r")


def climbing_id(directory: Path) -> str:
    """A run id that, joined to any output folder, names directory/victim: enough '..' to reach the root."""
    return "../" * 40 + f"{directory.as_posix().lstrip('/')}/victim"


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run of a small ONNX graph, labelled 'lab'."""
    from test_compare import MEASURE, chain_onnx

    directory = tmp_path_factory.mktemp("measured")
    model = chain_onnx(directory / "model", 2)
    db = directory / "base.duckdb"
    done = run_cli("native", "--model-path", str(model), *MEASURE, *QUICK, "--machine-label", "lab",
                   "--db", str(db), "--output-dir", str(directory / "out"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    return db


def copy_run(db: Path, run_id: str, machine_id: str, label: str | None, hardware_class: str) -> None:
    """A second run, on another machine, made of the first run's rows."""
    with open_store(db) as store:
        con = store.connection
        first = con.execute("SELECT run_id FROM runs ORDER BY started_at LIMIT 1").fetchone()[0]
        con.execute(
            "INSERT INTO runs SELECT * REPLACE (?::VARCHAR AS run_id, uuid()::VARCHAR AS run_uuid, ?::VARCHAR AS "
            "machine_id, ?::VARCHAR AS machine_label, ?::VARCHAR AS hardware_class, started_at + INTERVAL 1 MINUTE "
            "AS started_at) FROM runs WHERE run_id = ?",
            [run_id, machine_id, label, hardware_class, first],
        )
        con.execute(
            "INSERT INTO hardware SELECT * REPLACE (? AS run_id) FROM hardware WHERE run_id = ?", [run_id, first]
        )
        con.execute(
            "INSERT INTO results SELECT * REPLACE (result_id || ? AS result_id, ? AS run_id) FROM results "
            "WHERE run_id = ?",
            [run_id[-6:], run_id, first],
        )


@pytest.fixture(scope="module")
def hostile(measured: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The run's rows rewritten as a hostile bundle would carry them, and a victim folder its run id
    climbs to; a second run on another machine (another hardware class) whose id also climbs out."""
    directory = tmp_path_factory.mktemp("hostile")
    victim = directory / "victim-folder"
    victim.mkdir()
    db = directory / "hostile.duckdb"
    shutil.copy(measured, db)
    run_id = climbing_id(victim)
    with open_store(db) as store:
        con = store.connection
        (old,) = con.execute("SELECT run_id FROM runs").fetchone()
        for table in ("runs", "hardware", "results", "controls", "ceilings"):
            con.execute(f"UPDATE {table} SET run_id = ? WHERE run_id = ?", [run_id, old])
        con.execute("UPDATE runs SET machine_label = ?, cpu_model = ?", [LABEL, MODEL])
        con.execute("UPDATE results SET model = ?, status = 'error', error = ?, weights = '@SUM(1+1)', load_ms = -1.5",
                    [MODEL, ERROR])  # fmt: skip
    copy_run(db, run_id + "-b", "feedface00000000", "=cmd|' /C calc'!A0", "Other CPU · no GPU · 64 GiB")
    return db, victim


def no_escapes(done) -> None:
    for stream in (done.stdout, done.stderr):
        assert "\x1b" not in stream and "\x9b" not in stream and "\x07" not in stream, stream


# --- item 6: a run id is never a path ----------------------------------------------------------------
def test_safe_name_keeps_a_plain_id_and_hashes_anything_else_apart() -> None:
    assert safe_name("20261126T012855-3916b5") == "20261126T012855-3916b5"
    names = {safe_name(text) for text in ("../x", "..%2Fx", "/x", ".x", "x/", "", "a" * 500, "a" * 501)}
    assert len(names) == 8  # never two the same
    for name in names:
        assert name and not name.startswith(".") and "/" not in name and len(name) <= 96


def test_a_name_that_resolves_outside_its_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "r.md").symlink_to(tmp_path / "victim.md")
    with pytest.raises(UnsafePathError, match="outside"):
        inside(tmp_path / "out", "r.md")
    with pytest.raises(UnsafePathError):
        inside(tmp_path / "out", "../victim.md")
    assert inside(tmp_path / "out", "ok.md") == tmp_path / "out" / "ok.md"


def test_a_run_id_that_climbs_out_is_written_inside_the_output_dir(hostile: tuple[Path, Path], tmp_path: Path) -> None:
    db, victim = hostile
    out = tmp_path / "deep" / "a" / "b" / "c" / "out"
    with open_store(db, read_only=True) as store:
        first = store.query("SELECT run_id FROM runs ORDER BY started_at")[0]["run_id"]
    done = run_cli("report", "--run", first, "--output-dir", str(out), "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert list(victim.iterdir()) == []  # victim.md, .html, .csv, -plots/: none written there
    written = sorted(p.name for p in out.iterdir())
    stem = safe_name(first)
    assert written == sorted([f"{stem}.md", f"{stem}.html", f"{stem}.csv", f"{stem}.json", f"{stem}-plots"]), written
    every = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert every and all(p.is_relative_to(out) for p in every)
    no_escapes(done)


def test_a_report_file_linked_outside_the_output_dir_is_refused(hostile: tuple[Path, Path], tmp_path: Path) -> None:
    db, _ = hostile
    with open_store(db, read_only=True) as store:
        first = store.query("SELECT run_id FROM runs ORDER BY started_at")[0]["run_id"]
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{safe_name(first)}.md").symlink_to(tmp_path / "elsewhere.md")
    done = run_cli_process("report", "--run", first, "--output-dir", str(out), "--db", str(db))
    assert done.returncode == 2 and "outside" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "elsewhere.md").exists()
    assert [p.name for p in out.iterdir()] == [f"{safe_name(first)}.md"]  # no other format written before it


# --- item 7: stored text reaches no terminal raw ------------------------------------------------------
# The first case runs the real CLI, the others the app in this process (a Python start is ~0.8 s of CPU): what
# reaches stdout and stderr is the same text either way.
PRINTING = [
    ["query", "--report", "machines"],
    ["query", "--report", "latest"],
    ["query", "--report", "latest", "--format", "csv"],
    ["compare", "--across-machines"],
    ["recommend", "--machine", "nope", "--model-family", "embedding"],
    ["matrix", "--output-dir", "{tmp}"],
    ["report", "--run", "latest", "--format", "md", "--output-dir", "{tmp}"],
]


@pytest.mark.parametrize(
    "args",
    PRINTING,
    ids=["query-machines", "query-latest", "query-csv", "compare-across-machines", "recommend-machine", "matrix",
         "report"],
)  # fmt: skip
def test_stored_escapes_never_reach_the_terminal(hostile: tuple[Path, Path], tmp_path: Path, args: list[str]) -> None:
    db, _ = hostile
    cli = run_cli_process if args is PRINTING[0] else run_cli
    done = cli(*(a.replace("{tmp}", str(tmp_path)) for a in args), "--db", str(db))
    assert done.returncode in (0, 2), done.stderr
    assert "Traceback" not in done.stderr
    no_escapes(done)
    if args[0] == "recommend":
        assert done.returncode == 2 and "lab[bold]" in done.stderr  # no escape left, no markup read


# --- item 8: Markdown escapes HTML, CSV neutralizes formulas ------------------------------------------
def test_markdown_and_csv_helpers() -> None:
    assert markdown_text("<script>a|b</script>\n=x") == r"&lt;script&gt;a\|b&lt;/script&gt; =x"
    assert [csv_cell(f"{c}x") for c in FORMULAS] == [f"'{c}x" for c in FORMULAS]
    assert csv_cell(-1.5) == -1.5 and csv_cell(3) == 3 and csv_cell("plain") == "plain"


def test_markdown_reports_carry_no_html_from_the_store(hostile: tuple[Path, Path], tmp_path: Path) -> None:
    db, _ = hostile
    drawn = run_cli_process("report", "--run", "all", "--format", "md", "--output-dir", str(tmp_path), "--db", str(db))
    assert drawn.returncode == 0
    assert run_cli("matrix", "--output-dir", str(tmp_path), "--db", str(db)).returncode == 0
    for name in ("all-runs.md", "compatibility_matrix.md"):
        text = (tmp_path / name).read_text()
        assert "<script" not in text and "<img" not in text and "\x1b" not in text, name
        assert "&lt;img src=x onerror=alert(1)&gt;" in text, name
    report = (tmp_path / "all-runs.md").read_text()
    assert r"&lt;/script&gt; \| =HYPERLINK" in report  # the | cannot open a table cell


def cells(text: str) -> list[str]:
    return [cell for row in csv.reader(io.StringIO(text)) for cell in row]


def test_csv_cells_a_spreadsheet_would_run_are_neutralized(hostile: tuple[Path, Path], tmp_path: Path) -> None:
    db, _ = hostile
    report = tmp_path / "r.csv"
    drawn = run_cli_process("report", "--run", "all", "--format", "csv", "--out", str(report), "--db", str(db))
    assert drawn.returncode == 0
    query = run_cli("query", "--sql", "SELECT weights, error, load_ms FROM results", "--format", "csv", "--db", str(db))
    exported = run_cli("export", "--out", str(tmp_path / "export"), "--format", "csv", "--db", str(db))
    assert query.returncode == 0 and exported.returncode == 0, query.stderr + exported.stderr
    texts = {"report": report.read_text(), "query": query.stdout}
    texts |= {p.name: p.read_text() for p in (tmp_path / "export").glob("*.csv")}
    for name, text in texts.items():
        found = cells(text)
        assert "'@SUM(1+1)" in found or name not in ("report", "query", "results.csv"), name
        bad = [c for c in found if c.startswith(FORMULAS) and c != "-1.5"]
        assert not bad, (name, bad)
    assert "-1.5" in cells(texts["results.csv"]) and "-1.5" in cells(texts["query"])  # a number stays a number
    assert any(c.startswith("'=cmd|") for c in cells(texts["runs.csv"]))


# --- item 9: --machine names one machine --------------------------------------------------------------
@pytest.fixture(scope="module")
def machines(measured: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four machines: 'lab' (the real run's), two whose ids share 8 characters, two sharing a label."""
    db = tmp_path_factory.mktemp("machines") / "m.duckdb"
    shutil.copy(measured, db)
    copy_run(db, "r-twin-1", "7a7a7a7a00000001", "twin-1", "C")
    copy_run(db, "r-twin-2", "7a7a7a7a00000002", "twin-2", "C")
    copy_run(db, "r-shared-1", "5e5e5e5e00000001", "shared", "C")
    copy_run(db, "r-shared-2", "6e6e6e6e00000002", "shared", "C")
    return db


def test_machine_takes_an_exact_id_a_long_unique_prefix_or_an_exact_label(machines: Path) -> None:
    assert resolve_machine(machines, "lab") == ("machine_label", "lab")
    assert resolve_machine(machines, "7a7a7a7a00000002") == ("machine_id", "7a7a7a7a00000002")
    assert resolve_machine(machines, "6e6e6e6e") == ("machine_id", "6e6e6e6e00000002")
    assert resolve_machine(machines, "5e5e5e5e0") == ("machine_id", "5e5e5e5e00000001")
    for given, why in [("", "empty"), ("7", "too short"), ("7a7a7a7a", "several machine ids"),
                       ("shared", "label of several machines"), ("nope", "no run")]:  # fmt: skip
        with pytest.raises(AnalysisError, match=why):
            resolve_machine(machines, given)


@pytest.mark.parametrize("given", ["", "7", "7a7a7a7a", "shared"])
def test_an_empty_short_or_ambiguous_machine_is_exit_2_listing_the_candidates(machines: Path, given: str) -> None:
    cli = run_cli_process if given == "" else run_cli  # one real CLI case; the app in-process for the others
    done = cli("recommend", "--model-family", "embedding", "--machine", given, "--db", str(machines))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    expected = {"": "lab", "7": "7a7a7a7a00000001", "7a7a7a7a": "7a7a7a7a00000002", "shared": "6e6e6e6e00000002"}
    assert expected[given] in done.stderr
    predicted = cli("predict", "--evaluate", "--machine", given, "--db", str(machines))
    assert predicted.returncode == 2 and expected[given] in predicted.stderr, predicted.stderr
