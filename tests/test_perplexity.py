"""Issue 45: text quality beside speed. Perplexity on the harness's versioned passage (the text the speech rows
speak), its ratio to the fp32 reference's and the KL over it, and every generate row's first divergence from the
fp32 reference's tokens: the arithmetic, the ids, the page's answer checked, the report's columns. The real runs
are test_token_checks.py's (a planted weight moves the page's perplexity and divergence), test_web_generate.py's
(the genuine page equals native) and test_modes.py's (torch and native ORT)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_prompts import tokenizer_folder_with
from test_web import web_cache  # noqa: F401 (the session's export cache)
from test_web_server import GENERATE_JOB, TIMEOUT_S, generated

from harness.prepare.audio import PASSAGE_VERSION
from harness.prepare.perplexity import (
    PASSAGE_LABEL,
    Passage,
    kl_per_position,
    log_softmax,
    passage_facts,
    passage_ids,
    scores,
)
from harness.prepare.specs import load_specs
from harness.web.answers import PageResultError, validate_page_result
from harness.web.page_job import GenerateJob, PassageJob


def test_a_model_without_a_tokenizer_forces_the_passage_s_words_as_ids_every_engine_shares() -> None:
    spec = load_specs()["llama-tiny"]
    first, again = passage_ids(spec), passage_ids(spec)
    assert first == again and len(first.ids) == 133  # the passage's 118 words and 15 punctuation marks
    assert all(0 <= i < 1000 for i in first.ids) and len(set(first.ids)) < len(first.ids)  # a word repeats its id
    assert "SHA-256" in first.source and f"v{PASSAGE_VERSION}" in PASSAGE_LABEL


def test_a_folder_s_tokenizer_gives_the_ids_and_the_model_s_positions_bound_them(tmp_path: Path) -> None:
    folder = tokenizer_folder_with(tmp_path, None)  # word-level t0..t127: every word of the passage is t0 (unk)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 128, "max_position_embeddings": 64}))
    spec = SimpleNamespace(local_path=folder, is_onnx_file=False, config={}, context_length=None)
    found = passage_ids(spec)
    assert found.ids == (0,) * 64 and found.source.startswith("the model folder's tokenizer.json")
    assert "its first 64 of 133 ids" in found.source
    bare = SimpleNamespace(local_path=None, is_onnx_file=False, config={}, context_length=None)  # no vocabulary
    assert passage_ids(bare).ids == () and passage_ids(bare).source.startswith("not measured: the model states no")


def reference_of(tmp_path: Path, logits: np.ndarray, ids: tuple[int, ...]) -> Passage:
    path = tmp_path / "ref.f32"
    log_softmax(logits).astype(np.float32).tofile(path)
    return Passage(ids, "test ids", str(path), "fp32.onnx", logits.shape[-1])


def test_perplexity_ratio_kl_and_the_first_divergence_on_the_passage(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = (1, 2, 3, 0, 1)
    fp32 = rng.normal(size=(4, 5))
    passage = reference_of(tmp_path, fp32, ids)
    uniform = scores(np.zeros((4, 5)), passage)
    assert passage_facts(uniform[0], uniform[1], None, passage, "x")["perplexity"] == pytest.approx(5.0)
    same = scores(fp32, passage)
    facts = passage_facts(same[0], same[1], kl_per_position(same[2], passage), passage, "x")
    assert facts["perplexity_ratio"] == pytest.approx(1.0, abs=1e-6) and abs(facts["kl_passage"]) < 1e-9
    assert facts["passage_first_divergence"] is None and facts["passage_agreement_top1"] == 1.0
    assert facts["perplexity_passage_version"] == PASSAGE_VERSION and facts["perplexity_tokens"] == 4
    moved = fp32.copy()
    moved[2] = -moved[2]  # position 2's distribution turned over: its argmax leaves fp32's
    other = scores(moved, passage)
    facts = passage_facts(other[0], other[1], kl_per_position(other[2], passage), passage, "x")
    assert facts["passage_first_divergence"] == 2 and facts["kl_passage"] > 0.1
    assert facts["perplexity_ratio"] != pytest.approx(1.0, abs=1e-3)
    alone = passage_facts(same[0], same[1], None, replace(passage, reference=None), "x")
    assert "perplexity_ratio" not in alone and alone["perplexity_ratio_not_measured"] == "no fp32 reference at hand"


PASSAGE_JOB = replace(GENERATE_JOB, generate=GenerateJob(new_tokens=3, vocab_size=8, top_k=2,
                                                         passage=PassageJob([1, 2, 3], "ref.f32")))  # fmt: skip


def test_a_forced_pass_that_must_step_stops_once_its_pace_projects_past_the_case_s_budget() -> None:
    from harness.prepare.perplexity import PROBE_STEPS, PassageSkipped, StepBudget

    StepBudget(None).watch(10**6)(PROBE_STEPS)  # no --max-time: no limit
    after = StepBudget(1e-9).watch(132)
    after(PROBE_STEPS - 1)  # too few steps to judge a pace by
    with pytest.raises(PassageSkipped, match=r"its 132 forced steps, at its first ones' pace .* over the case's "):
        after(PROBE_STEPS)


def test_the_page_s_passage_scores_are_checked_against_its_job() -> None:
    good = {"nll": [2.0, None], "argmax": [1, 7], "kl": [0.0, 0.1], "method": "steps"}  # null: not finite
    assert validate_page_result(generated(passage=good), PASSAGE_JOB, TIMEOUT_S)["generation"]["passage"] == good
    failed = {"error": "Error: the fp32 reference is 9 wide, the logits 8"}
    assert validate_page_result(generated(passage=failed), PASSAGE_JOB, TIMEOUT_S)["status"] == "ok"
    budget = replace(PASSAGE_JOB, stop=replace(PASSAGE_JOB.stop, max_time_ms=1000.0))
    skipped = {"steps": 2, "step_ms": 800.0, "estimate_ms": 1600.0, "limit_ms": 1000.0}
    assert validate_page_result(generated(passage={"skipped": skipped}), budget, TIMEOUT_S)["status"] == "ok"
    from harness.browser.generate import page_passage

    said = page_passage({"passage": {"skipped": skipped}}, Passage((1, 2, 3), "ids"), "onnxruntime-web")
    why = "its 2 forced steps, at its first ones' pace (800 ms each), would take ~2 s, over the case's --max-time 1 s"
    assert said["perplexity"] is None and why in said["perplexity_not_measured"]
    refused = [
        (PASSAGE_JOB, {"passage": good | {"nll": [2.0]}}, "passage.nll needs 2 values"),
        (PASSAGE_JOB, {"passage": good | {"argmax": [1, 8]}}, "passage.argmax needs 2 values, each an id below"),
        (PASSAGE_JOB, {"passage": good | {"method": "guess"}}, "passage.method must be one of prefill, steps"),
        (PASSAGE_JOB, {}, "passage is missing: this job forced the passage"),
        (replace(GENERATE_JOB, generate=GenerateJob(new_tokens=3, top_k=2, passage=PassageJob([1, 2, 3]))),
         {"passage": good}, "passage.kl: this job served no fp32 reference"),
        (GENERATE_JOB, {"passage": good}, "this job forced no passage"),
        (budget, {"passage": {"skipped": skipped | {"estimate_ms": 900.0}}}, "an estimate within the budget is no"),
        (PASSAGE_JOB, {"passage": {"skipped": skipped}}, "must name this job's 2 steps and its budget (None)"),
    ]  # fmt: skip
    for job, changes, message in refused:
        with pytest.raises(PageResultError, match=re.escape(message)):
            validate_page_result(generated(**changes), job, TIMEOUT_S)


def test_the_generation_tables_show_perplexity_and_the_first_divergence_beside_the_decode_rate() -> None:
    from harness.report.formats import _mode_sections
    from harness.report.generation import quality_cells

    base = {"mode": "generate", "model": "m", "engine": "onnxruntime", "provider": "CPUExecutionProvider",
            "hardware": "cpu", "status": "ok", "batch_size": 1, "seq_len": 8, "new_tokens": 4, "precision": "fp32",
            "decode_tokens_per_s": 123.4, "agreement_top1": 1.0, "kl_mean": 0.0}  # fmt: skip
    fp32 = base | {"details": json.dumps({"perplexity": 1004.05, "perplexity_ratio": 1.0, "first_divergence": None})}
    q4 = base | {"precision": "q4", "details": {"perplexity": 1010.0, "first_divergence": 3}}
    other = base | {"details": {"perplexity": "1e9", "first_divergence": True}}  # a bundle's bad values: not shown
    assert quality_cells(fp32)["first_divergence"] == "none" and quality_cells(q4)["first_divergence"] == "3"
    assert quality_cells(other) == {"perplexity": None, "perplexity_ratio": None, "kl_passage": None,
                                    "first_divergence": None}  # fmt: skip
    table = "\n".join(_mode_sections([fp32, q4]))
    header = next(line for line in table.splitlines() if line.startswith("| Model"))
    assert "| tg tokens/s |" in header and "| first divergence vs fp32 | PPL (passage) | PPL ÷ fp32 |" in header
    assert "| none | 1004.05 | 1.0000 |" in table and "| 3 | 1010.00 | — |" in table


def test_a_given_fp32_reference_holds_a_graph_whose_folder_has_none(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """--reference-model's export is the reference where the graph's own folder holds no fp32 file: llama-tiny's q4
    graph alone in a folder, checked against the fp32 export given beside it (the slow end-to-end run with a real
    onnxruntime-genai folder is test_model_folders.py's)."""
    from harness.prepare.prepared import PrepareJob, prepare_model
    from harness.prepare.quality import GIVEN_REFERENCE, check_generation
    from harness.prepare.variants import precision_variant

    prepared = next(prepare_model(PrepareJob(load_specs()["llama-tiny"], [(1, 8)], with_past=True)))
    assert prepared.onnx_past_path is not None and prepared.fp32_reference == prepared.onnx_past_path
    assert prepared.passage is not None and prepared.passage.reference is not None  # made once, in preparation
    alone = tmp_path / "model.onnx"
    alone.write_bytes(precision_variant(prepared.onnx_past_path, "q4").path.read_bytes())
    prompt = {"input_ids": np.asarray([[5, 6, 7]]), "attention_mask": np.ones((1, 3), dtype=np.int64)}
    tokens = [[8, 9, 10]]
    _, facts, _ = check_generation(alone, alone, prompt, tokens, "q4", "native")
    assert facts["quality"] == "not measured: no fp32 reference at hand"
    _, facts, _ = check_generation(alone, alone, prompt, tokens, "q4", "native", fp32=prepared.onnx_past_path)
    assert facts["quality_reference"].endswith(f"(fp32, {GIVEN_REFERENCE})") and facts["first_divergence"] == 0


def test_a_reference_model_that_cannot_be_the_reference_is_refused_before_a_run(tmp_path: Path) -> None:
    from harness.run.plan import BenchmarkRequest, RequestError, validate

    folders = {}
    for name, config in (("model", {"model_type": "llama", "vocab_size": 1000}),
                         ("encoder", {"model_type": "bert", "vocab_size": 1000}),
                         ("other", {"model_type": "llama", "vocab_size": 999})):  # fmt: skip
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "config.json").write_text(json.dumps(config))
    asked = {"model_path": folders["model"], "modes": ["generate"], "engines": ["onnxruntime"], "hardware": ["cpu"]}
    for changes, why in (({"reference_model": folders["other"] / "config.json"}, "not a folder"),
                         ({"reference_model": folders["encoder"]}, "the fp32 export of a decoder-only model"),
                         ({"reference_model": folders["other"]}, "its token table has 999 rows, the model's 1,000"),
                         ({"reference_model": folders["other"], "models": ["llama-tiny"], "model_path": None},
                          "names the fp32 weights of a --model-path"),
                         ({"reference_model": folders["other"], "modes": ["inference"]}, "generate rows")):  # fmt: skip
        with pytest.raises(RequestError, match=re.escape(why)):
            validate(BenchmarkRequest(**(asked | changes)))
