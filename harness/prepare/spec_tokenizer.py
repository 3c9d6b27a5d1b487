"""A built-in spec's own tokenizer, where its toml names one (`tokenizer = "passage-words"`): a word-level
tokenizer.json made offline with the tokenizers library, no hub. A tiny spec's weights are random and it has no
tokenizer of its own, so its tokens had no text and a speech row no WER; with this one every row's tokens decode to
words (random weights write random words: a WER near 1 or above, a true measurement of them).

Its vocabulary has the spec's vocab_size entries, id by id: the special tokens the config's ids name (its
decoder start `<|startoftranscript|>`, its EOS, BOS and pad `<|endoftext|>`, as Whisper's tokenizer names them),
then the words of the passage the speech rows speak (harness.prepare.audio.PASSAGE, lower case, each once), then
made-up two-syllable words to fill. Written once into the cache, named by its content's digest.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from harness.prepare.cache import cache_root

TOKENIZER_FILE = "tokenizer.json"  # the file harness.prepare.prompts reads from a model folder
VERSION = 1  # of how the vocabulary is made: a change writes a new file, never over an older one's name
DESCRIBED = (f"built in (passage-words v{VERSION}): a word-level tokenizer.json made offline, the config's special "
             "tokens, the speech passage's words, then made-up words (no hub; the weights are random)")  # fmt: skip
SPECIALS = (("decoder_start_token_id", "<|startoftranscript|>"), ("eos_token_id", "<|endoftext|>"),
            ("bos_token_id", "<|endoftext|>"), ("pad_token_id", "<|endoftext|>"))  # fmt: skip
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # made-up words: two of these, e.g. "bada"


def spec_tokenizer(spec: Any) -> Path | None:
    """The folder holding the spec's built-in tokenizer.json (made on first use), None where the spec names none."""
    if getattr(spec, "tokenizer", None) is None:
        return None
    text = _tokenizer_json(int(spec.config["vocab_size"]), spec.config)
    folder = cache_root() / "tokenizers" / f"{spec.tokenizer}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if not (folder / TOKENIZER_FILE).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=folder, prefix=f".{TOKENIZER_FILE}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(temp, folder / TOKENIZER_FILE)  # two preparers of one model never read half a file
        finally:
            Path(temp).unlink(missing_ok=True)
    return folder


def vocabulary(size: int, config: dict[str, Any]) -> list[str]:
    """The token of every id below `size` (module docstring)."""
    from harness.prepare.audio import PASSAGE

    tokens: dict[int, str] = {}
    for key, token in SPECIALS:
        value = config.get(key)
        if isinstance(value, int) and 0 <= value < size and token not in tokens.values():
            tokens.setdefault(value, token)
    words = list(dict.fromkeys(re.findall(r"[a-z]+", PASSAGE.lower())))
    made_up = (a + b for a in SYLLABLES for b in SYLLABLES if a + b not in words)
    fill = iter(words + [word for word, _ in zip(made_up, range(size), strict=False)])
    return [tokens[i] if i in tokens else next(fill) for i in range(size)]


def _tokenizer_json(size: int, config: dict[str, Any]) -> str:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tokens = vocabulary(size, config)
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(tokens)}, unk_token=tokens[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in dict.fromkeys(t for _, t in SPECIALS)
                                  if t in tokens])  # fmt: skip
    return tokenizer.to_str()
