"""Issue 42's smaller holes, each now an exit 2 or a true label: a comma-separated option with an empty item or a
number in other than ASCII digits (`--prompt-ids ,` ran a drawn prompt, `1,,2` ran [1, 2], `１２` ran 12); a WAV
header whose sample width or frame size the wave module rounds (1-bit read as 8-bit, a 3-byte stereo frame read as
4 bytes); a Whisper folder's generated tokens stored without their text beside its tokenizer.json; a decoder-only
folder filed under the embedding family."""

from __future__ import annotations

import json
import struct
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli, run_cli_process

from harness.core.options import RequestError
from harness.prepare.specs import spec_from_path
from harness.run.plan import BenchmarkRequest, validate

GENERATE = ("native", "--mode", "generate", "--model", "llama-tiny", "--hardware", "cpu")
WHISPER = ("native", "--mode", "generate", "--model", "whisper-tiny", "--hardware", "cpu")


def refused(done: Any, db: Path, *words: str) -> None:
    """Exit 2 with one line naming what was wrong, no traceback, no store."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-800:] + done.stdout[-400:]
    assert all(word in lines[0] for word in words), lines
    assert "Traceback" not in done.stderr and not db.exists()


# --- a. an option's comma list and numbers -----------------------------------------------------------------------

BAD_OPTIONS = [
    # (the command line, the words its one line says): the empty item of every kind of list, Unicode digits
    (("--prompt-ids", "1,,2"), ("--prompt-ids", "none of them empty", "(got '1,,2')")),
    (("--prompt-ids", "5,"), ("--prompt-ids", "none of them empty")),
    (("--prompt-ids", "１２"), ("--prompt-ids", "integers", "ASCII digits", "(got '１２')")),
    (("--native-threads", "１２"), ("--native-threads", "integers from 1 to 256 in ASCII digits")),
    (("--native-threads", "1,,2"), ("--native-threads", "none of them empty")),
    (("--audio-seconds", "５"), ("--audio-seconds", "integers from 1 to 30 in ASCII digits")),
    (("--warmup", "１２"), ("--warmup", "a whole number from 0 to 1,000,000 in ASCII digits", "(got '１２')")),
    (("--timeout", "１０"), ("--timeout", "a number in ASCII digits")),
    (("--depths", "0,,512"), ("--depths", "none of them empty")),
    (("--engines", "onnxruntime,"), ("--engines", "none of them empty")),
    (("--hardware", ",cpu"), ("--hardware", "none of them empty")),
    (("--precision", "fp32,"), ("--precision", "none of them empty")),
    (("--mode", ""), ("--mode", "none of them empty", "(got '')")),
]


def test_an_empty_item_or_a_unicode_digit_in_an_option_is_refused(tmp_path: Path) -> None:
    """`--prompt-ids ,` ran a drawn prompt with exit 0 (the list split to nothing, then its default); every list
    option dropped empty items and int() took '１２'. The command line's one parse refuses both, naming the flag."""
    db = tmp_path / "none.duckdb"
    first = run_cli_process(*GENERATE, "--prompt-ids", ",", "--db", str(db))  # a process: its exit and stderr
    refused(first, db, "--prompt-ids takes comma-separated values, none of them empty (got ',')")
    for args, words in BAD_OPTIONS:
        refused(run_cli(*GENERATE, *args, "--db", str(db)), db, *words)
    # a reading command's list, and a list the web half takes
    refused(run_cli("report", "--format", "html,", "--db", str(db)), db, "--format", "none of them empty")
    web = ("run", "--model", "bert-tiny", "--web-hardware", "wasm,", "--db", str(db))
    refused(run_cli(*web), db, "--web-hardware", "none of them empty")


def test_the_api_s_text_lists_are_refused_alike_and_good_lists_still_parse(tmp_path: Path) -> None:
    from harness.cli.common import request_values
    from harness.run.plan import RunOptions

    db = tmp_path / "none.duckdb"
    for given in ({"prompt_ids": "1,,2"}, {"prompt_ids": ["1", ""]}, {"prompt_ids": ["１２"]}, {"depths": "0,"}):
        with pytest.raises(RequestError, match=r"none of them empty|--prompt-ids takes comma-separated token ids"):
            validate(BenchmarkRequest(models=["llama-tiny"], hardware=["cpu"], modes=["generate"], db_path=db, **given))
    values = request_values(RunOptions, {"prompt_ids": "5, 6,7", "depths": "0,512", "modes": "inference,generate"})
    assert values == {"prompt_ids": [5, 6, 7], "depths": [0, 512], "modes": ["inference", "generate"]}
    assert not db.exists()


# --- b. a WAV's header read before the wave module rounds it ----------------------------------------------------


def stereo_wav(path: Path) -> bytes:
    """Half a second of a 16-bit stereo tone at 16 kHz, written by the stdlib's writer: its bytes."""
    t = np.arange(8000) / 16_000
    samples = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as file:
        file.setnchannels(2)
        file.setsampwidth(2)
        file.setframerate(16_000)
        file.writeframes(np.repeat(samples[:, None], 2, axis=1).tobytes())
    return path.read_bytes()


def test_a_wav_whose_header_gives_1_bit_samples_or_a_wrong_frame_is_refused(tmp_path: Path) -> None:
    """The fmt chunk (offset 20): format, channels, rate, bytes/s, block_align (32), bits per sample (34). wave
    read 1-bit samples as 8-bit and a 2-channel file of 3-byte frames as 4-byte ones: samples nobody recorded."""
    from harness.prepare.audio import AudioError, read_wav

    good = stereo_wav(tmp_path / "good.wav")
    one_bit = tmp_path / "one-bit.wav"
    one_bit.write_bytes(good[:34] + struct.pack("<H", 1) + good[36:])
    frame = tmp_path / "frame.wav"
    frame.write_bytes(good[:32] + struct.pack("<H", 3) + good[34:])
    with pytest.raises(AudioError, match="1-bit samples; PCM of 8, 16, 24, 32 bits is valid"):
        read_wav(one_bit)
    with pytest.raises(AudioError, match=r"frames of 3 bytes \(block_align\) for 2 channels of 16-bit samples; "
                                         r"2 × 2 = 4 bytes is valid"):  # fmt: skip
        read_wav(frame)
    # a chunk before fmt (an odd-sized JUNK, padded) is walked past: a good file still reads
    junk = tmp_path / "junk.wav"
    body = good[12:]
    junk.write_bytes(b"RIFF" + struct.pack("<I", len(body) + 4 + 14) + b"WAVE" + b"JUNK" + struct.pack("<I", 5)
                     + b"abcde\0" + body)  # fmt: skip
    samples, rate, channels = read_wav(junk)
    assert (rate, channels, samples.shape) == (16_000, 2, (8000,))
    db = tmp_path / "none.duckdb"
    first = run_cli_process(*WHISPER, "--audio", str(one_bit), "--db", str(db))
    refused(first, db, "--audio one-bit.wav", "1-bit samples")
    refused(run_cli(*WHISPER, "--audio", str(frame), "--db", str(db)), db, "--audio frame.wav", "block_align")


# --- c. a Whisper folder's tokens come back as text ----------------------------------------------------------------


# The Whisper folder's text (c) is checked where such a folder already runs natively and in the page:
# tests/test_seq2seq_folders.py::test_a_transformers_js_whisper_folder_runs_an_fp32_encoder_and_a_q4_decoder.


# --- d. a decoder-only folder's family ----------------------------------------------------------------------------


def tiny_graph(path: Path, inputs: tuple[str, ...]) -> Path:
    """A valid ONNX graph taking `inputs` (int64 ids, float past) and giving logits: a layout's file."""
    import onnx
    from onnx import TensorProto, helper

    declared = [helper.make_tensor_value_info(name, TensorProto.INT64 if "ids" in name else TensorProto.FLOAT,
                                              ["batch", "seq"]) for name in inputs]  # fmt: skip
    nodes = [helper.make_node("Cast", [inputs[0]], ["logits"], to=TensorProto.FLOAT)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq"])]
    for past in (name for name in inputs if name.startswith("past_key_values.")):  # a decoder gives its present
        present = past.replace("past_key_values.", "present.")
        nodes.append(helper.make_node("Identity", [past], [present]))
        outputs.append(helper.make_tensor_value_info(present, TensorProto.FLOAT, ["batch", "seq"]))
    graph = helper.make_graph(nodes, "tiny", declared, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_decoder_only_folder_is_filed_under_its_task_s_family(tmp_path: Path) -> None:
    """A Llama folder (transformers.js's layout, onnxruntime-genai's) was `embedding`, whatever its config said:
    its family is now the built-in llama spec's; a lone graph that takes a past is a generator's, one without
    stays embedding; an HF checkpoint folder keeps its model_type's."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    decoder = ("input_ids", "attention_mask", "past_key_values.0.key")
    checkpoint = tmp_path / "checkpoint"
    config.save_pretrained(checkpoint)
    js = tmp_path / "llama-js"
    (js / "onnx").mkdir(parents=True)
    config.save_pretrained(js)
    tiny_graph(js / "onnx" / "model.onnx", ("input_ids",))  # the config, not the graph, says what it is
    genai = tmp_path / "llama-genai"
    genai.mkdir()
    tiny_graph(genai / "model.onnx", ("input_ids",))
    (genai / "genai_config.json").write_text(
        json.dumps({"model": {"type": "llama", "decoder": {"filename": "model.onnx"}}})
    )
    lone = tmp_path / "lone"
    lone.mkdir()
    families = {
        "checkpoint": spec_from_path(checkpoint, None).family,
        "transformers.js": spec_from_path(js, None).family,
        "genai": spec_from_path(genai, None).family,
        "lone decoder": spec_from_path(tiny_graph(lone / "decoder.onnx", decoder), None).family,
        "lone encoder": spec_from_path(tiny_graph(lone / "encoder.onnx", ("input_ids",)), None).family,
        "asked": spec_from_path(js, "embedding").family,  # --model-families still names it
    }
    assert families == {"checkpoint": "text_generation", "transformers.js": "text_generation",
                        "genai": "text_generation", "lone decoder": "text_generation", "lone encoder": "embedding",
                        "asked": "embedding"}  # fmt: skip
    plan = validate(
        BenchmarkRequest(model_path=js, hardware=["cpu"], engines=["onnxruntime"], db_path=tmp_path / "none.duckdb")
    )
    assert [spec.family for spec in plan.specs] == ["text_generation"] and not (tmp_path / "none.duckdb").exists()
