"""Generation (TTFT/TPOT) on torch and ONNX Runtime, training steps, energy sensors and the schema
migration they needed."""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch
from conftest import QUICK, run_cli, run_cli_process
from test_native_run import rows

from harness.core.records import Target
from harness.native import get_backend
from harness.native.base import LoadRequest
from harness.native.onnxruntime_backend import OrtGenerator
from harness.prepare.greedy import past_input, positions, prefill_feeds
from harness.prepare.prepared import PreparedModel, PrepareJob, prepare_model
from harness.prepare.specs import load_specs
from harness.run.energy import EnergyMeter
from harness.run.plan import BenchmarkRequest, validate
from harness.store import SCHEMA, SCHEMA_VERSION, open_store

ORT_CPU = Target("cpu", "onnxruntime", "CPUExecutionProvider")


@pytest.fixture(scope="module")
def modes_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("modes")
    db = directory / "m.duckdb"
    done = run_cli(
        "native",
        "--model",
        "gpt2-tiny,bert-tiny",
        "--hardware",
        "cpu",
        "--batch-sizes",
        "2",
        "--sequence-lengths",
        "8",
        "--mode",
        "inference,generate,training",  # its plain exports serve the with_past fixture below
        "--new-tokens",
        "6",
        *QUICK,
        "--db",
        str(db),
        "--no-reports",
        "--output-dir",
        str(directory / "out"),
    )
    assert done.returncode == 0, done.stderr
    return db


def test_generation_rows_have_consistent_ttft_tpot_and_tokens_per_second(modes_db: Path) -> None:
    generated = rows(modes_db, "SELECT * FROM results WHERE mode = 'generate' ORDER BY engine")
    # bert cannot generate; OpenVINO has no decoder loop; ONNX Runtime runs the KV-cache loop
    assert [(r["model"], r["engine"]) for r in generated] == [("gpt2-tiny", "onnxruntime"), ("gpt2-tiny", "torch")]
    for r in generated:
        check_generation_row(modes_db, r, batch=2, tokens=6)


def test_torch_and_native_ort_force_the_passage_and_stand_against_the_fp32_graph(modes_db: Path) -> None:
    """Issue 45: each engine's own session forces the harness's passage untimed after its timed loop; torch's
    generation is held against the fp32 graph on its own distributions (native ORT's fp32 row is that graph)."""
    generated = {r["engine"]: json.loads(r["details"]) | r for r in rows(modes_db, "SELECT * FROM results WHERE "
                                                                         "mode = 'generate'")}  # fmt: skip
    for engine in ("onnxruntime", "torch"):
        details = generated[engine]
        assert details["perplexity"] > 0 and details["perplexity_ratio"] == pytest.approx(1.0, abs=1e-5)
        assert details["agreement_top1"] == 1.0 and details["first_divergence"] is None
        assert details["perplexity_method"].startswith(f"{engine}'s own session, one ")  # prefill, step, pass
    assert "by identity" in generated["onnxruntime"]["quality_reference"]
    assert (
        generated["torch"]["kl_mean"] < 1e-6
        and "beside the row's own engine" in generated["torch"]["quality_reference"]
    )


def check_generation_row(db: Path, r: dict, batch: int, tokens: int) -> None:
    assert r["status"] == "ok" and r["mode"] == "generate" and r["new_tokens"] == tokens
    assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0 and r["ttft_ms"] < r["latency_p50_ms"]
    assert r["tokens_per_s"] is None  # the rate over whole generations mixes prefill in: no longer written
    assert r["tpot_ms"] <= r["tpot_p90_ms"] and json.loads(r["generated_tokens"])
    samples = rows(db, f"SELECT * FROM samples WHERE result_id = '{r['result_id']}'")
    assert len(samples) == r["iterations"]
    for s in samples:  # first token, then tokens - 1 decode steps, all inside the whole generate() call
        assert len(s["steps_ms"]) == tokens - 1 and s["tpot_ms"] == pytest.approx(np.mean(s["steps_ms"]))
        assert s["ttft_ms"] + sum(s["steps_ms"]) <= s["latency_ms"] * 1.0001
    steps = [step for s in samples for step in s["steps_ms"]]
    assert r["decode_tokens_per_s"] == pytest.approx(batch * len(steps) * 1000 / sum(steps))
    assert r["prefill_tokens_per_s"] == pytest.approx(batch * r["seq_len"] * 1000 / r["ttft_ms"])


def test_onnx_generation_is_planned_for_models_with_a_cache_export_on_onnxruntime_only() -> None:
    plan = validate(BenchmarkRequest(models=["gpt2-tiny", "t5-tiny"], hardware=["cpu"], modes=["generate"]))
    specs = {spec.name: spec for spec in plan.specs}
    planned = {
        (name, target.engine) for name, spec in specs.items() for target, _ in plan.targets if plan.cases(spec, target)
    }
    # T5 (encoder-decoder) generates on ONNX Runtime from its encoder + decoders export (issue 35)
    assert planned == {("gpt2-tiny", "torch"), ("gpt2-tiny", "onnxruntime"), ("t5-tiny", "torch"),
                       ("t5-tiny", "onnxruntime")}  # fmt: skip
    assert not plan.cases(specs["gpt2-tiny"], Target("cpu", "openvino", "CPU"))  # no decoder loop there
    assert plan.exports_past(specs["gpt2-tiny"]) and plan.exports_past(specs["t5-tiny"])
    plan = validate(BenchmarkRequest(models=["bert-tiny"], hardware=["cpu"], modes=["generate"]))
    assert not plan.exports_past(plan.specs[0])  # no LM head: nothing generates


def test_onnxruntime_generate_rows_report_ttft_tpot_and_tokens_per_second(modes_db: Path) -> None:
    """The figures are test_generation_rows_have_consistent_ttft_tpot_and_tokens_per_second's (the same run's
    rows): here, that ORT's row ran the KV-cache export on the CPU EP."""
    [r] = rows(modes_db, "SELECT * FROM results WHERE mode = 'generate' AND engine = 'onnxruntime'")
    assert r["status"] == "ok" and r["model"] == "gpt2-tiny", r["error"]
    details = json.loads(r["details"])
    assert details["session_providers"] == ["CPUExecutionProvider"] and details["export"]["past"]["exporter"]


def _prepare_with_past(name: str) -> PreparedModel:
    return next(prepare_model(PrepareJob(load_specs()[name], [(2, 8)], with_past=True)))


@pytest.fixture(scope="module", params=["gpt2-tiny", "llama-tiny"])
def with_past(request: pytest.FixtureRequest) -> tuple[PreparedModel, OrtGenerator]:
    prepared = _prepare_with_past(request.param)
    assert prepared.onnx_past_path is not None, prepared.onnx_past_error
    feeds, _ = prepared.load_case((2, 8))
    load = LoadRequest(prepared.spec, prepared.onnx_path, "fp32", feeds, onnx_past_path=prepared.onnx_past_path)
    generator = get_backend("onnxruntime").load(load, ORT_CPU)
    assert isinstance(generator, OrtGenerator)
    return prepared, generator


def test_a_generation_stopped_at_eos_measures_decode_over_the_tokens_it_made(
    with_past: tuple[PreparedModel, OrtGenerator],
) -> None:
    """--stop-at-eos (issue 32 item 5): with EOS ids each row makes by its third token, native ORT's timed loop
    ends once both rows made one; the steps and the decode rate count the tokens made, not --new-tokens."""
    from harness.core.generation import generation_figures
    from harness.run.measure import MeasureConfig, measure_generation
    from harness.run.memory import PeakRss

    prepared, generator = with_past
    feeds, _ = prepared.load_case((2, 8))
    generator.generate(generator.prepare(feeds), 6, lambda: None)
    full = generator.generated.tolist()
    eos = (full[0][2], full[1][2])
    made = max(next(i + 1 for i, t in enumerate(row) if t in eos) for row in full)
    assert made <= 3
    config = MeasureConfig(warmup=0, iterations=2, min_duration_s=0, min_iterations=2)
    measured = measure_generation(generator, feeds, config, 6, PeakRss(), eos)
    assert measured.generated_tokens == [row[:made] for row in full]
    assert all(len(steps) == made - 1 for steps in measured.step_samples_ms)
    figures = generation_figures(2, 8, measured.ttft_samples_ms, measured.step_samples_ms)
    if made > 1:
        decode_ms = sum(sum(steps) for steps in measured.step_samples_ms)
        assert figures["decode_tokens_per_s"] == pytest.approx(2 * 2 * (made - 1) * 1000 / decode_ms)


def test_onnx_greedy_tokens_equal_torch_greedy_tokens(with_past: tuple[PreparedModel, OrtGenerator]) -> None:
    prepared, generator = with_past
    feeds, _ = prepared.load_case((2, 8))
    stamps: list[int] = []
    assert generator.generate(generator.prepare(feeds), 8, lambda: stamps.append(1)) == 8 and len(stamps) == 8
    torch_session = get_backend("torch").load(LoadRequest(prepared.spec, None, "fp32"), Target("cpu", "torch", "cpu"))
    with torch.inference_mode():
        output = torch_session.module.model.generate(
            **{name: torch.from_numpy(feeds[name]) for name in ("input_ids", "attention_mask")},
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
        )
    np.testing.assert_array_equal(generator.generated, output[:, 8:].numpy())


def test_onnx_decode_steps_reproduce_torch_logits(with_past: tuple[PreparedModel, OrtGenerator]) -> None:
    """Random weights make greedy decoding repeat a token whatever the past holds, so the cache is
    checked directly: prefill 3 prompt tokens, then feed the next ones one step at a time through
    the past; each step's logits must be torch's full-sequence logits at that position."""
    prepared, generator = with_past
    feeds, [reference] = prepared.load_case((2, 8))
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    step_feeds = prefill_feeds(generator.session, {"input_ids": ids[:, :3], "attention_mask": mask[:, :3]})
    logits = []
    output_names = [o.name for o in generator.session.get_outputs()]
    past_names = [past_input(name) for name in output_names[1:]]
    for t in range(3, 8):
        last, *presents = generator.session.run(output_names, step_feeds)
        logits.append(last[:, -1])  # position t - 1
        step_feeds = {"input_ids": ids[:, t : t + 1], "attention_mask": mask[:, : t + 1]}
        step_feeds["position_ids"] = positions(mask[:, : t + 1], 1)
        step_feeds |= dict(zip(past_names, presents, strict=True))
    np.testing.assert_allclose(np.stack(logits, axis=1), reference[:, 2:7], atol=1e-4)


def test_past_export_is_cached(with_past: tuple[PreparedModel, OrtGenerator]) -> None:
    prepared, _ = with_past
    assert prepared.onnx_past_path is not None and prepared.onnx_past_path.parent.name.endswith("-past")
    mtime = prepared.onnx_past_path.stat().st_mtime_ns
    again = _prepare_with_past(prepared.spec.name)
    assert again.onnx_past_path == prepared.onnx_past_path and again.export["past"]["cache_hit"] is True
    assert again.onnx_past_path.stat().st_mtime_ns == mtime


def test_training_rows_report_samples_per_second(modes_db: Path) -> None:
    trained = rows(modes_db, "SELECT * FROM results WHERE mode = 'training' ORDER BY model")
    assert [r["model"] for r in trained] == ["bert-tiny", "gpt2-tiny"]
    for r in trained:
        assert r["status"] == "ok" and r["engine"] == "torch"
        assert r["throughput_per_s"] == pytest.approx(2 * 1000 / r["latency_mean_ms"])
        assert r["max_abs_diff"] is None  # trained weights have no reference to match
        assert r["memory_peak_mb"] > 0


def test_energy_is_measured_or_says_why_not(modes_db: Path) -> None:
    meter = EnergyMeter()
    for r in rows(modes_db):
        source = json.loads(r["details"])["energy_source"]
        if meter.unavailable:
            assert r["energy_j_per_item"] is None and source.startswith("unsupported: ")
        else:
            assert r["energy_j_per_item"] > 0 and source.startswith("rapl:")


def test_a_failed_counter_read_stores_no_energy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A sensor read that fails at either end of the loop leaves no joules and says why; before, a
    failed NVML read counted as 0 mJ (issue 11, item 3). RAPL: a powercap tree whose counter file
    vanishes. NVML needs an NVIDIA GPU, so its counter reads are replayed (probe, start, end)."""
    import harness.run.energy

    def failed(sensor: str, when: str) -> tuple[None, str]:
        return None, f"not measured: the {sensor} energy counter failed to read at the {when} of the loop"

    domain = tmp_path / "intel-rapl:0"
    domain.mkdir()
    (domain / "energy_uj").write_text("1000000\n")
    monkeypatch.setattr(harness.run.energy, "POWERCAP", tmp_path)
    rapl = EnergyMeter()
    assert rapl.unavailable is None
    rapl.start()
    (domain / "energy_uj").write_text("3500000\n")
    assert astuple(rapl.stop()) == (2.5, "rapl:intel-rapl:0")
    rapl.start()
    (domain / "energy_uj").unlink()
    assert astuple(rapl.stop()) == failed("RAPL", "end")

    def nvml(*reads: int | None) -> tuple:
        replay = iter(reads)
        monkeypatch.setattr(EnergyMeter, "_nvml_mj", lambda self: next(replay))
        meter = EnergyMeter(nvidia_device=0)
        meter.start()
        return astuple(meter.stop())

    assert nvml(100, 5000, 9000) == (4.0, "nvml:0")
    assert nvml(100, None, 9000) == failed("NVML", "start")  # not 9 J: the energy since the driver loaded
    assert nvml(100, 5000, None) == failed("NVML", "end")  # not -5 J


def test_bad_mode_and_new_tokens_exit_2(tmp_path: Path) -> None:
    """The first refusal as a real process (exit 2, no traceback), the second through the same app in this one."""
    done = run_cli_process("native", "--mode", "finetune", "--db", str(tmp_path / "x.duckdb"))
    assert done.returncode == 2 and "unknown mode 'finetune'; valid: inference, generate, training" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_cli("native", "--mode", "generate", "--new-tokens", "0", "--db", str(tmp_path / "x.duckdb"))
    assert done.returncode == 2 and "--new-tokens takes a whole number from 1 to 4,096" in done.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_version_1_file_is_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "v1.duckdb"
    connection = duckdb.connect(str(db))
    connection.execute(SCHEMA)
    connection.execute("INSERT INTO schema_version VALUES (1, now())")
    connection.execute("INSERT INTO runs (run_id, started_at, status) VALUES ('old', now(), 'completed')")
    connection.close()
    with open_store(db) as store:
        assert store.query("SELECT max(version) AS v FROM schema_version")[0]["v"] == SCHEMA_VERSION
        assert store.query("SELECT run_id FROM runs")[0]["run_id"] == "old"
        columns = {r["column_name"] for r in store.query("DESCRIBE results")}
        assert {"mode", "ttft_ms", "tpot_ms", "tokens_per_s", "compile_ms", "energy_j_per_item"} <= columns
    with open_store(db) as store:  # idempotent: a second open applies nothing twice
        assert store.query("SELECT count(*) AS n FROM schema_version")[0]["n"] == SCHEMA_VERSION


def test_markdown_keeps_generation_and_training_in_their_own_tables() -> None:
    from harness.report.formats import _mode_sections

    base = dict(model="gpt2-tiny", hardware="cpu", engine="torch", provider="cpu", batch_size=1, seq_len=32)
    base |= dict(requested_precision="fp32", precision="fp32", new_tokens=8, status="ok", memory_peak_mb=500.0)
    generate = base | dict(mode="generate", ttft_ms=1.2345, prefill_tokens_per_s=25920.8, decode_tokens_per_s=2000.0)
    generate |= dict(tpot_ms=0.5, tpot_p90_ms=0.6, latency_p50_ms=5.0, tokens_matched=None)
    training = base | dict(mode="training", latency_p50_ms=3.0, throughput_per_s=10.0)
    lines = _mode_sections([generate, training, base | {"mode": "inference"}])
    generated = "| gpt2-tiny | cpu/torch | b1 s32 gen8 | 1.234 | 25920.8 | 2000.0 | 0.500 | 0.600 | 5.000 | — |"
    generated += " — | — | — | — | — | — | — | — | — | ok | — | — | — |"
    # agreement, KL, first divergence, PPL, its ratio, passage KL, the tokens' reference, GB/s and its fraction,
    # EOS, prompt, text: not stored (an older row)
    assert generated in lines
    assert "| gpt2-tiny | cpu/torch | b1 s32 training | 3.000 | 10.0 | 500 | ok |" in lines
    assert [line for line in lines if line.startswith("###")] == [
        "### Generation (time to first token, then prefill (pp) and decode (tg) rates, never mixed)",
        "### Training (forward + backward + optimizer step)",
    ]
