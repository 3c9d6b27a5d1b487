"""compare and history on real measured runs of an ONNX workload made slower on purpose.

The workload is a chain of MatMul+Tanh layers on a [batch, 192] activation, one shared 192x192
weight (it stays in cache, so time grows with the layer count). 192 rather than 256: MLAS splits
a [1,K]x[K,N] MatMul over ORT's thread pool once K*N reaches 64Ki, and on a loaded 2-core machine
a two-thread pool whose second thread is preempted turns into 10x latency spikes. Below that
size the workload is single-threaded and its latency scales with the machine's share of one core.

Method, against the noise of a shared 2-core machine:
- The two runs being compared are measured at the same time, on the same CPU (two CLI processes
  pinned to one core, each into its own DuckDB file, then copied verbatim into one store). Run one
  after the other, identical runs here differed by up to 25% (drift of the whole machine: other
  people's jobs, clocks); run at the same time on two cores, identical runs differed by 45%, the
  same process slower both times (the VM's two vCPUs are not equally fast under neighbours' load).
  On one core both sides see the same CPU, the same drift and the same interruptions.
- The regression verdict uses --quantile 0.25: preemption (here: by the other side) only ever adds
  time, and it hits so many iterations that the median lands between the clean and the preempted
  mode; the lower quartile is made of clean iterations on both sides.
- --threshold 10%: the spread of simultaneous identical runs here reached ~5%; a 20% slowdown is
  twice the band, so the test still separates "slower" from "same".
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CLI, ONE_CPU, run_cli, run_cli_process
from onnx import TensorProto, helper, numpy_helper

from harness.analysis.compare import compare_runs
from harness.analysis.tables import AnalysisError
from harness.store import open_store

# The tests of the runs measured side by side on one CPU are marked timing: `make test` runs them alone.
# The CLI is called in this process (run_cli): a Python start per call adds nothing to what they check
# (the one refusal through a real process: test_compare_bad_input_exits_2's first case).
WIDTH = 192
LAYERS = 250  # ~0.55 ms per inference on this machine: short against a ~4 ms scheduler slice
MEASURE = ["--engines", "onnxruntime", "--batch-sizes", "1", "--sequence-lengths", "8"]
MEASURE += ["--iterations", "200", "--min-duration", "4", "--warmup", "10"]
REPO = Path(__file__).resolve().parent.parent


def pin_to_one_cpu() -> None:
    """Popen preexec_fn: pin the CLI (and the workers it starts, which inherit it) to conftest's ONE_CPU."""
    os.sched_setaffinity(0, ONE_CPU)


def chain_onnx(path: Path, layers: int) -> Path:
    """`layers` x (MatMul with one shared weight, Tanh) on a [batch, WIDTH] input; the file is named chain.onnx."""
    weight = (np.random.default_rng(0).standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])
    nodes, previous = [], "x"
    for i in range(layers):
        out = "y" if i == layers - 1 else f"t{i}"
        nodes += [helper.make_node("MatMul", [previous, "w"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [out])]
        previous = out
    graph = helper.make_graph(nodes, "chain", [x], [y], [numpy_helper.from_array(weight, "w")])
    path.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path / "chain.onnx")
    return path / "chain.onnx"


def merge(sources: list[Path], into: Path) -> list[str]:
    """Copy every row of each source store into `into`; returns the copied run ids in source order."""
    run_ids = []
    with open_store(into) as store:
        for source in sources:
            store.connection.execute(f"ATTACH '{source}' AS source (READ_ONLY)")
            for table in ("runs", "hardware", "results", "samples"):
                store.connection.execute(f"INSERT INTO {table} SELECT * FROM source.{table}")
            run_ids += [r[0] for r in store.connection.execute("SELECT run_id FROM source.runs").fetchall()]
            store.connection.execute("DETACH source")
    return run_ids


STORE_ONLY = ["--no-reports", "--output-dir"]  # the tests read the store: no reports drawn


def measure_together(models: list[Path], directory: Path, into: Path, last_starts_later: bool = False) -> list[str]:
    """Benchmark each model in its own CLI process, all at once on ONE_CPU, then merge the stores into `into`.

    last_starts_later: the last process starts once the others have opened their stores (and so are starting their
    runs), so its run is the newest by started_at while all of them still measure at the same time."""
    directory.mkdir(parents=True, exist_ok=True)
    dbs = [directory / f"part{i}.duckdb" for i in range(len(models))]

    def start(model: Path, db: Path) -> subprocess.Popen:
        command = [*CLI, "native", "--model-path", str(model), *MEASURE, "--db", str(db), *STORE_ONLY]
        return subprocess.Popen(
            [*command, str(directory / "o")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=pin_to_one_cpu,
        )  # fmt: skip

    first = len(models) - 1 if last_starts_later else len(models)
    processes = [start(m, db) for m, db in zip(models[:first], dbs[:first], strict=True)]
    if last_starts_later:
        deadline = time.monotonic() + 120
        while not all(db.exists() for db in dbs[:first]) and time.monotonic() < deadline:
            if any(process.poll() is not None for process in processes):
                break  # one failed before opening its store: communicate() below reports why
            time.sleep(0.05)
        processes.append(start(models[-1], dbs[-1]))
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
    return merge(dbs, into)


@pytest.fixture(scope="module")
def slowdown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """Run A: LAYERS layers; run B: 1.2 x LAYERS, the same model name; measured side by side."""
    directory = tmp_path_factory.mktemp("slowdown")
    models = [chain_onnx(directory / "base", LAYERS), chain_onnx(directory / "slow", LAYERS * 6 // 5)]
    db = directory / "bench.duckdb"
    a, b = measure_together(models, directory, db)
    return db, a, b


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Runs 1 and 2: the same workload; run 3, started last: 1.5 x the layers; all three side by side on one CPU.
    (Run 3 measured after the others, on CI, once read only 1.05 x their p25: the machine had sped up by 40%.)"""
    directory = tmp_path_factory.mktemp("steady")
    base = chain_onnx(directory / "base", LAYERS)
    slower = chain_onnx(directory / "slower", LAYERS * 3 // 2)
    db = directory / "bench.duckdb"
    return db, measure_together([base, base, slower], directory, db, last_starts_later=True)


def compare_json(db: Path, a: str, b: str, *options: str) -> tuple[int, dict]:
    done = run_cli("compare", a, b, "--db", str(db), "--format", "json", "--threshold", "10%", *options)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.timing
def test_compare_flags_a_real_20_percent_slowdown(slowdown) -> None:
    db, a, b = slowdown
    code, report = compare_json(db, a, b, "--quantile", "0.25", "--fail-on-regression")
    (row,) = report["rows"]
    print(f"\n20% slowdown, p25: ratio {row['ratio']:.3f} CI [{row['ci_low']:.3f}, {row['ci_high']:.3f}] "
          f"p {row['p_value']:.2g} n {row['n_a']}/{row['n_b']} verdict {row['verdict']}")  # fmt: skip
    # What the method promises for a real 20% slowdown at a 10% threshold, and no more: `regressed`, which needs a
    # significant difference and (on a noisy side) the whole CI above the band. The ratio's own value is not
    # promised: the 1.2x layers measured p25 ratios of 1.192-1.204 in 13 timing passes (docs/reliability.md).
    assert row["verdict"] == "regressed", row
    assert code == 1
    assert 1.1 < row["ci_low"] <= row["ratio"] <= row["ci_high"]
    assert row["p_value"] < 0.05 and row["n_a"] >= 200 and row["n_b"] >= 200
    # Without --fail-on-regression the same verdict exits 0.
    assert compare_json(db, a, b, "--quantile", "0.25")[0] == 0


@pytest.mark.timing
def test_median_compare_never_calls_the_slowdown_unchanged_or_improved(slowdown) -> None:
    db, a, b = slowdown
    code, report = compare_json(db, a, b, "--fail-on-regression")
    (row,) = report["rows"]
    print(f"\n20% slowdown, median: ratio {row['ratio']:.3f} CI [{row['ci_low']:.3f}, {row['ci_high']:.3f}] "
          f"p {row['p_value']:.2g} verdict {row['verdict']}")  # fmt: skip
    assert report["statistic"] == "median"
    # Under heavy load the median can sit between modes and its CI widen: then "noisy" is the honest answer.
    assert row["verdict"] in ("regressed", "noisy")
    assert code == (1 if row["verdict"] == "regressed" else 0)


@pytest.mark.timing
def test_compare_does_not_flag_the_same_workload(steady) -> None:
    db, (a, b, _) = steady
    for quantile in ("0.5", "0.25"):
        code, report = compare_json(db, a, b, "--quantile", quantile, "--fail-on-regression")
        (row,) = report["rows"]
        print(f"\nsame workload, q={quantile}: ratio {row['ratio']:.3f} CI [{row['ci_low']:.3f}, {row['ci_high']:.3f}] "
              f"p {row['p_value']:.2g} verdict {row['verdict']}")  # fmt: skip
        assert row["verdict"] in ("unchanged", "noisy"), row
        assert code == 0


@pytest.mark.timing
def test_history_flags_the_step_and_only_the_step(steady) -> None:
    db, run_ids = steady
    done = run_cli("history", "--model", "chain", "--metric", "latency_p25_ms", "--db", str(db), "--format", "json")
    assert done.returncode == 0, done.stderr
    (series,) = json.loads(done.stdout)["series"]
    points = series["points"]
    print("\nhistory p25:", [(round(p["value"], 3), p["change"] and round(p["change"], 3), p["step"]) for p in points])
    assert [p["run_id"] for p in points][2] == run_ids[2]  # ordered by started_at: the 1.5x run is last
    assert [p["step"] for p in points] == [False, False, True]
    assert points[2]["change"] > 0.1 and points[2]["p_value"] < 0.05
    markdown = run_cli("history", "--model", "chain", "--db", str(db), "--engine", "onnxruntime", "--batch-size", "1")
    assert markdown.returncode == 0, markdown.stderr
    assert "# History of latency_p50_ms for chain" in markdown.stdout and markdown.stdout.count(run_ids[0]) == 1


@pytest.mark.timing
def test_history_bad_input(steady) -> None:
    from harness.analysis.history import history

    db, _ = steady
    done = run_cli("history", "--model", "chain", "--metric", "hostname", "--db", str(db))
    assert done.returncode == 2 and "unknown metric 'hostname'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    with pytest.raises(AnalysisError, match="no results for model 'nope'; models in the store: chain"):
        history(db, "nope")
    with pytest.raises(AnalysisError, match="--window takes a whole number from 1 to 1,000"):
        history(db, "chain", window=0)


@pytest.mark.timing
def test_compare_outputs_and_plots(slowdown, tmp_path: Path) -> None:
    db, a, b = slowdown
    markdown = run_cli("compare", a, b, "--db", str(db), "--quantile", "0.25", "--threshold", "0.1")
    assert markdown.returncode == 0, markdown.stderr
    assert f"## Comparison: {b} vs {a}" in markdown.stdout and "| chain | cpu/onnxruntime:CPUExecutionProvider" in (
        markdown.stdout
    )
    page, png, svg = tmp_path / "c.html", tmp_path / "c.png", tmp_path / "c.svg"
    done = run_cli(
        "compare", a, b, "--db", str(db), "--format", "html", "--out", str(page), "--plot-comparison", str(png)
    )
    assert done.returncode == 0, done.stderr
    assert page.read_text().startswith("<!doctype html>") and "<td>chain</td>" in page.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run_cli("compare", a, b, "--db", str(db), "--plot-comparison", str(svg)).returncode == 0
    assert "<svg" in svg.read_text()


@pytest.mark.timing
def test_selectors(slowdown, tmp_path: Path) -> None:
    db, _, _ = slowdown
    with open_store(db, read_only=True) as store:
        ordered = [r["run_id"] for r in store.query("SELECT run_id FROM runs ORDER BY started_at")]
        assert store.resolve_run("latest") == ordered[1] and store.resolve_run("previous") == ordered[0]
        sha = store.run_info(ordered[1])["git_sha"]
    # latest-on-<branch>: runs record the harness checkout's commit; resolve the current branch there.
    branch = subprocess.run(["git", "branch", "--show-current"], cwd=REPO, capture_output=True, text=True).stdout
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if branch.strip() and sha and sha.removesuffix("-dirty") == head:
        comparison = compare_runs(db, f"latest-on-{branch.strip()}", "latest", cwd=REPO)
        assert comparison.run_a == ordered[1]
    # A branch whose tip no run was made at, and a branch that does not exist: clear errors.
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
        cwd=repo,
        check=True,
    )
    with pytest.raises(AnalysisError, match=r"no run in .* was made at main's tip"):
        compare_runs(db, "latest-on-main", "latest", cwd=repo)
    with pytest.raises(AnalysisError, match="git cannot resolve branch 'no-such-branch'"):
        compare_runs(db, "latest-on-no-such-branch", "latest", cwd=repo)


@pytest.mark.timing
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope", "latest"], "no run 'nope'"),
        (["previous", "latest", "--threshold", "5"], "--threshold takes a percentage or a fraction"),
        (["previous", "latest", "--format", "csv"], "unknown format 'csv'; valid: md, json, html"),
        (["a", "b", "c"], "compare takes two runs A B"),
    ],
)
def test_compare_bad_input_exits_2(slowdown, args: list[str], message: str) -> None:
    db, _, _ = slowdown
    cli = run_cli_process if args == ["nope", "latest"] else run_cli
    done = cli("compare", *args, "--db", str(db))
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.timing
def test_compare_api_refuses_bad_values(slowdown) -> None:
    from harness.analysis.compare import check_plot_path, parse_threshold

    db, a, b = slowdown
    with pytest.raises(AnalysisError, match="quantile must be between 0 and 1"):
        compare_runs(db, a, b, quantile=1.5)
    with pytest.raises(AnalysisError, match=r"writes \.png or \.svg"):
        check_plot_path(Path("plot.pdf"))
    assert parse_threshold("5%") == pytest.approx(0.05) == parse_threshold("0.05")
    for bad in ("5", "0", "-3%", "abc", "100%"):
        with pytest.raises(AnalysisError):
            parse_threshold(bad)


@pytest.mark.parametrize(
    ("ratio", "low", "high", "p", "noisy", "expected"),
    [
        (1.20, 1.18, 1.22, 1e-9, False, "regressed"),
        (1.20, 1.18, 1.22, 1e-9, True, "regressed"),  # the whole CI clears the 10% band
        (1.12, 1.06, 1.18, 1e-9, True, "noisy"),  # noisy side and the CI reaches into the band
        (1.02, 0.97, 1.08, 0.3, True, "unchanged"),  # noisy side, but the CI contains 1 and is tight
        (1.10, 0.95, 1.30, 0.3, True, "noisy"),  # contains 1, but cannot rule out a 20% change
        (1.013, 1.001, 1.021, 3e-5, True, "unchanged"),  # noisy side, CI misses 1 but lies inside the band
        (1.05, 1.001, 1.12, 3e-5, True, "noisy"),  # misses 1 and reaches beyond the band
        (1.12, 1.06, 1.18, 1e-9, False, "regressed"),
        (1.12, 1.06, 1.18, 0.2, False, "unchanged"),  # not significant
        (1.03, 1.02, 1.04, 1e-9, False, "unchanged"),  # significant, within the band
        (0.80, 0.78, 0.82, 1e-9, False, "improved"),
        (1.00, 0.70, 1.30, 0.5, False, "noisy"),  # CI wider than 4 x threshold
    ],
)
def test_verdict_rule(ratio: float, low: float, high: float, p: float, noisy: bool, expected: str) -> None:
    from harness.analysis.compare import verdict

    assert verdict(ratio, low, high, p, noisy, threshold=0.10)[0] == expected


def test_compare_and_history_keep_modes_and_new_tokens_apart(tmp_path: Path) -> None:
    """Inference, training and generate rows of one model and target, generate at 8 and 16 tokens,
    stored in a different order in each run: every case compared with itself only (issue 11, item 2)."""
    from test_decide import seed_modes

    from harness.analysis.history import history

    db = tmp_path / "modes.duckdb"
    a, b = seed_modes(db)["runs"]
    result = compare_runs(db, a, b)
    assert len(result.rows) == 2 * 4 * 3 * 4 + 2  # inference + training per model/target/batch, and 2 generate cases
    generated = [r for r in result.rows if "gen" in r.case]
    assert [r.ratio for r in generated] == [pytest.approx(1.0)] * 2  # 8 tokens against 8, 16 against 16
    keys = [(r.model, r.target, r.batch_size, r.mode, r.new_tokens) for r in result.rows]
    assert len(set(keys)) == len(keys)
    generate = {r.new_tokens: r for r in result.rows if r.mode == "generate"}
    assert set(generate) == {8, 16} and generate[8].case == "b1 s32 gen8"
    assert {r.verdict for r in result.rows if r.status_a == "ok"} == {"unchanged"}  # the same samples both times
    series = history(db, "m1", "latency_p50_ms", {"engine": "torch", "batch_size": 1})
    assert sorted(s.case for s in series.series) == ["b1 s32", "b1 s32 gen16", "b1 s32 gen8", "b1 s32 training"]
    assert not any(s.steps for s in series.series)
