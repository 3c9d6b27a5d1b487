"""The HTML report of a real run (plus seeded web and OpenVINO rows), opened in real headless Chromium.

The page must be self-contained (the only request is the file itself), draw every plot as inline SVG,
and show the marks: a WebGPU software adapter, an OpenVINO bf16 row, a noisy result and a mismatch.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICK, run_cli, run_cli_process

from harness.core.records import Case, Result, Target
from harness.store import open_store
from harness.web.driver import resolve_browser

pytestmark = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
# what a headless run launches (harness.web.driver.HEADLESS_SHELLS): the headless shell where installed
HEADLESS = resolve_browser("chromium", headless=True).binary if Path("/usr/bin/chromium").exists() else None
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PLOT_KEYS = ("latency", "throughput", "scaling", "speedup", "memory", "heatmap", "distribution")
WEBGPU = Target("webgpu", "onnxruntime-web", "webgpu")


def seeded_results() -> list[Result]:
    bert, vit = ("bert-tiny", "embedding", "random"), ("vit-tiny", "vision", "random")
    return [
        Result(*bert, WEBGPU, Case(1, 32, "fp32"), "ok", samples_ms=[3.1, 3.0, 3.2, 3.05, 3.1], memory_peak_mb=410.0,
               max_abs_diff=2e-6, details={"fallback_adapter": True, "adapter": {"architecture": "swiftshader"}}),
        Result(*bert, Target("openvino", "openvino", "CPU"), Case(1, 32, "fp32"), "ok", precision="bf16",
               samples_ms=[0.7, 0.72, 0.71, 0.7, 0.69], memory_peak_mb=300.0, max_abs_diff=4e-3,
               details={"precision_changed": True, "inference_precision_hint": "bf16"}),
        Result(*vit, Target("wasm", "onnxruntime-web", "wasm:threads=1"), Case(1, None, "fp32"), "ok",
               samples_ms=[1.0, 1.0, 4.0, 1.1, 1.0, 6.0], memory_peak_mb=380.0, max_abs_diff=1e-6),  # noisy
        Result(*vit, WEBGPU, Case(2, None, "fp32"), "mismatch", error="max_abs_diff 0.3 exceeds tolerance 0.0011",
               samples_ms=[2.0, 2.1, 2.05, 2.0, 2.02], memory_peak_mb=420.0, max_abs_diff=0.3,
               details={"fallback_adapter": True}),
        Result(*vit, Target("webnn", "onnxruntime-web", "webnn:gpu"), Case(1, None, "fp32"), "error",
               error="[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Erf(13) node"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    directory = tmp_path_factory.mktemp("html-report")
    db, run_reports = directory / "r.duckdb", directory / "run-reports"
    done = run_cli(
        "native", "--model", "bert-tiny,vit-tiny", "--engines", "torch,onnxruntime", "--batch-sizes", "1,2",
        *QUICK, "--db", str(db), "--output-dir", str(run_reports),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with open_store(db) as store:
        run_id = store.resolve_run("latest")
        for result in seeded_results():
            store.add_result(run_id, result, None)
    return db, run_id, run_reports


# Where each table sits on the page: whether it scrolls inside its own box, whether it fits the page's main
# column, and whether its last header cell (the results table's flags) is inside what its box shows.
TABLE_FIT = """els => els.map(t => {
  const box = t.parentElement.classList.contains('table-scroll') ? t.parentElement : t;
  const main = document.querySelector('main').getBoundingClientRect();
  const last = t.querySelector('tr > th:last-child');
  return {cls: t.className, scrolls: box !== t && getComputedStyle(box).overflowX === 'auto',
          fits: box.getBoundingClientRect().right <= main.right + 0.5,
          last: last ? last.innerText : '',
          shown: !last || last.getBoundingClientRect().right <= box.getBoundingClientRect().right + 0.5};
})"""


def open_page(html: Path, screenshot: Path) -> dict[str, Any]:
    """Load the file in headless Chromium; return what the test checks, and save a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {"requests": [], "errors": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(HEADLESS), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.on("request", lambda request: seen["requests"].append(request.url))
            page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: seen["errors"].append(str(exc)))
            page.goto(html.as_uri(), wait_until="load")
            seen["figures"] = page.locator("figure.plot").evaluate_all(
                "els => els.map(e => ({id: e.id, svgs: e.querySelectorAll('svg').length,"
                " height: e.querySelector('svg') ? e.querySelector('svg').getBoundingClientRect().height : 0,"
                " hatches: e.querySelectorAll('svg pattern').length, red: e.innerHTML.includes('#b00020')}))"
            )
            for name, selector in {
                "fallback": ".mark-fallback_adapter",
                "bf16": ".mark-precision",
                "noisy": ".mark-noisy",
                "mismatch": ".mark-mismatch",
                "error": ".status-error",
                "ep_fallback_cell": "#matrix td.cls-ep_fallback",
                "unsupported_op_cell": "#matrix td.cls-unsupported_op",
                "mismatch_cell": "#matrix td.cls-mismatch",
            }.items():
                found = page.locator(selector)
                seen[name] = found.count() > 0 and found.first.is_visible()
                seen[f"{name}_text"] = " | ".join(found.all_inner_texts())
            seen["omitted"] = page.locator(".omitted").all_inner_texts()
            seen["tables"] = page.locator("table").evaluate_all(TABLE_FIT)
            seen["error_rows"] = page.locator("tr.error-row").all_inner_texts()
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return seen


def test_html_report_is_self_contained_plotted_and_marked(measured: tuple[Path, str, Path], tmp_path: Path) -> None:
    db, run_id, run_reports = measured
    assert (run_reports / f"{run_id}.html").exists()  # the run itself wrote one (before the seeded rows)
    html = tmp_path / "report.html"
    done = run_cli("report", "--db", str(db), "--run", run_id, "--format", "html", "--out", str(html))
    assert done.returncode == 0, done.stderr
    text = html.read_text()
    assert "<script" not in text and "<link" not in text and "@font-face" not in text and "src=" not in text
    # links and SVG references stay in the page (the heatmap's raster is an inline data: image)
    assert all(ref.startswith(("#", "data:image/png;base64,")) for ref in re.findall(r'href="([^"]*)"', text))
    assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", text))

    screenshot = tmp_path / "report.png"
    seen = open_page(html, screenshot)
    print(f"screenshot: {screenshot}")
    assert seen["requests"] == [html.as_uri()]
    assert seen["errors"] == []
    anchor = "run-" + run_id
    assert [f["id"] for f in seen["figures"]] == [f"{anchor}-{key}" for key in PLOT_KEYS]
    for figure in seen["figures"]:
        assert figure["svgs"] == 1 and figure["height"] > 150, figure
    assert seen["omitted"] == []  # every plot had data
    by_key = {f["id"].removeprefix(anchor + "-"): f for f in seen["figures"]}
    for key in ("latency", "throughput", "memory", "distribution"):  # hatched marks, the mismatch outlined in red
        assert by_key[key]["hatches"] > 0 and by_key[key]["red"], key
    assert by_key["speedup"]["hatches"] > 0  # the fallback-adapter and bf16 bars

    assert seen["fallback"] and "software (fallback) adapter" in seen["fallback_text"]
    assert seen["bf16"] and "ran bf16 (asked fp32)" in seen["bf16_text"]
    assert seen["noisy"] and "noisy (cv" in seen["noisy_text"]
    assert seen["mismatch"] and "mismatch (max |diff| 0.3)" in seen["mismatch_text"]
    assert seen["error"] and any("NOT_IMPLEMENTED" in row for row in seen["error_rows"])
    assert seen["ep_fallback_cell"] and seen["unsupported_op_cell"] and seen["mismatch_cell"]
    assert screenshot.stat().st_size > 100_000
    # every table fits the page (a wide one scrolls inside its own box); the results' flags column is shown
    assert all(table["fits"] for table in seen["tables"]), [t for t in seen["tables"] if not t["fits"]]
    results = [table for table in seen["tables"] if table["cls"] == "results"]
    assert results and all(table["scrolls"] for table in results)
    assert all(table["shown"] for table in results if table["last"] == "flags"), results


def test_markdown_links_the_plot_pngs(measured: tuple[Path, str, Path], tmp_path: Path) -> None:
    db, run_id, _ = measured
    done = run_cli("report", "--db", str(db), "--run", run_id, "--format", "md", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    markdown = (tmp_path / f"{run_id}.md").read_text()
    assert "## Plots" in markdown and "software (fallback) adapter" in markdown
    for key in PLOT_KEYS:
        png = tmp_path / f"{run_id}-plots" / f"{key}.png"
        assert f"]({run_id}-plots/{key}.png)" in markdown
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_all_reports_every_run_and_out_needs_one_format(measured: tuple[Path, str, Path], tmp_path: Path) -> None:
    db = tmp_path / "two-runs.duckdb"
    shutil.copy(measured[0], db)
    with open_store(db) as store:
        second = store.start_run("web", {}, {})
        store.add_result(second, seeded_results()[0], None)
        store.finish_run(second, "completed")
    out = tmp_path / "all"
    formats = ["--format", "html,json,csv", "--output-dir", str(out)]
    done = run_cli_process("report", "--db", str(db), "--run", "all", *formats)
    assert done.returncode == 0, done.stderr
    page = (out / "all-runs.html").read_text()
    assert page.count('<section class="run"') == 2 and f'id="run-{measured[1]}"' in page and second in page
    assert 'id="matrix"' in page
    document = json.loads((out / "all-runs.json").read_text())
    assert [d["run"]["run_id"] for d in document["runs"]] == [measured[1], second]
    with (out / "all-runs.csv").open() as handle:
        assert {row["run_id"] for row in csv.DictReader(handle)} == {measured[1], second}

    # the refusals: the app in this process (a Python start is ~0.8 s of CPU); the report above: the real CLI
    both = run_cli("report", "--db", str(db), "--format", "html,md", "--out", str(tmp_path / "x.html"))
    assert both.returncode == 2 and "exactly one --format" in both.stderr
    unknown = run_cli("report", "--db", str(db), "--format", "pdf")
    assert unknown.returncode == 2 and "html" in unknown.stderr


def html_report(db: Path, html: Path) -> str:
    """The HTML page `accelharness report` writes of the store's latest run."""
    done = run_cli("report", "--db", str(db), "--format", "html", "--out", str(html))
    assert done.returncode == 0, done.stderr
    return html.read_text()


def test_a_run_without_measurements_gets_notes_not_empty_plots(tmp_path: Path) -> None:
    db = tmp_path / "failed.duckdb"
    with open_store(db) as store:
        run_id = store.start_run("web", {}, {})
        store.add_result(run_id, seeded_results()[-1], None)  # an error: no timings, no samples
        store.finish_run(run_id, "completed")
    page = html_report(db, tmp_path / "failed.html")
    assert "<figure" not in page and "<svg" not in page
    assert page.count('class="omitted"') == len(PLOT_KEYS) and "not drawn — no result has timings" in page


def test_a_generate_only_run_gets_its_plots(tmp_path: Path) -> None:
    """A run with generate results only draws TTFT and the decode rate per model and case (issue 32, item 7),
    not the inference plots' notes that the run has no results."""
    db = tmp_path / "generate.duckdb"
    steps = [[2.5, 2.6, 2.4]] * 3
    with open_store(db) as store:
        run_id = store.start_run("native", {}, {})
        for target in (Target("cpu", "onnxruntime", "CPUExecutionProvider"), Target("wasm", "onnxruntime-web", "wasm")):
            row = Result("gpt2-tiny", "text_generation", "random", target, Case(1, 8, "fp32", "generate", 4), "ok",
                         samples_ms=[10.0, 11.0, 10.5], ttft_samples_ms=[2.0, 2.1, 2.05], step_samples_ms=steps,
                         tpot_samples_ms=[2.5] * 3, generated_tokens=[[1, 2, 3, 4]])  # fmt: skip
            store.add_result(run_id, row, None)
        store.finish_run(run_id, "completed")
    page = html_report(db, tmp_path / "generate.html")
    assert "the run has no results" not in page and 'class="omitted"' not in page
    figures = re.findall(r'<figure class="plot" id="run-[^"]*-(\w+)"', page)
    assert figures == ["ttft", "decode"]
