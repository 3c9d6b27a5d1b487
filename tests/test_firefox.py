"""Firefox launched by the harness (--browser firefox): real Firefox ESR, headless, a fresh profile, the run's served
page. One run of bert-tiny (inference) and llama-tiny (generate) at 1 and 2 wasm threads, with Firefox's main
process SIGKILLed mid-job on every 2-thread job (the planted 'kill' fault): the 1-thread rows are `ok`, name the
browser from its own user agent and read their threads back, llama-tiny's tokens equal native ORT's; each killed
job is an `error` row saying Firefox exited, the run finishes, and no Firefox process is left. `ab --browser
firefox` the same way: its blocks handed one at a time to the served page, a killed Firefox that case's rows."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.ab.run import AbRequest, run_ab, validate_ab
from harness.analysis.paired import compare_pair
from harness.browser.execute import run_web
from harness.browser.run import WebRequest
from harness.core.faults import FAULT_ENV
from harness.run.plan import RequestError

pytestmark = pytest.mark.skipif(shutil.which("firefox-esr") is None, reason="needs Firefox ESR (`make setup`)")
QUICK = {"warmup": 0, "iterations": 3, "min_duration_s": 0.0, "max_iterations": 3, "new_tokens": 8}


def firefoxes() -> list[int]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "accelharness-firefox-" in cmdline:  # ours: the fresh profile's folder
            found.append(process.pid)
    return found


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory, web_cache: Path) -> tuple[Any, dict[str, Any]]:  # noqa: F811
    out = tmp_path_factory.mktemp("firefox")
    request = WebRequest(
        models=["bert-tiny", "llama-tiny"], modes=["inference", "generate"], hardware=["wasm"], threads=[1, 2],
        browsers=["firefox"], runtimes=["onnxruntime-web", "llama.cpp"], db_path=out / "f.duckdb",
        output_dir=out / "reports", **QUICK,
    )  # fmt: skip
    summary = run_web(request, faults={"firefox/wasm:threads=2": "kill"})
    return summary, request


def rows(db: Any) -> list[dict[str, Any]]:
    with duckdb.connect(str(db), read_only=True) as con:
        found = con.execute("SELECT model, mode, engine, provider, device, status, error, details FROM results")
        names = [d[0] for d in found.description]
        return [dict(zip(names, row, strict=True)) for row in found.fetchall()]


def test_firefox_rows_name_the_browser_and_check_like_chromium(killed_run: tuple[Any, Any]) -> None:
    import json

    summary, _ = killed_run
    found = rows(summary.db_path)
    ok = [r for r in found if r["provider"] == "wasm:threads=1" and r["engine"] == "onnxruntime-web"]
    assert len(ok) == 3 and {r["status"] for r in ok} == {"ok"}, ok
    for row in ok:
        details = json.loads(row["details"])
        assert row["device"] == "firefox"
        assert details["browser"] == "firefox" and details["browser_version"].startswith("153")
        assert details["browser_binary_version"].startswith("Mozilla Firefox 153")
        assert details["threads_effective"] == 1 and details["cross_origin_isolated"] is True
    generated = json.loads(next(r for r in ok if r["mode"] == "generate")["details"])
    assert generated["tokens_matched"] == generated["tokens_compared"] == QUICK["new_tokens"], generated


def test_a_killed_firefox_is_an_error_row_and_leaves_no_process(killed_run: tuple[Any, Any]) -> None:
    summary, _ = killed_run
    killed = [r for r in rows(summary.db_path) if r["provider"] == "wasm:threads=2" and r["status"] != "unsupported"]
    assert len(killed) == 4 and all(r["status"] == "error" for r in killed), killed
    assert all("firefox" in r["error"] and "exited (exit code -9)" in r["error"] for r in killed), killed
    with duckdb.connect(str(summary.db_path), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("completed",)]
    assert firefoxes() == []


def test_llama_cpp_runs_in_firefox_through_the_served_page(killed_run: tuple[Any, Any]) -> None:
    """wllama in the launched Firefox: an `ok` row whose facts are read back from the runtime (its version, the
    build it loaded, its threads) and whose tokens equal native ORT's; what it cannot run (an encoder) is
    `unsupported` with its reason, and its killed 2-thread job an `error` (above)."""
    summary, _ = killed_run
    found = [r for r in rows(summary.db_path) if r["engine"] == "llama.cpp" and r["provider"] == "wasm:threads=1"]
    (ran,) = [r for r in found if r["model"] == "llama-tiny" and r["mode"] == "generate"]
    assert ran["status"] == "ok" and ran["device"] == "firefox", ran
    details = json.loads(ran["details"])
    runtime = details["runtime"]
    assert runtime["name"] == "llama.cpp" and runtime["threads_effective"] == 1 and runtime["version"], runtime
    assert isinstance(runtime["compat_build"], bool) and details["browser_version"].startswith("153")
    assert details["page_runtime"] == "llama.cpp" and details["model_file"].endswith(".gguf"), details
    assert details["tokens_matched"] == details["tokens_compared"] == QUICK["new_tokens"], details
    assert {r["status"] for r in found if r is not ran} == {"unsupported"}, found  # inference; an encoder


def test_bad_browser_lists_are_refused_before_anything_runs(tmp_path: Path) -> None:
    from harness.browser.run import validate_web

    base = {"models": ["bert-tiny"], "hardware": ["wasm"], "db_path": tmp_path / "x.duckdb"}
    with pytest.raises(RequestError, match="one of chrome, chromium, edge per run"):
        validate_web(WebRequest(**base, browsers=["chrome", "chromium"]))
    with pytest.raises(RequestError, match="--driver and --webdriver-url drive Firefox or Safari"):
        validate_web(WebRequest(**base, driver="webdriver"))
    with pytest.raises(RequestError, match="without credentials"):
        validate_web(WebRequest(**base, browsers=["firefox"], webdriver_url="http://u:p@host:4444"))
    assert not (tmp_path / "x.duckdb").exists()


def test_webdriver_drives_the_same_firefox_to_the_same_tokens(tmp_path: Path, web_cache: Path) -> None:  # noqa: F811
    """--driver webdriver: geckodriver starts Firefox (W3C WebDriver classic), the jobs still come through the
    served page, and the generated tokens equal native ORT's as the process-launched Firefox's do."""
    import json

    pytest.importorskip("harness.web.webdriver").find_geckodriver()
    request = WebRequest(
        models=["llama-tiny"], modes=["generate"], hardware=["wasm"], threads=[1], browsers=["firefox"],
        driver="webdriver", db_path=tmp_path / "w.duckdb", output_dir=tmp_path / "reports", **QUICK,
    )  # fmt: skip
    run_web(request)
    (row,) = rows(request.db_path)
    details = json.loads(row["details"])
    assert row["status"] == "ok" and row["device"] == "firefox", row
    assert details["browser_launched_as"] == "webdriver" and details["webdriver"].startswith("geckodriver")
    assert details["webdriver_capabilities"]["browserVersion"].startswith("153")
    assert details["tokens_matched"] == details["tokens_compared"] == QUICK["new_tokens"], details
    assert firefoxes() == []


# ab's browser half, fast: 6 rounds (the fewest a verdict takes) of one iteration per block
AB_QUICK = {"rounds": 6, "block": 1, "block_time_s": 0.0, "warmup": 1, "output_dir": None}


@pytest.fixture(scope="module")
def ab_killed(tmp_path_factory: pytest.TempPathFactory, web_cache: Path) -> Path:  # noqa: F811
    """`ab --browser firefox` over two cases, Firefox SIGKILLed during B's first block of the first (the planted
    `ab-page:kill` fault)."""
    db = tmp_path_factory.mktemp("ab-firefox") / "ab.duckdb"
    os.environ[FAULT_ENV] = "ab-page:kill:b:b1_s16_fp32"
    try:
        run_ab(AbRequest(a="bert-tiny", b="bert-tiny", web_hardware=["wasm"], browsers=["firefox"],
                         sequence_lengths=[16, 32], db_path=db, **AB_QUICK))  # fmt: skip
    finally:
        os.environ.pop(FAULT_ENV)
    return db


def ab_rows(db: Path) -> list[dict[str, Any]]:
    with duckdb.connect(str(db), read_only=True) as con:
        found = con.execute("SELECT seq_len, variant, device, status, error, details, result_id FROM results "
                            "ORDER BY seq_len, variant")  # fmt: skip
        names = [d[0] for d in found.description]
        return [dict(zip(names, row, strict=True)) | {"details": json.loads(row[5])} for row in found.fetchall()]


def test_ab_in_firefox_interleaves_both_variants_and_names_the_browser(ab_killed: Path) -> None:
    """The case after the kill: A and B measured in the relaunched Firefox, round by round, each row labelled as
    `web --browser firefox` labels its rows (the device, the page's own version, how it was launched, the tier)."""
    ok = [r for r in ab_rows(ab_killed) if r["seq_len"] == 32]
    assert [(r["variant"], r["device"], r["status"]) for r in ok] == [("a", "firefox", "ok"), ("b", "firefox", "ok")]
    for row in ok:
        details = row["details"]
        assert details["browser"] == "firefox" and details["browser_version"].startswith("153"), details
        assert details["browser_launched_as"] == "process" and details["served_device"] is False
        assert details["wasm_tier"]["ratio"] > 0 and details["threads_effective"] == 1
        assert details["browser_restarts"] == 1 and details["ab"]["side"] == row["variant"]
        with duckdb.connect(str(ab_killed), read_only=True) as con:
            rounds = con.execute("SELECT DISTINCT round FROM samples WHERE result_id = ?", [row["result_id"]])
            assert sorted(r[0] for r in rounds.fetchall()) == list(range(AB_QUICK["rounds"]))
    verdicts = {row.case: row for row in compare_pair(ab_killed, "latest").rows}
    assert verdicts["b1 s32 fp32"].target == "wasm/onnxruntime-web:wasm:threads=1 @ firefox"
    assert verdicts["b1 s32 fp32"].ratio is not None and verdicts["b1 s16 fp32"].verdict == "unmeasured"


def test_ab_a_killed_firefox_fails_its_case_and_leaves_no_process(ab_killed: Path) -> None:
    killed = [r for r in ab_rows(ab_killed) if r["seq_len"] == 16]
    assert [(r["variant"], r["device"], r["status"]) for r in killed] == [("a", "firefox", "error"),
                                                                           ("b", "firefox", "error")]  # fmt: skip
    assert "firefox" in killed[1]["error"] and "exited (exit code -9)" in killed[1]["error"], killed
    assert killed[0]["error"].startswith("not measured: variant B failed")
    assert killed[1]["details"]["browser"] == "firefox"  # the browser the case failed in
    with duckdb.connect(str(ab_killed), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("completed",)]
    assert firefoxes() == []


def test_ab_across_browsers_pairs_a_chromium_setting_with_a_firefox_one(tmp_path: Path) -> None:
    """--a-browser chromium --b-browser firefox: each pair is A's setting in Chromium beside B's same EP and threads
    in Firefox (checked without running; the run itself: the slow test below)."""
    plan = validate_ab(AbRequest(a="bert-tiny", b="bert-tiny", web_hardware=["wasm"], threads=[1, 2],
                                 a_browser="chromium", b_browser="firefox", db_path=tmp_path / "x.duckdb"))  # fmt: skip
    pairs = [(pair["a"].target.label, pair["b"].target.label) for pair in plan.web_pairs]
    assert pairs == [(f"wasm/onnxruntime-web:wasm:threads={n}", f"wasm/onnxruntime-web:wasm:threads={n} @ firefox")
                     for n in (1, 2)]  # fmt: skip
    assert plan.total_results == 2 * 2 and not (tmp_path / "x.duckdb").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium")
def test_ab_across_browsers_gives_one_verdict_for_the_browsers(tmp_path: Path, web_cache: Path) -> None:  # noqa: F811
    """A in Chromium, B in Firefox, both open and their blocks interleaved: one paired row naming both browsers."""
    db = tmp_path / "x.duckdb"
    run_ab(AbRequest(a="bert-tiny", b="bert-tiny", web_hardware=["wasm"], a_browser="chromium", b_browser="firefox",
                     sequence_lengths=[16], db_path=db, **AB_QUICK))  # fmt: skip
    found = ab_rows(db)
    assert [(r["variant"], r["device"], r["status"]) for r in found] == [("a", None, "ok"), ("b", "firefox", "ok")]
    (row,) = compare_pair(db, "latest").rows
    assert row.target == "wasm/onnxruntime-web:wasm:threads=1 (chromium → firefox)" and row.ratio is not None
    assert firefoxes() == []
