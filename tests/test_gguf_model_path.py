"""A GGUF on its own as the model (`--model-path x.gguf`, issue 43): one real run of a tiny GGUF written by the
harness's own writer (harness.prepare.gguf_export, from random llama-tiny-shaped weights: no torch), natively through
node-llama-cpp's llama.cpp and in Chromium through wllama, both checked against native llama.cpp's greedy tokens on
the same file; the engines and page runtimes that need ONNX are `unsupported` rows saying why. A GGUF whose header
lies (a tensor count larger than present, an oversized string, an array past its bound, data past the end, an
architecture llama.cpp here does not run) is refused before a run exists: exit 2, nothing written. The check can
fail: a reference whose tokens differ, and (slow) the page served the file with one weight scaled by 1.05."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli, stored_rows

from harness.core.generation import StepTop
from harness.core.graph_cost import mean_positions
from harness.core.records import Case
from harness.native.llamacpp_backend import NODE_MODULES
from harness.prepare.gguf_export import write_gguf
from harness.prepare.gguf_file import ARCHITECTURES, GgufError, read_gguf
from harness.prepare.gguf_model import QUANTIZED_GAP, STEP_TOLERANCES, token_check
from harness.prepare.prepared import PreparedModel
from harness.prepare.specs import load_specs, spec_from_path
from harness.web import runtime_dist

NEEDS_LLAMA_CPP = pytest.mark.skipif(shutil.which("node") is None or not NODE_MODULES.is_dir(),
                                     reason="native llama.cpp runs in node (make setup)")  # fmt: skip
NEEDS_PAGE = pytest.mark.skipif(not Path("/usr/bin/chromium").exists() or runtime_dist.problem("llama.cpp") is not None,
                                reason="needs Chromium and wllama's npm files (make setup)")  # fmt: skip
QUICK = ("--iterations", "2", "--warmup", "0", "--min-duration", "0", "--new-tokens", "4", "--sequence-lengths", "8",
         "--no-ceilings", "--no-reports")  # fmt: skip
WLLAMA_WASM = Path(__file__).resolve().parents[1] / "web/node_modules/@wllama/wllama/esm/wasm/wllama.wasm"
LIBLLAMA = NODE_MODULES.parent / "@node-llama-cpp/linux-x64/bins/linux-x64"
_CONFIG = load_specs()["llama-tiny"].config
# llama.cpp's KV cache per cached position (f16 K and V of every layer), from llama-tiny's config
KV_PER_POSITION = _CONFIG["num_hidden_layers"] * 2 * _CONFIG["num_key_value_heads"] * _CONFIG["head_dim"] * 2


class _Array:
    """What gguf_export reads of a torch tensor (detach().float().cpu().numpy()), over a numpy array."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def detach(self) -> _Array:
        return self

    float = cpu = detach

    def numpy(self) -> np.ndarray:
        return self.array


def tiny_gguf(path: Path, precision: str = "q4", seed: int = 0) -> Path:
    """A GGUF of llama-tiny's shapes with random weights, written by the harness's own writer."""
    config = dict(load_specs()["llama-tiny"].config)
    rng = np.random.default_rng(seed)
    hidden, inner, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    kv, q = config["num_key_value_heads"] * config["head_dim"], heads * config["head_dim"]
    state = {"model.embed_tokens.weight": rng.normal(0, 0.5, (config["vocab_size"], hidden)),
             "model.norm.weight": np.ones(hidden)}  # fmt: skip
    shapes = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, q), "mlp.gate_proj": (inner, hidden), "mlp.up_proj": (inner, hidden),
              "mlp.down_proj": (hidden, inner)}  # fmt: skip
    for block in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{block}."
        state |= {f"{prefix}{name}.weight": rng.normal(0, 0.2, shape) for name, shape in shapes.items()}
        state |= {f"{prefix}input_layernorm.weight": np.ones(hidden),
                  f"{prefix}post_attention_layernorm.weight": np.ones(hidden)}  # fmt: skip
    weights = {name: _Array(np.asarray(array, dtype=np.float32)) for name, array in state.items()}
    model = types.SimpleNamespace(state_dict=lambda: weights)
    write_gguf(model, types.SimpleNamespace(model_type="llama", **config), path, precision)
    return path


def rows_of(db: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["hardware"], r["engine"]): r for r in stored_rows(db)}


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_the_header_gives_the_files_facts(gguf: Path) -> None:
    facts = read_gguf(gguf)
    assert (facts.architecture, facts.tokenizer, facts.vocab_size) == ("llama", "llama", 1000)
    assert (facts.quantization, facts.precision, facts.file_type) == ("Q4_0", "q4", "MOSTLY_Q4_0")
    assert facts.tensor_types == {"Q4_0": 15, "F32": 6}  # 14 matrices and the embeddings; 5 norms and rope_freqs
    assert facts.parameters == sum(t.elements for t in facts.tensors) > 32_000  # the embeddings alone are 32,000
    embeddings = next(t for t in facts.tensors if t.name == "token_embd.weight")
    tied = sum(t.nbytes for t in facts.tensors) + embeddings.nbytes // 1000  # no output.weight: read whole, and a row
    assert facts.weight_bytes_per_token == tied
    spec = spec_from_path(gguf, None)
    assert spec.is_gguf_file and spec.is_generative and not spec.has_past_export and spec.context_length == 2048


def _lying(gguf: Path, folder: Path, how: str) -> Path:
    """A copy of the GGUF whose header lies in one way."""
    data = bytearray(gguf.read_bytes())
    tensors = struct.unpack_from("<Q", data, 8)[0]
    if how == "more tensors than present":
        struct.pack_into("<Q", data, 8, tensors + 3)
    elif how == "a tensor count past its bound":
        struct.pack_into("<Q", data, 8, 10**12)
    elif how == "an oversized string":
        struct.pack_into("<Q", data, 24, 2**40)  # the first key's length
    elif how == "an array past its bound":
        at = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 8  # its type, its item type
        struct.pack_into("<Q", data, at, 2**33)
    elif how == "data past the end":
        data = data[: len(data) // 2]
    elif how == "an architecture not run here":
        data = data.replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00mamba", 1)
    path = folder / "lying.gguf"
    path.write_bytes(bytes(data))
    return path


LIES = {
    "more tensors than present": "",
    "a tensor count past its bound": "1,000,000,000,000 tensors",
    "an oversized string": "MAX_GGUF_STRING_BYTES",
    "an array past its bound": "MAX_GGUF_ARRAY",
    "data past the end": "past the file's",
    "an architecture not run here": "its architecture 'mamba' is not one",
}


@pytest.mark.parametrize("how", list(LIES))
def test_a_gguf_whose_header_lies_is_refused_before_a_run(gguf: Path, tmp_path: Path, how: str) -> None:
    lying = _lying(gguf, tmp_path, how)
    with pytest.raises(GgufError):
        read_gguf(lying)
    db, out = tmp_path / "r.duckdb", tmp_path / "reports"
    done = run_cli("run", "--mode", "generate", "--model-path", str(lying), "--hardware", "cpu", "--web-hardware",
                   "wasm", "--web-runtimes", "llama.cpp", "--threads", "1", *QUICK, "--db", str(db),
                   "--output-dir", str(out))  # fmt: skip
    message = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refused as a GGUF" in message and LIES[how] in message and "Traceback" not in message
    assert not db.exists() and not out.exists()


def test_a_fifo_named_gguf_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    done = run_cli("native", "--mode", "generate", "--model-path", str(fifo), "--db", str(tmp_path / "r.duckdb"))
    assert done.returncode == 2 and "not a regular file" in " ".join(done.stderr.split())


@pytest.mark.parametrize(("args", "says"), [
    (("--precision", "fp32"), "it runs at the precision it holds"),
    (("--prompt", "The capital of France is"), "--prompt text is not taken for a GGUF"),
])  # fmt: skip
def test_what_a_gguf_cannot_take_is_refused(gguf: Path, tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    db = tmp_path / "r.duckdb"
    done = run_cli("native", "--mode", "generate", "--model-path", str(gguf), *args, "--db", str(db))
    assert done.returncode == 2 and says in " ".join(done.stderr.split()) and not db.exists()
    done = run_cli("native", "--mode", "inference", "--model-path", str(gguf), "--db", str(db))
    assert done.returncode == 2 and "give --mode generate alone" in " ".join(done.stderr.split())


def test_both_llama_cpp_binaries_know_every_architecture_taken() -> None:
    """ARCHITECTURES is what both builds run: each name is a string in node-llama-cpp's libllama and in wllama's wasm
    (llama.cpp's LLM_ARCH_NAMES), NUL-terminated (a linker may share a name's bytes with a longer one's tail)."""
    binaries = [WLLAMA_WASM, *LIBLLAMA.glob("libllama.v*.so")]
    if len(binaries) < 2 or not WLLAMA_WASM.is_file():
        pytest.skip("the llama.cpp binaries are not installed (make setup)")
    for binary in binaries:
        data = binary.read_bytes()
        assert [a for a in ARCHITECTURES if f"{a}\0".encode() not in data] == [], binary.name
        assert b"mamba-not-an-arch\0" not in data  # the check itself can fail


def _prepared_with_reference(tmp_path: Path, tokens: list[int]) -> PreparedModel:
    """A PreparedModel whose reference generation (gguf_model's file) holds `tokens` and top logits."""
    spec = spec_from_path(tiny_gguf(tmp_path / "t.gguf"), None)
    prepared = PreparedModel(spec, "pretrained", "t.gguf", None, None, "native llama.cpp", None)
    steps = len(tokens)
    ids = np.asarray([[t, 7, 8] for t in tokens], dtype=np.int64)
    logits = np.tile(np.asarray([5.0, 3.0, 1.0]), (steps, 1))
    file = tmp_path / "gen.npz"
    np.savez(file, tokens=np.asarray([tokens]), margins=np.full((1, steps), 2.0), prefill_logits=np.zeros(0),
             top_ids=ids, top_logits=logits, log_weight=np.zeros(steps), described=np.asarray("native"))  # fmt: skip
    prepared.generation_files[((1, 8), steps, 0)] = file
    return prepared


def test_the_check_fails_on_another_token_or_logit(tmp_path: Path) -> None:
    prepared = _prepared_with_reference(tmp_path, [4, 4, 9])
    case = Case(1, 8, "q4", "generate", 3)
    assert token_check(prepared, case, [[4, 4, 9]])[0] is True
    agree, facts = token_check(prepared, case, [[4, 5, 9]])
    assert agree is False and facts["first_divergence"] == 1 and "at step 1 5 where it chose 4" in facts["token_parity"]
    top = StepTop(np.asarray([[[4, 7, 8]] * 3]), np.asarray([[[5.0, 3.0, 1.0]] * 3]))
    assert token_check(prepared, case, [[4, 4, 9]], top)[0] is True
    atol, rtol = STEP_TOLERANCES["quantized"]  # a q4 file's: 0.05 + 0.15 x 5 allowed at each step
    near = StepTop(top.ids, top.values + np.asarray([0, 0, atol + rtol * 5 - 1e-3]))
    assert token_check(prepared, case, [[4, 4, 9]], near)[0] is True
    off = StepTop(top.ids, top.values + np.asarray([0, 0, atol + rtol * 5 + 1e-3]))
    agree, facts = token_check(prepared, case, [[4, 4, 9]], off)
    assert agree is False and "beyond it at step 0" in facts["token_parity"]
    fp32 = Case(1, 8, "fp32", "generate", 3)  # a float file's: 1e-4 + 1e-3 x 5
    assert token_check(prepared, fp32, [[4, 4, 9]], StepTop(top.ids, top.values + 6e-3))[0] is False


def _near_tie_reference(tmp_path: Path, second: float) -> PreparedModel:
    """A reference of tokens [4, 4, 9] whose step 1 has 7 `second` below its top-1 (4)."""
    tmp_path.mkdir()
    prepared = _prepared_with_reference(tmp_path, [4, 4, 9])
    file = prepared.generation_files[((1, 8), 3, 0)]
    with np.load(file) as data:
        arrays = dict(data)
    arrays["top_logits"][1] = [5.0, 5.0 - second, 1.0]
    np.savez(file, **arrays)
    return prepared


def test_a_divergence_at_a_near_tie_is_excused_and_beyond_it_is_a_mismatch(tmp_path: Path) -> None:
    """The rule native ORT's same-graph rows have, for llama.cpp: a row that leaves the reference's tokens where the
    reference's top-1 is less than the gap tolerance above its logit of the row's token agrees up to there; planted,
    the same divergence at a margin just past the tolerance (q4: QUANTIZED_GAP, measured), or at a token outside the
    reference's top-k, is a mismatch. A float file's tolerance is twice its step tolerance."""
    q4, fp32 = Case(1, 8, "q4", "generate", 3), Case(1, 8, "fp32", "generate", 3)
    near = _near_tie_reference(tmp_path / "near", QUANTIZED_GAP * 0.9)
    agree, facts = token_check(near, q4, [[4, 7, 9]])
    assert agree is True and facts["near_tie"] is True and facts["first_divergence"] == 1
    assert facts["token_parity"].startswith("ok: 1 of 3 tokens") and "not compared" in facts["token_parity"]
    far = _near_tie_reference(tmp_path / "far", QUANTIZED_GAP * 1.1)
    agree, facts = token_check(far, q4, [[4, 7, 9]])
    assert agree is False and facts["near_tie"] is False and facts["reference_gap"] > facts["gap_tolerance"]
    assert token_check(near, q4, [[4, 6, 9]])[0] is False  # 6: not among the reference's top-k
    atol, rtol = STEP_TOLERANCES["float"]
    limit = 2 * (atol + rtol * 5.0)
    assert token_check(_near_tie_reference(tmp_path / "f1", limit * 0.9), fp32, [[4, 7, 9]])[0] is True
    assert token_check(_near_tie_reference(tmp_path / "f2", limit * 1.1), fp32, [[4, 7, 9]])[0] is False


def test_the_margins_a_row_holds_are_compared(tmp_path: Path) -> None:
    """step_margin_max_diff, the figure QUANTIZED_GAP is measured by: the row's top-1/top-2 margin against the
    reference's at each step both hold, logits or log-probabilities alike."""
    prepared = _prepared_with_reference(tmp_path, [4, 4, 9])
    top = StepTop(np.asarray([[[4, 7, 8]] * 3]), np.asarray([[[-0.1, -2.3, -4.0]] * 3]))  # margin 2.2 vs 2.0
    agree, facts = token_check(prepared, Case(1, 8, "q4", "generate", 3), [[4, 4, 9]], top, log_probs=True)
    assert agree is True and facts["step_margins_compared"] == 2  # step 2: the row holds no 9
    assert facts["step_margin_max_diff"] == pytest.approx(0.2)


def test_predict_says_a_gguf_has_no_graph_to_count(gguf: Path, tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    done = run_cli("predict", "--mode", "generate", "--model-path", str(gguf), "--db", str(db))
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "a GGUF file has no ONNX graph" in said and "Measure it instead" in said
    assert "Traceback" not in done.stderr and not db.exists()


@pytest.fixture(scope="module")
def side_by_side(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    out = tmp_path_factory.mktemp("gguf-run")
    db = out / "r.duckdb"
    done = run_cli("run", "--mode", "generate", "--model-path", str(gguf), "--hardware", "cpu", "--web-hardware",
                   "wasm", "--web-runtimes", "llama.cpp,onnxruntime-web", "--engines", "llama.cpp,onnxruntime",
                   "--threads", "1", "--native-threads", "1", *QUICK, "--db", str(db), "--output-dir",
                   str(out / "reports"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return rows_of(db)


@NEEDS_LLAMA_CPP
@NEEDS_PAGE
def test_native_and_page_llama_cpp_run_the_gguf_with_equal_tokens(gguf: Path, side_by_side: dict) -> None:
    native, page = side_by_side["cpu", "llama.cpp"], side_by_side["wasm", "llama.cpp"]
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    for row in (native, page):
        details = row["details"]
        assert row["status"] == "ok", row["error"]
        assert row["precision"] == "q4" and row["decode_tokens_per_s"] > 0 and row["ttft_ms"] > 0
        assert details["token_parity"] == "all 4 tokens equal native llama.cpp's on the same file"
        assert details["step_logit_max_diff"] <= details["step_logit_tolerance"][0] + 1e-3  # this file: ~3e-5
        assert (details["model_file"], details["model_sha256"], details["gguf_quantization"]) == ("tiny.gguf", digest,
                                                                                                   "Q4_0")  # fmt: skip
        assert details["parameters"] == read_gguf(gguf).parameters and details["gguf_weight_bytes_per_token"] > 0
        assert details["token_reference"].startswith("native llama.cpp ")
        # its work counted on the file that ran: its weights, and llama.cpp's f16 KV cache at the steps' mean depth
        positions = mean_positions(row["seq_len"], 0, row["new_tokens"])
        kv = KV_PER_POSITION * positions
        assert row["bytes_per_token"] == pytest.approx(details["gguf_weight_bytes_per_token"] + kv)
        assert details["kv_bytes_per_step"] == pytest.approx(kv) and row["prefill_flops_per_token"] is None
    assert native["generated_tokens"] == page["generated_tokens"] and native["output_text"] == page["output_text"]
    assert native["details"]["native_threads"] == 1 and page["details"]["threads_effective"] == 1


@NEEDS_LLAMA_CPP
@NEEDS_PAGE
def test_what_needs_onnx_says_a_gguf_has_none(side_by_side: dict) -> None:
    for key in (("cpu", "onnxruntime"), ("wasm", "onnxruntime-web")):
        row = side_by_side[key]
        assert row["status"] == "unsupported" and "a GGUF file has no ONNX graph" in row["error"]


@pytest.mark.slow
@NEEDS_LLAMA_CPP
@NEEDS_PAGE
def test_the_page_served_a_scaled_weight_is_a_mismatch(tmp_path: Path) -> None:
    """The faults hook serves the page the F32 GGUF with its largest weight scaled by 1.05 (harness.browser.runtimes.
    served_gguf): random weights keep the tokens, but each step's log-probabilities move far past the tolerance."""
    from harness.browser.generate import SCALED_WEIGHT_FAULT

    model = tiny_gguf(tmp_path / "f32.gguf", "fp32")
    db = tmp_path / "f.duckdb"
    done = run_cli("web", "--mode", "generate", "--model-path", str(model), "--runtimes", "llama.cpp", "--hardware",
                   "wasm", "--threads", "1", *QUICK, "--db", str(db),
                   env={"ACCELHARNESS_INJECT_FAULT": SCALED_WEIGHT_FAULT})  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = rows_of(db)["wasm", "llama.cpp"]
    assert row["status"] == "mismatch" and "beyond it at step 0" in row["error"]
