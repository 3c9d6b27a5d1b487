"""A launched Firefox's ceilings (--browser firefox): the served page's calibrations (harness.browser.page_ceilings)
run in it as in a device opening `web --serve`'s URL, so its rows get bandwidth and compute fractions like
Chromium's; `web --ceilings-only --browser firefox` then checks each earlier ceiling in the page before it reuses
it (harness.run.ceiling_check) and states the check. Real Firefox ESR, headless: one bert-tiny job at 1 wasm thread,
then the ceilings alone (about 12 s here). The Firefox modules share one pytest worker (tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import run_cli
from test_firefox import firefoxes

pytestmark = pytest.mark.skipif(shutil.which("firefox-esr") is None, reason="needs Firefox ESR (`make setup`)")
FIREFOX = ["--hardware", "wasm", "--threads", "1", "--precision", "fp32", "--browser", "firefox", "--no-reports"]
QUICK = ["--warmup", "1", "--iterations", "3", "--max-iterations", "3", "--min-duration", "0"]
CEILINGS_ON = {"ACCELHARNESS_NO_CEILINGS": "0"}  # tests/conftest.py turns them off for every other test


def query(db: Path, sql: str) -> list[dict[str, Any]]:
    with duckdb.connect(str(db), read_only=True) as con:
        found = con.execute(sql)
        names = [d[0] for d in found.description]
        return [dict(zip(names, row, strict=True)) for row in found.fetchall()]


# slow (CI skips it: 10-30 s on the one worker all Firefox modules share, with CI at 14:39 of its 15 minutes);
# the check before a reuse is tested in CI by tests/test_ceiling_check.py (natively, and the page's protocol)
@pytest.mark.slow
def test_a_launched_firefox_measures_ceilings_its_rows_get_fractions_and_a_later_run_checks_them(
    tmp_path: Path,
) -> None:
    where = ["--db", str(db := tmp_path / "f.duckdb"), "--output-dir", str(tmp_path / "out")]
    ran = run_cli("web", "--model", "bert-tiny", *FIREFOX, *QUICK, *where, env=CEILINGS_ON)
    assert ran.returncode == 0, ran.stderr
    [row] = query(db, "SELECT * FROM results")
    assert row["status"] == "ok" and row["device"] == "firefox", row
    assert row["bandwidth_fraction"] > 0 and row["compute_fraction"] > 0, row
    measured = {(c["kind"], c["precision"]): c for c in query(db, "SELECT * FROM ceilings")}
    assert {("bandwidth", "bytes"), ("compute", "fp32")} <= set(measured)
    for ceiling in measured.values():
        assert ceiling["device"] == "firefox" and ceiling["provider"] == "wasm:threads=1", ceiling
        assert ceiling["reused_from"] is None and "Firefox/" in ceiling["software"], ceiling
        assert ceiling["error"] is not None or (ceiling["value"] > 0 and ceiling["sizing"].startswith("probed "))
    again = run_cli("web", "--ceilings-only", *FIREFOX, *where, env=CEILINGS_ON)
    assert again.returncode == 0 and "Ceilings" in again.stdout, again.stdout + again.stderr
    first = row["run_id"]
    later = query(db, f"SELECT * FROM ceilings WHERE run_id <> '{first}' AND error IS NULL")
    assert {(c["kind"], c["precision"]) for c in later} == {k for k, c in measured.items() if c["error"] is None}
    for ceiling in later:  # reused after its check, or (the machine quieter now) measured afresh saying why
        reused = ceiling["reused_from"] == first and ceiling["sizing"].split("; ")[0].endswith(": reused")
        remeasured = ceiling["reused_from"] is None and f"prior of run {first} re-measured" in ceiling["sizing"]
        assert ceiling["sizing"].startswith("quick check ") and (reused or remeasured), ceiling
    assert firefoxes() == []
