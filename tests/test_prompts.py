"""Issue 32 items 4 and 5: inputs that respect the graph, one prompt per model whatever its layout, text in
and out through the model folder's tokenizer, and the EOS policy a row states."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import run_cli, run_cli_process
from test_web import web_cache  # noqa: F401 (the session's export cache: bert-tiny is exported once)

from harness.prepare.prepared import PrepareJob, prepare_model
from harness.prepare.specs import load_specs
from harness.store import open_store

FAST = ("--iterations", "2", "--warmup", "0", "--min-duration", "0", "--batch-sizes", "1")


def latest_rows(db: Path) -> list[dict]:
    with open_store(db, read_only=True) as store:
        return store.results(store.resolve_run("latest"))


def test_the_harness_own_bert_export_given_back_as_a_file_runs_ok(web_cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """token_type_ids index a table of 2 rows: zeros, as a tokenizer gives one text; input_ids stay below the
    word table's rows (read from the graph's Gather). Before: ids up to 99, "idx=32 must be within [-2,1]"."""
    from harness.prepare.graph_tables import index_tables

    prepared = next(prepare_model(PrepareJob(load_specs()["bert-tiny"], [(1, 8)])))
    assert prepared.onnx_path is not None
    for each in prepared.onnx_path.parent.iterdir():
        shutil.copy(each, tmp_path / each.name)
    model = tmp_path / prepared.onnx_path.name
    assert index_tables(model) == {"input_ids": 30522, "token_type_ids": 2}
    db = tmp_path / "b.duckdb"
    done = run_cli("native", "--model-path", str(model), "--engines", "onnxruntime", "--hardware", "cpu", *FAST,
                   "--sequence-lengths", "40", "--db", str(db), "--output-dir", str(tmp_path / "o"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = latest_rows(db)
    assert row["status"] == "ok", row["error"]


def tokenizer_folder_with(tmp_path: Path, template: str | None) -> Path:
    """A folder with only a word-level tokenizer (t0..t127; t0 unk, t2 eos) and, given, a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", eos_token="t2").save_pretrained(tmp_path)
    if template is not None:
        config = json.loads((tmp_path / "tokenizer_config.json").read_text())
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    return tmp_path


def test_a_prompt_is_tokenized_with_the_folder_s_tokenizer_and_its_chat_template_in_a_sandbox(tmp_path: Path) -> None:
    from harness.prepare.prompts import PromptError, decode, encode, eos_ids, vocabulary

    template = "{% for m in messages %}t3 {{ m.content }}{% endfor %}{% if add_generation_prompt %} t4{% endif %}"
    folder = tokenizer_folder_with(tmp_path, template)
    assert encode(folder, "t5 t6 t7", chat=False) == [5, 6, 7]
    assert encode(folder, "t5 t6 t7", chat=True) == [3, 5, 6, 7, 4]  # the template's turn markers around it
    assert decode(folder, [[5, 6, 2], [7]]) == ["t5 t6 t2", "t7"] and eos_ids(folder) == (2,)
    assert vocabulary(folder, 128).special == (0, 2)  # unk and eos: never drawn into a prompt
    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}"  # the template is data from elsewhere
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": escape}))
    with pytest.raises(PromptError, match="chat template failed to render"):
        encode(folder, "t5", chat=True)
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}t1 {% endfor %}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": endless}))
    with pytest.raises(PromptError, match="it wrote over 1,000,000 characters around a prompt of 2"):
        encode(folder, "t5", chat=True)


def test_a_prompt_that_cannot_be_made_is_refused_before_a_run(tmp_path: Path) -> None:
    """--prompt without a tokenizer, ids outside the vocabulary, --chat alone, a prompt for a model without token
    inputs, a folder's tokenizer linked out of it, its EOS config unreadable: refused with the reason when the
    request is checked; through the CLI (two of them), exit 2 and no store."""
    from harness.core.options import RequestError
    from harness.run.plan import BenchmarkRequest, validate

    hostile = tmp_path / "hostile"  # a folder from elsewhere: its tokenizer a link out of it, its configs broken
    hostile.mkdir()
    (hostile / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 128}))
    (hostile / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    (hostile / "generation_config.json").write_text('{"eos_token_id": ')
    tiny, path = {"models": ["llama-tiny"]}, {"model_path": hostile}
    refused = [
        (tiny | {"prompt": "hello"}, "--prompt needs the model folder's tokenizer.json"),
        (tiny | {"prompt_ids": ["5", "1000"]}, "1000 is outside llama-tiny's vocabulary (ids 0 to 999)"),
        (tiny | {"prompt_ids": ["5", "x"]}, "--prompt-ids takes comma-separated token ids"),
        (tiny | {"chat": True}, "--chat applies the folder's chat template to --prompt's text"),
        ({"models": ["vit-tiny"], "prompt_ids": [5]}, "vit-tiny takes no token ids (vision inputs)"),
        (path | {"prompt": "t1"}, "resolves to " + str(tmp_path / "elsewhere.json")),
        (path | {"stop_at_eos": True}, "generation_config.json in " + str(hostile) + " is not JSON"),
    ]
    for given, message in refused:
        with pytest.raises(RequestError, match=re.escape(message)):
            validate(BenchmarkRequest(hardware=["cpu"], modes=["generate"], db_path=tmp_path / "r.duckdb", **given))
    db = tmp_path / "r.duckdb"
    for given in (("--model", "llama-tiny", "--prompt", "hello"), ("--model-path", str(hostile), "--prompt", "t1")):
        done = run_cli_process("native", "--mode", "generate", *given, "--db", str(db))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-500:]
    assert not db.exists()


def test_the_generation_tables_state_the_policy_and_escape_the_model_s_text() -> None:
    """Output text is model output: escaped in the HTML table and the Markdown one, cut to its shown length."""
    from harness.report.formats import _mode_sections
    from harness.report.generation import SHOWN_CHARS, _table

    row = dict(model="m", hardware="cpu", engine="onnxruntime", provider="CPUExecutionProvider", batch_size=1,
               seq_len=3, requested_precision="fp32", precision="fp32", new_tokens=4, status="ok", mode="generate",
               prompt_ids="[[5, 6, 7]]", stop_at_eos=False, tokens_matched=None, ttft_ms=1.0, prefill_tokens_per_s=3.0,
               decode_tokens_per_s=3.0, tpot_ms=1.0, tpot_p90_ms=1.0, latency_p50_ms=4.0, agreement_top1=None,
               kl_mean=None, token_reference=None)  # fmt: skip
    hostile = "<script>alert(1)</script> | =cmd" + "x" * SHOWN_CHARS
    html = _table([row | {"output_text": hostile}])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "EOS ignored" in html and "3 ids: 5, 6, 7" in html and "x…</td>" in html
    (line,) = [line for line in _mode_sections([row | {"output_text": hostile}]) if line.startswith("| m |")]
    assert "&lt;script&gt;" in line and r"\| =cmd" in line and "<script>" not in line
    stopped = _table([row | {"stop_at_eos": True, "output_text": None}])
    assert "stopped at EOS" in stopped
    # every batch row's text, numbered (issue 32); a stored list that is not one of strings: output_text alone
    batch = row | {"batch_size": 2, "output_text": "t5", "output_texts": json.dumps(["t5", "<b>t6"])}
    assert "[1] t5 [2] &lt;b&gt;t6</td>" in _table([batch])
    for odd in ("not json", "[1, 2]", '{"a": 1}', "[]"):
        assert '<td class="gen-text">t5</td>' in _table([batch | {"output_texts": odd}]), odd


def test_the_table_an_id_input_indexes_is_read_through_casts_and_a_shared_quantized_embedding(tmp_path: Path) -> None:
    """The genai builder's int4 SmolLM2 folder feeds input_ids to a GatherBlockQuantized whose data is a Reshape of
    the LM head's weights (no initializer): its scales say the rows. token_type_ids reach their table through a
    Cast. Another integer input that indexes nothing is not a table's."""
    import onnx
    from onnx import TensorProto, helper

    from harness.prepare.graph_tables import index_tables

    def ints(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])

    weights = [
        helper.make_tensor("head", TensorProto.UINT8, [300, 2, 16], bytes(300 * 32), raw=True),
        helper.make_tensor("scales", TensorProto.FLOAT, [300, 2], [1.0] * 600),
        helper.make_tensor("shape", TensorProto.INT64, [2], [300, 32]),
        helper.make_tensor("types", TensorProto.FLOAT, [2, 64], [0.0] * 128),
    ]
    nodes = [
        helper.make_node("Reshape", ["head", "shape"], ["table"]),
        helper.make_node(
            "GatherBlockQuantized",
            ["table", "input_ids", "scales"],
            ["embedded"],
            domain="com.microsoft",
            block_size=32,
        ),
        helper.make_node("Cast", ["token_type_ids"], ["types_i32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["types", "types_i32"], ["typed"]),
        helper.make_node("Identity", ["step"], ["step_out"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("embedded", "typed")]
    outputs.append(helper.make_tensor_value_info("step_out", TensorProto.INT64, None))
    graph = helper.make_graph(nodes, "g", [ints("input_ids"), ints("token_type_ids"), ints("step")], outputs, weights)
    onnx.save(helper.make_model(graph), tmp_path / "shared.onnx")
    assert index_tables(tmp_path / "shared.onnx") == {"input_ids": 300, "token_type_ids": 2}


def test_ab_which_draws_its_inputs_refuses_a_prompt_from_the_api() -> None:
    """ab's request inherits the run options but compares inference on drawn inputs: a prompt or an EOS policy
    given through the Python API is refused, not ignored."""
    from harness.ab.run import AbRequest, validate_ab
    from harness.core.options import RequestError

    for given in ({"prompt": "t1"}, {"prompt_ids": [1]}, {"chat": True}, {"stop_at_eos": True}):
        with pytest.raises(RequestError, match="ab draws each case's inputs: it takes no prompt"):
            validate_ab(AbRequest(a="bert-tiny", b="bert-tiny", **given))
