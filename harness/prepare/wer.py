"""Word error rate of a speech row: its decoded text against the text the audio speaks, both normalized the way
Whisper's English normalizer does, the edit counted by jiwer (a well-kept library, not a hand-written distance).

The reference is the passage the harness had espeak-ng speak (harness.prepare.audio.PASSAGE, versioned), or the
user's own transcript of a --audio file (--transcript). A row hears at most its case's seconds of the audio and
writes at most --new-tokens tokens, so its text covers a first part of the reference only: the WER is taken against
the reference's first k words, k the prefix with the fewest errors (the longest among equals), and the row says k
of how many. The normalizer is transformers' EnglishTextNormalizer (its port of openai/whisper's), with the model
folder's own British-to-American spelling map (normalizer.json, which Whisper's tokenizer files carry) where it has
one, else with none (the map is hub data, not part of transformers): the row says which (`wer_normalizer`).

The WER is a function of the decoded text alone: rows whose tokens are equal have equal WER, whatever ran them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from harness.core.bounds import MAX_CONFIG_BYTES, MAX_TRANSCRIPT_BYTES
from harness.prepare.audio import PASSAGE, PASSAGE_VERSION

SPELLING_FILE = "normalizer.json"  # Whisper's English spelling map, as its tokenizer files on the hub carry it
NORMALIZER = "Whisper's EnglishTextNormalizer (transformers.models.whisper.english_normalizer)"
STORED_CHARS = 4096  # characters of each normalized text a row keeps in its details (then …): the store bounds them
ESPEAK_REFERENCE = f"the harness's espeak-ng passage v{PASSAGE_VERSION}"


class TranscriptError(ValueError):
    """A --transcript file that cannot be used; the message says what was wrong and what is valid."""


@dataclass(frozen=True)
class Reference:
    """What a speech model's rows are scored against: the text, and where it comes from (`source`); text None
    where there is none, `source` then saying why (noise, a --audio file without --transcript)."""

    text: str | None
    source: str


def read_transcript(path: Path) -> str:
    """A --transcript file's text: a regular UTF-8 file of at most MAX_TRANSCRIPT_BYTES with words in it."""
    from harness.prepare.folder_checks import FolderError, read_regular

    try:
        data = read_regular(path, MAX_TRANSCRIPT_BYTES, "a --transcript file takes")
    except FolderError as exc:
        raise TranscriptError(str(exc)) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TranscriptError(f"not UTF-8 text (byte {exc.start:,}); a UTF-8 text file is valid") from None
    if not normalizer(None)[0](text).split():
        raise TranscriptError("no words in it (after Whisper's normalization); the words the audio speaks are valid")
    return text


def speech_reference(kind: str, audio: Path | None, transcript: Path | None) -> Reference:
    """The reference of a speech model's rows: the user's transcript of --audio, else espeak-ng's passage where
    the speech is it (`kind`: harness.prepare.audio.Speech.kind), else none and why."""
    if transcript is not None:
        name = Path(audio).name if audio is not None else "the audio"
        return Reference(read_transcript(Path(transcript)), f"--transcript {Path(transcript).name} (of {name})")
    if kind == "espeak":
        return Reference(PASSAGE, ESPEAK_REFERENCE)
    if kind == "noise":
        return Reference(None, "the input is synthetic white noise, not speech: no text to score against")
    name = Path(audio).name if audio is not None else "the audio"
    return Reference(None, f"no --transcript was given for --audio {name}")


@cache
def normalizer(folder: Path | None) -> tuple[Callable[[str], str], str]:
    """Whisper's English normalizer and its description: with `folder`'s normalizer.json spelling map where it has
    a readable one (a dict of word → word), else with none."""
    english = _english_normalizer_module().EnglishTextNormalizer
    spelling, why = _spelling_map(folder)
    if spelling:
        described = f"{NORMALIZER}, with the folder's {SPELLING_FILE} ({len(spelling):,} spellings)"
        return english(spelling), described
    return english({}), f"{NORMALIZER}, without a British-to-American spelling map ({why})"


def _english_normalizer_module() -> Any:
    """transformers' english_normalizer module: imported where transformers already is, else loaded from its file
    alone (it imports only re, unicodedata, fractions and regex): importing the transformers package costs a
    process that has not yet done so more than a second, once for every worker that builds a speech row."""
    name = "transformers.models.whisper.english_normalizer"
    if "transformers" in sys.modules:
        return importlib.import_module(name)
    found = importlib.util.find_spec("transformers")  # found, not imported
    assert found is not None and found.submodule_search_locations, "transformers is a dependency"
    path = Path(next(iter(found.submodule_search_locations))) / "models" / "whisper" / "english_normalizer.py"
    if not path.is_file():  # another layout of transformers: its own import, whatever it costs
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(f"_accelharness_{name.replace('.', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spelling_map(folder: Path | None) -> tuple[dict[str, str], str]:
    """A folder's normalizer.json as a spelling map, or {} and why there is none (it is data from elsewhere:
    read by the one reader of a folder's files, bounded, its entries strings)."""
    if folder is None:
        return {}, f"Whisper's {SPELLING_FILE} comes with the hub's tokenizer files; a built-in spec has none"
    if not (folder / SPELLING_FILE).exists():
        return {}, f"the model folder has no {SPELLING_FILE}"
    from harness.prepare.folder_checks import FolderError, inside, read_regular

    try:
        found = json.loads(read_regular(inside(folder, SPELLING_FILE, "the spelling map"), MAX_CONFIG_BYTES,
                                        "the harness reads"))  # fmt: skip
    except (FolderError, OSError, ValueError, RecursionError) as exc:
        return {}, f"the folder's {SPELLING_FILE} cannot be read: {str(exc)[:200]}"
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        return {}, f"the folder's {SPELLING_FILE} is not a map of words to words"
    return found, ""


@dataclass(frozen=True)
class WordErrors:
    """A hypothesis against the reference's first `words` of `total` words (normalized): its WER and the edits."""

    wer: float
    words: int
    total: int
    substitutions: int
    deletions: int
    insertions: int
    hypothesis: str
    reference: str


def word_errors(reference: str, hypothesis: str, normalize: Callable[[str], str]) -> WordErrors | None:
    """The hypothesis's WER against the reference's prefix with the fewest errors (the longest among equals); None
    where the normalized reference has no word. A hypothesis with none (the model wrote only special tokens) missed
    every word it could have heard: its fewest errors are the first word's deletion, WER 1, a measurement."""
    import jiwer

    heard, said = normalize(hypothesis).split(), normalize(reference).split()
    if not said:
        return None
    if not heard:
        return WordErrors(1.0, 1, len(said), 0, 1, 0, "", said[0])
    text = " ".join(heard)
    best: tuple[int, int, Any] | None = None
    for words in range(1, len(said) + 1):
        found = jiwer.process_words(" ".join(said[:words]), text)
        errors = found.substitutions + found.deletions + found.insertions
        if best is None or errors <= best[0]:
            best = (errors, words, found)
        if words - len(heard) > best[0]:  # every longer prefix has at least this many deletions: none can win
            break
    assert best is not None
    errors, words, found = best
    return WordErrors(errors / words, words, len(said), found.substitutions, found.deletions, found.insertions,
                      text, " ".join(said[:words]))  # fmt: skip


def wer_fields(texts: list[str] | None, reference: Reference, folder: Path | None) -> dict[str, Any]:
    """A speech row's WER facts for its details: `wer` (the first batch row's; every batch row hears the same clip,
    and `wer_batch_rows` lists each where their texts differ), `wer_reference` (its source), `wer_normalizer`,
    `wer_words` (how much of the reference), the edits and both normalized texts; or `wer` None and
    `wer_not_measured` saying why."""
    if reference.text is None:
        return {"wer": None, "wer_not_measured": reference.source}
    if not texts:
        return {"wer": None, "wer_not_measured": "no decoded text (details.output_text says why)"}
    normalize, described = normalizer(folder)
    scored = [word_errors(reference.text, text, normalize) for text in texts]
    first = scored[0]
    facts: dict[str, Any] = {"wer_reference": reference.source, "wer_normalizer": described}
    if first is None:
        return facts | {"wer": None, "wer_not_measured": "the reference has no words after normalization"}
    facts |= {
        "wer": first.wer,
        "wer_words": f"the reference's first {first.words:,} of {first.total:,} words (the prefix with the fewest "
        "errors: a row hears its case's seconds and writes --new-tokens tokens)",
        "wer_edits": dict(substitutions=first.substitutions, deletions=first.deletions, insertions=first.insertions),
        "wer_hypothesis": _cut(first.hypothesis),
        "wer_reference_text": _cut(first.reference),
    }
    if len(set(texts)) > 1:
        facts["wer_batch_rows"] = [None if s is None else s.wer for s in scored]
    return facts


def _cut(text: str) -> str:
    return text if len(text) <= STORED_CHARS else text[:STORED_CHARS] + "…"
