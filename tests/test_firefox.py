"""Firefox launched by the harness (--browser firefox): real Firefox ESR, headless, a fresh profile, the run's served
page. One run of bert-tiny (inference) and llama-tiny (generate) at 1 and 2 wasm threads, with Firefox's main
process SIGKILLed mid-job on every 2-thread job (the planted 'kill' fault): the 1-thread rows are `ok`, name the
browser from its own user agent and read their threads back, llama-tiny's tokens equal native ORT's; each killed
job is an `error` row saying Firefox exited, the run finishes, and no Firefox process is left."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.browser.execute import run_web
from harness.browser.run import WebRequest
from harness.run.plan import RequestError

pytestmark = pytest.mark.skipif(shutil.which("firefox-esr") is None, reason="needs Firefox ESR (`make setup`)")
QUICK = {"warmup": 1, "iterations": 3, "min_duration_s": 0.0, "max_iterations": 3, "new_tokens": 8}


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
        browsers=["firefox"], db_path=out / "f.duckdb", output_dir=out / "reports", **QUICK,
    )  # fmt: skip
    summary = run_web(request, faults={"firefox/wasm:threads=2": "kill"})
    return summary, request


def rows(db: Any) -> list[dict[str, Any]]:
    with duckdb.connect(str(db), read_only=True) as con:
        found = con.execute("SELECT model, mode, provider, device, status, error, details FROM results")
        names = [d[0] for d in found.description]
        return [dict(zip(names, row, strict=True)) for row in found.fetchall()]


def test_firefox_rows_name_the_browser_and_check_like_chromium(killed_run: tuple[Any, Any]) -> None:
    import json

    summary, _ = killed_run
    found = rows(summary.db_path)
    ok = [r for r in found if r["provider"] == "wasm:threads=1"]
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
    killed = [r for r in rows(summary.db_path) if r["provider"] == "wasm:threads=2"]
    assert len(killed) == 3 and all(r["status"] == "error" for r in killed), killed
    assert all("firefox" in r["error"] and "exited (exit code -9)" in r["error"] for r in killed), killed
    with duckdb.connect(str(summary.db_path), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("completed",)]
    assert firefoxes() == []


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
