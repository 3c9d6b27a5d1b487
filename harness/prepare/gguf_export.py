"""A GGUF of a prepared model's own weights, written with llama.cpp's own gguf-py (the PyPI `gguf` package), so
llama.cpp (natively through node-llama-cpp, in the page through wllama) runs the same weights as every other engine.

It follows llama.cpp's convert_hf_to_gguf.py for LLaMA (`LlamaModel`) and Qwen2 (`Qwen2Model`):
  tensors   token_embd, blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm / ffn_gate / ffn_up /
            ffn_down, output_norm, output (none when the embeddings are tied: llama.cpp reuses token_embd);
            Qwen2's q/k/v biases as attn_q.bias …; llama3 RoPE scaling as the rope_freqs tensor
  Q and K   LLaMA's rows permuted back from transformers' rotate-half layout to the interleaved one llama.cpp's
            LLAMA rope (mode 0) rotates: `permute` (K with the key/value heads); Qwen2 runs NEOX rope, unpermuted
  metadata  context, embedding and feed-forward lengths, block count, head counts, key/value length, rope
            dimension count and freq base (transformers 5 keeps rope_theta in config.rope_parameters), RMS eps
  types     1-D tensors (norms, biases, rope_freqs) F32 as llama.cpp keeps them; the 2-D weights at the precision:
            fp32 F32, fp16 F16, q4 Q4_0 (gguf.quants, in blocks of 32 along each row; a row that does not divide
            stays F16, counted in gguf_tensor_types), int8 Q8_0 likewise

The vocabulary: a tokenizer.json beside the model (a real model's folder) in GPT-2 byte-level BPE form is written as
convert_hf_to_gguf writes one (gguf.vocab.BpeVocab and SpecialVocab's merges, pre-tokenizer "default": llama.cpp
never tokenizes here); anything else (a tiny random spec has no tokenizer) a synthetic SentencePiece-style vocabulary
of the config's vocab_size: <unk>, <s>, </s>, the 256 byte tokens, then one character per remaining id. Native
llama.cpp is given prompt ids directly; the page's (wllama 3.x takes text only) spells them as text with this
vocabulary, which tokenizes back into the same ids.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.records import UnsupportedError

# transformers model_type → llama.cpp architecture (gguf.MODEL_ARCH_NAMES), whose Q/K need LLaMA's permutation
ARCHITECTURES: dict[str, tuple[str, bool]] = {"llama": ("llama", True), "qwen2": ("qwen2", False)}
BYTE_TOKENS = 256  # <0x00> … <0xFF>, which llama.cpp's SentencePiece vocabulary loader looks up
# harness precision (harness.core.precision.MEANINGS) → GGUF type of the 2-D weights (its name in gguf-py)
TENSOR_TYPES = {"fp32": "F32", "fp16": "F16", "q4": "Q4_0", "int8": "Q8_0"}
# the file type each precision's file states (general.file_type: llama.cpp's LLAMA_FTYPE)
FILE_TYPES = {"fp32": "ALL_F32", "fp16": "MOSTLY_F16", "q4": "MOSTLY_Q4_0", "int8": "MOSTLY_Q8_0"}


def gguf_precision(precision: str) -> str:
    """The precision of the GGUF a run's precision runs: itself, fp32 for `auto` (no conversion asked for)."""
    return "fp32" if precision == "auto" else precision


def why_not(model_type: str | None, precision: str) -> str | None:
    """Why a model of this type cannot be written as a GGUF at a precision, or None when it can (torch-free: a
    warm cache is read without the model)."""
    if model_type not in ARCHITECTURES:
        return (f"no GGUF writer for model_type '{model_type}': the llama-family decoders "
                f"({', '.join(ARCHITECTURES)}) only")  # fmt: skip
    if precision not in TENSOR_TYPES:
        return f"no GGUF type for precision '{precision}'; written: {', '.join(TENSOR_TYPES)}"
    return None


def supported(config: Any, precision: str) -> str | None:
    """why_not of a transformers config."""
    return why_not(getattr(config, "model_type", None), precision)


def gguf_file(folder: Path, precision: str) -> Path:
    """A precision's GGUF in a model's GGUF folder (beside its exports, keyed like them by the weights' fingerprint),
    its name tagged with the writer (this module's code and gguf-py's version): another writer, another file."""
    code = Path(__file__).read_bytes() + version("gguf").encode()
    return folder / f"model-{TENSOR_TYPES[precision].lower()}-{hashlib.sha256(code).hexdigest()[:12]}.gguf"


def facts_file(path: Path) -> Path:
    """The facts write_gguf returned for a cached GGUF, beside it (its failure's reason where it failed)."""
    return path.with_name(path.name + ".json")


def write_cached(model: Any, config: Any, path: Path, precision: str, tokenizer: Path | None) -> dict[str, Any]:
    """write_gguf into the cache: through a temp file beside `path`, renamed into place after its facts file, so
    no reader sees half a GGUF or one without its facts. A failure is kept in the facts file as {"error": why}
    (the next run reads it without building the model) and raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        try:
            facts = write_gguf(model, config, Path(temp), precision, tokenizer)
        except Exception as exc:
            _write_json(facts_file(path), {"error": f"{type(exc).__name__}: {exc}"[:500]})
            raise
        _write_json(facts_file(path), facts)
        os.replace(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)
    return facts


def read_cached(path: Path) -> dict[str, Any] | None:
    """A cached GGUF's facts ({"error": why} where writing it failed), or None where nothing was left."""
    try:
        facts = json.loads(facts_file(path).read_text())
    except (OSError, ValueError):
        return None
    return facts if "error" in facts or path.is_file() else None


def _write_json(path: Path, value: dict[str, Any]) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(handle, "w") as file:
        json.dump(value, file)
    os.replace(temp, path)


def write_gguf(model: Any, config: Any, out: Path, precision: str, tokenizer: Path | None = None) -> dict[str, Any]:
    """Write `model`'s (a transformers LlamaForCausalLM or Qwen2ForCausalLM) state_dict to `out` as a GGUF at a
    harness precision; `tokenizer`: a folder whose tokenizer.json gives the vocabulary. Returns the facts a row
    carries. Raises UnsupportedError for another architecture or precision."""
    import gguf

    if why := supported(config, precision):
        raise UnsupportedError(why)
    arch, permuted = ARCHITECTURES[config.model_type]
    writer = gguf.GGUFWriter(str(out), arch)
    _metadata(writer, config, precision)
    vocab = _vocabulary(writer, config, tokenizer)
    counts: dict[str, int] = {}
    for name, array in _tensors(model, config, permuted):
        kind = _add_tensor(writer, name, array, precision)
        counts[kind] = counts.get(kind, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"gguf_file_type": TENSOR_TYPES[precision], "gguf_tensor_types": counts,
            "gguf_writer": f"gguf-py {version('gguf')}", "gguf_vocab": vocab, "gguf_architecture": arch}  # fmt: skip


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: transformers' q_proj/k_proj rows (each head's rotary halves apart)
    back to the interleaved pairs llama.cpp's LLAMA rope rotates."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))  # fmt: skip


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope(config: Any) -> dict[str, Any]:
    """The RoPE parameters: transformers 5's config.rope_parameters, else 4's rope_theta and rope_scaling."""
    found = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    found.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return found


def _metadata(writer: Any, config: Any, precision: str) -> None:
    """TextModel.set_gguf_parameters and LlamaModel's (convert_hf_to_gguf)."""
    import gguf

    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(_head_dim(config))
    writer.add_value_length(_head_dim(config))
    writer.add_rope_dimension_count(_head_dim(config))
    rope = _rope(config)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif kind not in ("default", "llama3"):  # llama3: the rope_freqs tensor (_tensors)
        raise UnsupportedError(f"no GGUF writer for RoPE scaling '{kind}'")
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[precision]))


def _tensors(model: Any, config: Any, permuted: bool) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, fp32 array) of every tensor, in convert_hf_to_gguf's order and layout."""
    state = {name: tensor.detach().float().cpu().numpy() for name, tensor in model.state_dict().items()}
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
    tensors = []
    if (freqs := _rope_freqs(config)) is not None:
        tensors.append(("rope_freqs.weight", freqs))
    tensors.append(("token_embd.weight", state["model.embed_tokens.weight"]))
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}  # fmt: skip
    for block in range(config.num_hidden_layers):
        for hf, ours in names.items():
            for part in ("weight", "bias"):
                array = state.get(f"model.layers.{block}.{hf}.{part}")
                if array is None:
                    continue
                if permuted and ours == "attn_q":
                    array = permute(array, heads, heads)
                elif permuted and ours == "attn_k":
                    array = permute(array, heads, kv_heads)
                tensors.append((f"blk.{block}.{ours}.{part}", array))
    tensors.append(("output_norm.weight", state["model.norm.weight"]))
    if not getattr(config, "tie_word_embeddings", False) and "lm_head.weight" in state:
        tensors.append(("output.weight", state["lm_head.weight"]))
    return tensors


def _rope_freqs(config: Any) -> np.ndarray | None:
    """LlamaModel.generate_extra_tensors: llama3 RoPE scaling's per-frequency factors (rope_freqs), or None."""
    rope = _rope(config)
    if (rope.get("rope_type") or rope.get("type")) != "llama3":
        return None
    dim = _head_dim(config)
    freqs = 1.0 / (float(rope["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_context = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_context / low, old_context / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _add_tensor(writer: Any, name: str, array: np.ndarray, precision: str) -> str:
    """One tensor at its GGUF type (1-D F32; 2-D the precision's, F16 where a row does not divide into the
    quantized type's blocks); returns the type's name."""
    import gguf

    kind = TENSOR_TYPES[precision] if array.ndim > 1 else "F32"
    qtype = gguf.GGMLQuantizationType[kind]
    if kind not in ("F32", "F16") and array.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        kind, qtype = "F16", gguf.GGMLQuantizationType.F16
    if kind == "F32":
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    elif kind == "F16":
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float16))
    else:
        data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    return kind


def _vocabulary(writer: Any, config: Any, tokenizer: Path | None) -> str:
    """The vocabulary: the folder's BPE tokenizer.json where it has one of that form, else synthetic. Returns what
    was written (the facts' gguf_vocab)."""
    if tokenizer is not None and (tokenizer / "tokenizer.json").is_file():
        try:
            return _bpe_vocabulary(writer, config, tokenizer)
        except Exception as exc:  # another tokenizer form: the synthetic vocabulary serves (ids are given)
            why = f"{type(exc).__name__}: {exc}"[:200]
            _synthetic_vocabulary(writer, config)
            return f"synthetic (the folder's tokenizer.json is not GPT-2 byte-level BPE: {why})"
    _synthetic_vocabulary(writer, config)
    return "synthetic"


def _bpe_vocabulary(writer: Any, config: Any, folder: Path) -> str:
    """convert_hf_to_gguf's GPT-2 BPE vocabulary (get_vocab_base), its ids padded to vocab_size with [PAD<id>]."""
    import gguf

    bpe = gguf.vocab.BpeVocab(folder)
    ids = dict(bpe.vocab) | bpe.added_tokens_dict
    if max(ids.values()) >= config.vocab_size:
        raise ValueError(f"the tokenizer has ids past the model's vocab_size {config.vocab_size}")
    texts, types = [f"[PAD{i}]" for i in range(config.vocab_size)], [gguf.TokenType.UNUSED] * config.vocab_size
    for text, index in ids.items():
        texts[index] = text
        types[index] = gguf.TokenType.CONTROL if text in bpe.added_tokens_dict else gguf.TokenType.NORMAL
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(texts)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=config.vocab_size).add_to_gguf(writer)
    return "tokenizer.json (GPT-2 byte-level BPE, pre-tokenizer 'default')"


# The synthetic vocabulary's regular tokens: one character each, from blocks of letters that are neither space,
# punctuation nor a byte token's spelling (CJK ideographs, extension A, Hangul syllables, extension B: 81,140 of them).
# A vocabulary of single characters and no longer piece has nothing to merge: SentencePiece tokenizes any text of
# them back into exactly one token per character, so a prompt of ids survives being spelled as text (wllama 3.x,
# llama.cpp in the page, takes text only).
SYNTHETIC_BLOCKS = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xAC00, 0xD7A3), (0x20000, 0x2A6DF))


def synthetic_pieces(count: int) -> list[str]:
    pieces: list[str] = []
    for first, last in SYNTHETIC_BLOCKS:
        pieces += [chr(point) for point in range(first, min(last + 1, first + count - len(pieces)))]
    return pieces + [f"tok{i}" for i in range(len(pieces), count)]  # beyond the blocks: ids that do not round-trip


def _synthetic_vocabulary(writer: Any, config: Any) -> None:
    """A SentencePiece-style ("llama") vocabulary of vocab_size tokens: <unk>, <s>, </s> (control tokens), the 256
    byte tokens (user-defined), then one character per id (SYNTHETIC_BLOCKS): each read back from its own text, with
    no space prefix and no BOS added, so text spelled from any ids is tokenized back into the same ids (wllama);
    BOS and EOS from the config (else 1 and 2)."""
    import gguf

    size = config.vocab_size
    texts = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    # the 256 byte tokens llama.cpp's SentencePiece loader looks up by their text (without them it aborts), typed
    # user-defined: llama.cpp then reads each back from its own text "<0x80>" (a lone byte above 0x7F is no text and
    # a space is SentencePiece's '▁', so as byte tokens neither could be spelled back into its id)
    if size >= len(texts) + BYTE_TOKENS:
        texts += [f"<0x{byte:02X}>" for byte in range(BYTE_TOKENS)]
        types += [gguf.TokenType.USER_DEFINED] * BYTE_TOKENS
    texts += synthetic_pieces(max(0, size - len(texts)))
    types += [gguf.TokenType.NORMAL] * (size - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_add_space_prefix(False)
    writer.add_token_list(texts[:size])
    writer.add_token_scores([-float(i) for i in range(size)])
    writer.add_token_types(types[:size])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(token_id(getattr(config, "bos_token_id", None), 1, size))
    writer.add_eos_token_id(token_id(getattr(config, "eos_token_id", None), 2, size))
    writer.add_add_bos_token(False)


def token_id(value: Any, default: int, size: int) -> int:
    """A config's token id (the first of a list), inside the vocabulary, else the default."""
    value = value[0] if isinstance(value, list | tuple) and value else value
    return value if type(value) is int and 0 <= value < size else default
