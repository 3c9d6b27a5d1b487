"""The tokenizer a transformers.js folder is served with, so its `pipeline` tokenizes a prompt's text as users call
it: the model folder's own tokenizer.json and tokenizer_config.json (read bounded, inside the folder) where it has
them, else, for a model built from a spec (which has no tokenizer), a synthetic one of the config's vocabulary, in
the shape of the GGUF's synthetic vocabulary (harness.prepare.gguf_export): <unk>, <s>, </s> and the 256 byte
tokens `<0xNN>` as added tokens, each read back from its own text, then one character per id (a BPE with no
merges), decoded by concatenation. Text spelled from any ids of such a vocabulary tokenizes back into the same
ids, so a row's pipeline prompt is the native rows' prompt; the page checks that, id by id, and says where not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.core.bounds import MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES
from harness.prepare.gguf_export import BYTE_TOKENS, synthetic_pieces, token_id

TOKENIZER_FILE, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2 as the synthetic GGUF vocabulary has them


def tokenizer_files(folders: list[Path], config: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    """(tokenizer.json and tokenizer_config.json as served, where they came from): the first of `folders` that has
    a tokenizer.json, else the synthetic vocabulary of `config` (a spec's: vocab_size, bos/eos ids)."""
    from harness.prepare.folder_checks import read_file

    for folder in folders:
        if (folder / TOKENIZER_FILE).exists() or (folder / TOKENIZER_FILE).is_symlink():
            files = {TOKENIZER_FILE: read_file(folder, TOKENIZER_FILE, MAX_TOKENIZER_BYTES, TOKENIZER_FILE,
                                               "MAX_TOKENIZER_BYTES")}  # fmt: skip
            has_config = (folder / TOKENIZER_CONFIG).exists() or (folder / TOKENIZER_CONFIG).is_symlink()
            files[TOKENIZER_CONFIG] = (
                read_file(folder, TOKENIZER_CONFIG, MAX_CONFIG_BYTES, TOKENIZER_CONFIG, "MAX_CONFIG_BYTES")
                if has_config
                else b"{}"  # transformers.js requires the file; an empty config is its defaults
            )
            return files, "the model folder's tokenizer.json"
    size = int(config["vocab_size"])
    return synthetic(size, config.get("bos_token_id"), config.get("eos_token_id")), (
        f"synthetic: {size} single-character tokens, specials and byte tokens as added tokens (the model has none)"
    )


def synthetic_texts(size: int) -> list[str]:
    """Each id's text: the synthetic GGUF vocabulary's (harness.prepare.gguf_export._synthetic_vocabulary)."""
    texts = list(SPECIALS)
    if size >= len(texts) + BYTE_TOKENS:
        texts += [f"<0x{byte:02X}>" for byte in range(BYTE_TOKENS)]
    return (texts + synthetic_pieces(max(0, size - len(texts))))[:size]


def synthetic(size: int, bos: Any, eos: Any) -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json of the synthetic vocabulary of `size` ids."""
    texts = synthetic_texts(size)
    added = min(size, len(SPECIALS) + (BYTE_TOKENS if size >= len(SPECIALS) + BYTE_TOKENS else 0))
    added_tokens = [{"id": i, "content": texts[i], "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": i < len(SPECIALS)} for i in range(added)]  # fmt: skip
    model = {"type": "BPE", "dropout": None, "unk_token": SPECIALS[0], "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": {text: i for i, text in enumerate(texts)}, "merges": []}  # fmt: skip
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
                 "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": {"type": "Fuse"},
                 "model": model}  # fmt: skip
    bos_id, eos_id = token_id(bos, 1, size), token_id(eos, 2, size)
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
                "bos_token": texts[bos_id], "eos_token": texts[eos_id], "unk_token": SPECIALS[0],
                "clean_up_tokenization_spaces": False, "model_max_length": 1 << 20}  # fmt: skip
    return {TOKENIZER_FILE: json.dumps(tokenizer).encode(), TOKENIZER_CONFIG: json.dumps(settings).encode()}
