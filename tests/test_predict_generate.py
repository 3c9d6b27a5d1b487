"""Issue 46: generation predicted from the hardware's limits (harness.analysis.roofline_predict).

One real run (module-scoped): three tiny generative specs generating natively on ORT's CPU EP at 1 intra-op thread,
with its ceilings measured; every CLI test reads it (a target known only by its ceilings is that store with another
target's ceilings added). The laws, a step's counts and the inference method are checked on points, graphs and
stores written here, where the truth is known."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from harness.analysis.predict_model import best_per_target
from harness.analysis.roofline_fit import Point, fit, lomo_error
from harness.analysis.roofline_inference import inference_fits, roofline_rows
from harness.analysis.roofline_predict import GenerationAsk, evaluate_generation, predict_generation
from harness.core.graph_cost import graph_cost
from harness.core.records import Case, Ceiling, Result, Target
from harness.store import open_store

MODELS = ("llama-tiny", "gpt2-tiny", "qwen2-tiny")
ASKED = "qwen2-tiny"  # measured too: predicted from the other two, its measured figures beside
CASE = ("--sequence-lengths", "8", "--new-tokens", "4")  # run at depth 0; predicted at 0 and 16 (DEPTHS)
DEPTHS = ("--depths", "0,16")
ONE, TWO = "CPUExecutionProvider:threads=1", "CPUExecutionProvider:threads=2"
PAGE = Path(__file__).resolve().parents[1] / "web" / "page"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One target's real rows (ORT's CPU EP at 1 intra-op thread) and ceilings: what every CLI test reads."""
    out = tmp_path_factory.mktemp("predict-generate")
    with pytest.MonkeyPatch.context() as patch:  # conftest makes --no-ceilings the suite's default
        patch.delenv("ACCELHARNESS_NO_CEILINGS")
        done = run_cli(
            "native", "--model", ",".join(MODELS), "--mode", "generate", "--hardware", "cpu", "--engines",
            "onnxruntime", "--native-threads", "1", *CASE, "--iterations", "30", "--warmup", "2", "--min-duration",
            "0", "--max-time", "1", "--db", str(out / "g.duckdb"), "--no-reports", "--output-dir", str(out / "o"),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out / "g.duckdb"


def predicted(db: Path, *extra: str) -> dict[str, Any]:
    done = run_cli("predict", "--mode", "generate", "--model", ASKED, *CASE, *DEPTHS, "--db", str(db), "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def with_threads_two(store: Path, tmp_path: Path) -> Path:
    """A copy of the store with threads=2 known only by its ceilings (as `run --ceilings-only` stores them:
    threads=1's, at twice the bandwidth)."""
    copy = tmp_path / "ceilings-only.duckdb"
    shutil.copy(store, copy)
    with duckdb.connect(str(copy)) as connection:
        connection.execute(
            "INSERT INTO ceilings SELECT * REPLACE (replace(provider, 'threads=1', 'threads=2') AS provider, "
            "CASE WHEN kind = 'bandwidth' THEN value * 2 ELSE value END AS value) FROM ceilings"
        )  # fmt: skip
    return copy


def test_each_target_is_predicted_naming_its_method_what_it_learned_from_and_its_error(
    store: Path, tmp_path: Path
) -> None:
    """Threads=1 from its rows of the two other models; threads=2, given only ceilings (as `run --ceilings-only`
    stores them: threads=1's, at twice the bandwidth), from threads=1's law on its own ceilings, marked so."""
    with duckdb.connect(str(store), read_only=True) as connection:  # each row's step counted, for roofline+nodes
        counts = connection.execute(
            "SELECT CAST(details->>'$.step_nodes' AS DOUBLE), CAST(details->>'$.step_activation_bytes' AS DOUBLE) "
            "FROM results WHERE mode = 'generate'"
        ).fetchall()  # fmt: skip
    assert len(counts) == 3 and all(nodes > 10 and moved > 0 for nodes, moved in counts)
    rows = predicted(with_threads_two(store, tmp_path))["rows"]
    assert {(r["provider"], r["depth"]) for r in rows} == {(p, d) for p in (ONE, TWO) for d in (0, 16)}
    own = {r["depth"]: r for r in rows if r["provider"] == ONE}
    for row in own.values():  # two other models: roofline+nodes needs three, so the roofline
        assert row["method"] == "roofline" and row["error_kind"] == "leave-one-model-out"
        assert row["learned_from"]["models"] == ["gpt2-tiny", "llama-tiny"]  # never the asked model's own rows
        assert row["learned_from"]["rows"] == 2 and row["held_out_mape"] is not None  # 3 models measured there
        assert row["predicted_decode_tokens_per_s"] > 0 and row["predicted_ttft_ms"] > 0 and row["bandwidth_gbps"] > 0
        assert row["decode_law"]["overhead_ms"] >= 0 and row["step_nodes"] > 10
        if row["depth"] == 0:  # what ran: a tiny model's step is its overhead, so within a factor of 10 of it on a
            # loaded 2-core machine, never the 100x of bandwidth alone, nor a unit's 1000x
            assert 0.1 < row["predicted_decode_tokens_per_s"] / row["measured_decode_tokens_per_s"] < 10
        else:  # never measured at that depth: nothing shown as measured
            assert "measured_decode_tokens_per_s" not in row
    assert own[16]["bytes_per_token"] > own[0]["bytes_per_token"]  # the KV cache's bytes at depth
    for row in (r for r in rows if r["provider"] == TWO):
        assert row["method"] == "roofline from ceilings" and row["error_kind"] == "leave-one-target-out"
        assert [t.split(" on ")[0] for t in row["learned_from"]["targets"]] == [f"cpu/onnxruntime:{ONE}"]
        assert "measured_decode_tokens_per_s" not in row  # nothing of threads=2 was measured
        mine = own[row["depth"]]
        step_s, overhead_s = 1 / mine["predicted_decode_tokens_per_s"], mine["decode_law"]["overhead_ms"] / 1000
        # the overhead is no ceiling's: only the bytes' time halves at twice the bandwidth
        assert 1 / row["predicted_decode_tokens_per_s"] == pytest.approx(overhead_s + (step_s - overhead_s) / 2)


def test_evaluate_gives_each_method_its_held_out_error(store: Path) -> None:
    done = run_cli("predict", "--evaluate", "--mode", "generate", "--db", str(store), "--json")
    assert done.returncode == 0, done.stderr
    (errors,) = json.loads(done.stdout)
    assert errors["target"].endswith(ONE) and errors["models"] == 3 and errors["rows"] == 3
    assert errors["roofline"]["decode"] is not None and errors["bandwidth_only"] is not None
    assert set(errors["nodes"]) == {"decode", "median_step"} and errors["from_ceilings"]["decode"] is None
    assert errors["used"] == "roofline"  # roofline+nodes is held out only over four models or more
    table = run_cli("predict", "--evaluate", "--mode", "generate", "--db", str(store))
    assert table.returncode == 0 and "LOMO" in table.stdout and "LOTO" in table.stdout
    table = run_cli("predict", "--mode", "generate", "--model", ASKED, *CASE, "--db", str(store))  # depth 0
    assert table.returncode == 0 and "predictions, not measurements" in table.stdout
    assert "roofline" in table.stdout and "LOMO" in table.stdout


def test_recommend_ranks_predicted_generate_targets_marked_as_predicted(store: Path, tmp_path: Path) -> None:
    """recommend --mode generate: threads=1 ran the asked model (measured, never predicted), threads=2 holds only
    ceilings (predicted from threads=1's law on them, marked so with its method); a floor on agreement leaves out a
    prediction at a precision that measured none, and a target where the model failed is not predicted."""
    from harness.analysis.recommend import fastest_generation, with_predicted
    from harness.cli.predict_generate import measured_of, recommend_predictions

    copy = with_threads_two(store, tmp_path)
    choice = fastest_generation(copy, ASKED)
    measured = measured_of(copy, ASKED, choice)
    assert measured.case == (8, 4) and measured.precisions == ["fp32"]
    rows, _ = recommend_predictions(ASKED, 1, copy, measured)
    (row,) = rows
    assert (
        row["provider"] == TWO
        and row["source"] == "predicted"
        and row["backed_by"].startswith("predicted from its ceilings: roofline from ceilings, LOTO error")
    )
    with_predicted(choice, rows)
    assert sorted(r["source"] for r in choice.ranked) == ["measured", "predicted"]
    floored = fastest_generation(copy, ASKED, min_agreement=0.9)
    with_predicted(floored, [row | {"precision": "q4", "agreement": None}])
    assert [r["source"] for r in floored.ranked] == ["measured"] and "no measured agreement" in floored.excluded[0]
    done = run_cli("recommend", "--mode", "generate", "--model", ASKED, "--db", str(copy))
    assert done.returncode == 0 and "predicted from its ceilings" in done.stdout, done.stdout + done.stderr
    with duckdb.connect(str(copy)) as connection:  # the model failed on threads=2: nothing says it runs there
        connection.execute(
            "INSERT INTO results SELECT * REPLACE (replace(provider, 'threads=1', 'threads=2') AS provider, 'error' AS "
            "status, result_id || 'x' AS result_id, result_key || 'x' AS result_key) FROM results WHERE model = ?",
            [ASKED],
        )  # fmt: skip
    assert recommend_predictions(ASKED, 1, copy, measured_of(copy, ASKED, fastest_generation(copy, ASKED)))[0] == []


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (["--mode", "training"], "--mode"),
        (["--mode", "generate", "--depths", "99999999"], "--depths"),
        (["--mode", "generate", "--depths", "4000"], "positions"),  # past llama-tiny's 2048
        (["--mode", "generate", "--method", "operators"], "--method operators"),
        (["--mode", "generate", "--machine", "nowhere"], "machine"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(store: Path, bad: list[str], named: str) -> None:
    before = store.stat().st_mtime_ns
    done = run_cli("predict", "--model", "llama-tiny", *bad, "--db", str(store))
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert store.stat().st_mtime_ns == before


# --- the page's warm-up: on until the generation time stops falling (web/page/generate.mjs warmedUp) -----------------
WARM_UP_CASES = {  # warm-up generations' ms, --warmup, the bound -> whether the page is warm
    "still falling (llama-small, 1 thread: its wasm still compiling)": ([112, 116, 90, 73, 60], 0, 50, False),
    "settled: three generations within 5% of the fastest before them": (
        [112, 116, 90, 73, 55, 53, 54, 56],
        0,
        50,
        True,
    ),
    "one slow generation does not end it": ([112, 116, 90, 73], 0, 50, False),
    "never fewer than --warmup": ([10, 10, 10, 10, 10], 6, 50, False),
    "flat from the start, at least four": ([10, 10, 10, 10], 0, 50, True),
    "bounded: still falling at the bound": ([100 - i for i in range(50)], 0, 50, True),
}


@pytest.mark.skipif(shutil.which("node") is None, reason="the page's module runs in node")
def test_the_page_warms_up_until_the_generation_time_stops_falling() -> None:
    script = (
        "import('./generate.mjs').then(({ warmedUp }) => console.log(JSON.stringify("
        f"{json.dumps(list(WARM_UP_CASES.values()))}.map(([t, w, most]) => warmedUp(t, w, most)))));"
    )
    done = subprocess.run(["node", "-e", script], cwd=PAGE, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert dict(zip(WARM_UP_CASES, json.loads(done.stdout), strict=True)) == {
        k: v[-1] for k, v in WARM_UP_CASES.items()
    }


@pytest.mark.parametrize(
    ("warm", "named"), [(list(range(1, 52)), "at most 50"), ("12", "at most 50"), ([5.0, -1.0], "warmup_samples_ms[1]")]
)
def test_a_pages_warm_up_times_are_bounded_before_they_are_stored(warm: Any, named: str) -> None:
    """The page's warm-up times (details.warmup_samples_ms) are input from elsewhere: more than the job's bound, not
    a list, or a duration its clock cannot have measured is refused; absent, nothing is said of them."""
    from harness.web.answers import Clock, PageResultError, _check_warmup

    with pytest.raises(PageResultError, match=named.replace("[", r"\[")):
        _check_warmup({"warmup_samples_ms": warm}, 50, Clock(0.005, 60_000))
    kept = {"warmup_samples_ms": [3.0, 2.5]}
    _check_warmup(kept, 50, Clock(0.005, 60_000))
    assert kept["warmup_samples_ms"] == [3.0, 2.5]


def test_a_pages_warm_up_count_and_time_are_bounded_by_each_other() -> None:
    """With the warm-up floor the page sends its last warm-up times, their count and the warm-up's time: a count
    below the samples given, or more generations than the time allows, is refused."""
    from harness.web.answers import Clock, PageResultError, _check_warmup

    clock = Clock(0.005, 60_000)
    for count, spent in ((2, 100.0), (1 + 2 + 100 * 100 + 1, 100.0), (True, 100.0), (40, 4.0)):
        with pytest.raises(PageResultError, match="warmup_generations"):
            _check_warmup({"warmup_samples_ms": [3.0, 2.5], "warmup_generations": count, "warmup_ms": spent}, 50, clock)
    kept = {"warmup_samples_ms": [3.0, 2.5], "warmup_generations": 900, "warmup_ms": 4000.0}
    _check_warmup(kept, 50, clock)
    assert kept["warmup_generations"] == 900 and kept["warmup_ms"] == 4000.0


def test_the_page_warm_up_floor_is_bounded_by_the_budget_and_off_at_warmup_zero() -> None:
    from harness.core.generation import PAGE_MIN_WARMUP_S, PAGE_WARMUP_BUDGET_SHARE, page_min_warmup_ms

    assert page_min_warmup_ms(5, None) == PAGE_MIN_WARMUP_S * 1000
    assert page_min_warmup_ms(5, 100.0) == PAGE_MIN_WARMUP_S * 1000
    assert page_min_warmup_ms(5, 2.0) == pytest.approx(PAGE_WARMUP_BUDGET_SHARE * 2000)
    assert page_min_warmup_ms(0, 100.0) == 0.0


# --- the law, on points whose truth is known ---------------------------------------------------------------------
def law_points(overhead_s: float, efficiency: float) -> list[Point]:
    """A target of 12.5 GB/s: models from 0.2 MB to 40 MB, each step its overhead plus its bytes at `efficiency`."""
    sizes = {"a": 0.2e6, "b": 2e6, "c": 8e6, "d": 22e6, "e": 40e6}
    return [Point(m, (b / 12.5e9,), overhead_s + b / (efficiency * 12.5e9)) for m, b in sizes.items()]


def test_the_law_recovers_overhead_and_efficiency_where_a_pure_roofline_cannot() -> None:
    points = law_points(300e-6, 0.6)
    law = fit(points)
    assert law.overhead_s == pytest.approx(300e-6, rel=1e-6) and law.efficiencies[0] == pytest.approx(0.6, rel=1e-6)
    assert lomo_error(points) == pytest.approx(0.0, abs=1e-6)
    assert lomo_error(points, overhead=False) > 0.5  # eff x BW / bytes: the tiny models' steps are not bytes
    assert lomo_error(points[:2]) is None  # two models: no held-out error


def test_inference_takes_the_roofline_where_its_held_out_error_is_lowest(tmp_path: Path) -> None:
    """Inference rows of known FLOPs and bytes on a target with measured ceilings: the roofline's law is learned
    (held-out error near 0), predicts a new model, and wins the target over a method of higher error."""
    db, target = tmp_path / "i.duckdb", Target("cpu", "onnxruntime", "CPUExecutionProvider")
    with open_store(db) as store:
        run_id = store.start_run("seed", {}, {})
        store.add_ceiling(run_id, Ceiling(target, "bandwidth", "bytes", "bw", 10e9, samples_ms=[1000.0] * 3))
        store.add_ceiling(run_id, Ceiling(target, "compute", "fp32", "mm", 100e9, samples_ms=[1000.0] * 3))
        for model, flops in (("m1", 1e7), ("m2", 1e8), ("m3", 1e9), ("m4", 3e9)):
            latency_ms = 1000 * (1e-4 + flops / (0.5 * 100e9) + flops / 10 / (0.8 * 10e9))
            result = Result(model, "embedding", "random", target, Case(1, 8, "fp32"), "ok",
                            samples_ms=[latency_ms] * 5, flops_per_item=flops, bytes_per_item=flops / 10)  # fmt: skip
            store.add_result(run_id, result, None)
    fits = inference_fits(db, "fp32", "m9")
    (found,) = fits.values()
    assert found.error == pytest.approx(0.0, abs=1e-6) and found.models == ["m1", "m2", "m3", "m4"]

    class Asked:
        model, family, parameters = "m9", "embedding", None

    (row,) = roofline_rows(fits, Asked, {(1, 8): {"flops_per_item": 2e9, "bytes_per_item": 2e8}})
    assert row["predicted_latency_p50_ms"] == pytest.approx(1000 * (1e-4 + 2e9 / 50e9 + 2e8 / 8e9), rel=1e-6)
    other = row | {"method": "log-linear", "held_out_mape": 0.3}
    assert [r["method"] for r in best_per_target([other, row])] == ["roofline"]
    assert [r["method"] for r in best_per_target([other, row | {"held_out_mape": None}])] == ["log-linear"]


# --- roofline+nodes, on a store whose truth is known ---------------------------------------------------------------
PER_NODE_S, BANDWIDTH_GBPS = 2e-6, 10.0
EFFICIENCY = {"weight_bytes": 0.9, "kv_bytes_per_step": 0.1, "step_activation_bytes": 2.0}  # a page copies its KV
SIZES = {"m1": (200, 0.2e6), "m2": (150, 2e6), "m3": (360, 8e6), "m4": (640, 40e6), "m5": (250, 20e6), "m6": (300, 5e6)}


def step_work(model: str, depth: int) -> dict[str, float]:
    """A decode step's counted work: nodes, weights, and KV and activation bytes growing with the depth."""
    nodes, weights = SIZES[model]
    kv = weights / 50 * (1 + depth / 64)
    moved = weights / 20 + 400 * nodes * depth  # a graph's attention over its cache: not the KV bytes' multiple
    return {"step_nodes": nodes, "weight_bytes": weights, "kv_bytes_per_step": kv, "step_activation_bytes": moved}


def true_step_s(work: dict[str, float], bandwidth_gbps: float = BANDWIDTH_GBPS) -> float:
    moved = sum(work[name] / efficiency for name, efficiency in EFFICIENCY.items())
    return PER_NODE_S * work["step_nodes"] + moved / (bandwidth_gbps * 1e9)


def known_store(db: Path, planted: dict[str, Any] | None = None) -> None:
    """wasm at 1 thread: m1..m4 and m6 at depths 0 and 64, each step exactly true_step_s (m1's details `planted`);
    wasm at 2 threads: only its ceilings, twice the bandwidth."""
    one, two = (Target("wasm", "onnxruntime-web", f"wasm:threads={n}") for n in (1, 2))
    with open_store(db) as store:
        run_id = store.start_run("seed", {}, {})
        for target, scale in ((one, 1), (two, 2)):
            ceiling = BANDWIDTH_GBPS * scale * 1e9
            store.add_ceiling(run_id, Ceiling(target, "bandwidth", "bytes", "bw", ceiling, samples_ms=[1000.0] * 3))
            store.add_ceiling(run_id, Ceiling(target, "compute", "fp32", "mm", 1e11, samples_ms=[1000.0] * 3))
        for model in ("m1", "m2", "m3", "m4", "m6"):
            for depth in (0, 64):
                work = step_work(model, depth)
                step_ms = 1000 * true_step_s(work)
                facts = work | {"weight_bytes": {"fp32": work["weight_bytes"]}}
                facts |= (planted or {}) if model == "m1" else {}
                result = Result(model, "llama", "random", one, Case(1, 8, "fp32", "generate", 4, depth), "ok",
                                samples_ms=[4 * step_ms] * 3, ttft_samples_ms=[step_ms] * 3,
                                step_samples_ms=[[step_ms] * 3] * 3,
                                bytes_per_token=work["weight_bytes"] + work["kv_bytes_per_step"],
                                prefill_flops_per_token=1e6, details=facts)  # fmt: skip
                store.add_result(run_id, result, None)


def ask_m5() -> GenerationAsk:
    work = {(1, 8, d): step_work("m5", d) | {"bytes_per_token": 1.0, "prefill_flops_per_token": 1e6} for d in (0, 64)}
    return GenerationAsk("m5", "fp32", "fp32", work, 4)


def test_roofline_nodes_is_learned_where_the_steps_are_nodes_and_moved_bytes(tmp_path: Path) -> None:
    """Steps made of a cost per node and three kinds of bytes at their own efficiencies: roofline+nodes recovers
    them (held-out error 0), wins the target over the roofline, and carries to a target known by its ceilings
    with its byte terms at that target's bandwidth and its nodes at the same cost."""
    known_store(tmp_path / "k.duckdb")
    rows = {(r["provider"], r["depth"]): r for r in predict_generation(tmp_path / "k.duckdb", ask_m5()).rows}
    for depth in (0, 64):
        own, far = rows[("wasm:threads=1", depth)], rows[("wasm:threads=2", depth)]
        assert own["method"] == "roofline+nodes" and own["held_out_mape"] == pytest.approx(0.0, abs=1e-6)
        assert 1 / own["predicted_decode_tokens_per_s"] == pytest.approx(true_step_s(step_work("m5", depth)))
        assert own["decode_law"]["per_node_us"] == pytest.approx(PER_NODE_S * 1e6)
        assert own["decode_law"]["efficiency_kv_cache"] == pytest.approx(EFFICIENCY["kv_bytes_per_step"])
        assert far["method"] == "roofline+nodes from ceilings" and far["error_kind"] == "leave-one-target-out"
        expected = true_step_s(step_work("m5", depth), 2 * BANDWIDTH_GBPS)
        assert 1 / far["predicted_decode_tokens_per_s"] == pytest.approx(expected)
    (errors,) = evaluate_generation(tmp_path / "k.duckdb")
    assert errors.used == "roofline+nodes" and errors.nodes["decode"] == pytest.approx(0.0, abs=1e-6)
    assert errors.roofline["decode"] > 0.05  # one overhead and one efficiency cannot be these steps


@pytest.mark.parametrize("planted", [{"step_nodes": 1e30}, {"step_activation_bytes": "NaN"}, {"weight_bytes": 5}])
def test_a_rows_counts_out_of_bounds_are_none_not_learned(tmp_path: Path, planted: dict[str, Any]) -> None:
    """A row's details may come from another machine's bundle: a count past its bound, not a number, or weights
    not an object of numbers leaves that row out of roofline+nodes (still in the roofline)."""
    known_store(tmp_path / "k.duckdb", planted)
    rows = predict_generation(tmp_path / "k.duckdb", ask_m5()).rows
    own = next(r for r in rows if r["provider"] == "wasm:threads=1")
    assert own["method"] == "roofline+nodes" and own["learned_from"]["rows"] == 8  # m1's two rows left out
    assert own["held_out_mape"] == pytest.approx(0.0, abs=1e-6)


def test_a_step_counts_dispatched_nodes_and_the_bytes_they_move_besides_the_weights(tmp_path: Path) -> None:
    """x @ transpose(W) -> reshape -> + x: the transpose of a weight is folded at load (not dispatched, moves
    nothing at run time), a reshape is a view (dispatched, moves nothing), the weight's read is not an activation."""
    weight = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "w")
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"]),
             helper.make_node("Reshape", ["y", "shape"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["out"])]  # fmt: skip
    shape = numpy_helper.from_array(np.array([2, 4], dtype=np.int64), "shape")
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in ("x", "out")]
    graph = helper.make_graph(nodes, "g", io[:1], io[1:], [weight, shape])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    cost = graph_cost(path, {"x": [2, 4]})
    assert cost.dispatched == 3  # MatMul, Reshape, Add
    assert cost.activation_bytes == (32 + 32) + 0 + (32 + 32 + 32)  # MatMul: x in, y out; Add: r, x in, out out
