"""Speech input for Whisper (issue 35): a WAV read as data (bounded, mixed to mono, resampled) turned into the
model's own log-mel features; espeak-ng's passage as the default; --audio-seconds an axis of generate cases, the
same features natively and in the page, the real-time factor from the row's own times. One run of whisper-tiny
(native ORT and the page's wasm, two lengths, a few tokens) shares test_seq2seq.py's cached export."""

from __future__ import annotations

import json
import shutil
import struct
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli, run_cli_process
from test_web import web_cache  # noqa: F401 (the session's export cache)

from harness.core.bounds import MAX_AUDIO_SECONDS
from harness.prepare.audio import AudioError, espeak_speech, noise_speech, read_wav, speech_features, wav_speech

CHROMIUM = Path("/usr/bin/chromium").exists()
ESPEAK = shutil.which("espeak-ng") is not None
NO_ESPEAK = "espeak-ng is not installed (apt-get install espeak-ng, as `make setup`'s browser target does)"
QUICK = ("--iterations", "2", "--warmup", "0", "--min-duration", "0", "--new-tokens", "4", "--sequence-lengths", "8")
WHISPER = ("--mode", "generate", "--model", "whisper-tiny", "--no-reports")


def write_wav(path: Path, samples: np.ndarray, rate: int, width: int = 2) -> Path:
    """PCM samples [frames, channels] in [-1, 1] as a WAV of `width`-byte samples (the stdlib's writer)."""
    scaled = np.round(samples * (2 ** (8 * width - 1) - 1)).astype("<i4")
    raw = scaled.astype("<i2").tobytes() if width == 2 else b"".join(int(v).to_bytes(3, "little", signed=True)
                                                                      for v in scaled.ravel())  # fmt: skip
    with wave.open(str(path), "wb") as file:
        file.setnchannels(samples.shape[1])
        file.setsampwidth(width)
        file.setframerate(rate)
        file.writeframes(raw)
    return path


def tone(seconds: float, rate: int, hz: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave_ = 0.5 * np.sin(2 * np.pi * hz * t) * np.linspace(0.2, 1.0, t.size)  # a rising level: not periodic in time
    return np.repeat(wave_[:, None], channels, axis=1)


def test_features_from_a_wav_are_transformers_own_on_the_same_wav(tmp_path: Path) -> None:
    """16 kHz mono: the WAV's samples, read by scipy, through transformers' WhisperFeatureExtractor as a
    Whisper processor builds it give exactly our features; stereo is mixed to mono, 24-bit read as scipy does,
    and a 44.1 kHz tone resampled to 16 kHz keeps its pitch."""
    from scipy.io import wavfile
    from transformers import WhisperFeatureExtractor

    path = write_wav(tmp_path / "a.wav", tone(2.0, 16_000), 16_000)
    ours = speech_features(wav_speech(path), (2, 80, 3000))
    rate, ints = wavfile.read(path)
    theirs = WhisperFeatureExtractor()(ints / 32768.0, sampling_rate=rate, return_tensors="np")["input_features"]
    assert ours.shape == (2, 80, 3000) and np.allclose(ours, np.repeat(theirs, 2, axis=0), atol=1e-5)
    stereo = write_wav(tmp_path / "s.wav", tone(0.5, 16_000, channels=2) * [1.0, 0.5], 16_000)
    assert np.allclose(read_wav(stereo)[0], wavfile.read(stereo)[1].mean(axis=1) / 32768.0, atol=1e-6)
    deep = write_wav(tmp_path / "d.wav", tone(0.5, 16_000), 16_000, width=3)
    assert np.allclose(read_wav(deep)[0], wavfile.read(deep)[1] / 2.0**31, atol=1e-7)
    high = wav_speech(write_wav(tmp_path / "h.wav", tone(1.0, 44_100, hz=1000.0), 44_100))
    spectrum = np.abs(np.fft.rfft(high.samples))
    assert high.seconds == pytest.approx(1.0, abs=1e-3) and np.argmax(spectrum) * 16_000 / high.samples.size == 1000


def bad_wavs(folder: Path) -> dict[str, tuple[Path, str]]:
    """A truncated file, one whose header says 0 channels, one whose header promises 2^31 frames: each with
    the words its refusal must say."""
    good = write_wav(folder / "good.wav", tone(0.5, 16_000), 16_000).read_bytes()
    truncated = folder / "truncated.wav"
    truncated.write_bytes(good[: len(good) // 2])
    channels = folder / "channels.wav"
    channels.write_bytes(good[:22] + struct.pack("<H", 0) + good[24:])  # fmt chunk: its channel count
    huge = folder / "huge.wav"
    huge.write_bytes(good[:40] + struct.pack("<I", 2**32 - 2) + good[44:])  # the data chunk's size
    return {"truncated": (truncated, "truncated"), "channels": (channels, "channels"),
            "huge": (huge, "frames at 16,000 Hz")}  # fmt: skip


@pytest.mark.parametrize("kind", ["truncated", "channels", "huge"])
def test_a_bad_wav_is_refused_by_its_header(tmp_path: Path, kind: str) -> None:
    path, words = bad_wavs(tmp_path)[kind]
    with pytest.raises(AudioError, match=words):
        read_wav(path)


def test_a_bad_wav_or_a_length_past_the_window_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "none.duckdb"
    path, _ = bad_wavs(tmp_path)["truncated"]
    output = ["--output-dir", str(tmp_path / "o")]
    refused = run_cli_process("native", *WHISPER, "--audio", str(path), "--db", str(db), *output)
    assert refused.returncode == 2 and "--audio truncated.wav: truncated" in refused.stderr + refused.stdout
    assert "Traceback" not in refused.stderr and not db.exists()
    # the other two through the same app in this process: the first proved a refusal exits without a traceback
    longer = run_cli("native", *WHISPER, "--audio-seconds", f"5,{MAX_AUDIO_SECONDS + 1}", "--db", str(db))
    text = longer.stderr + longer.stdout
    assert longer.returncode == 2 and f"--audio-seconds takes whole numbers from 1 to {MAX_AUDIO_SECONDS}" in text
    assert "Traceback" not in longer.stderr and not db.exists()
    other = run_cli("native", "--model", "bert-tiny", "--audio", str(tmp_path / "good.wav"), "--db", str(db))
    assert other.returncode == 2 and "bert-tiny takes no speech" in other.stderr + other.stdout and not db.exists()
    # issue 45: --transcript is the words of a --audio file, UTF-8 text with words in it
    (tmp_path / "t.txt").write_bytes(b"\xff\xfe\x00 not text")
    alone = run_cli("native", *WHISPER, "--transcript", str(tmp_path / "t.txt"), "--db", str(db))
    assert alone.returncode == 2 and "give the WAV with --audio too" in alone.stderr + alone.stdout
    binary = run_cli("native", *WHISPER, "--audio", str(tmp_path / "good.wav"), "--transcript", str(tmp_path / "t.txt"),
                     "--db", str(db))  # fmt: skip
    assert binary.returncode == 2 and "--transcript t.txt: not UTF-8 text" in binary.stderr + binary.stdout
    assert not db.exists()


def test_a_length_past_a_models_own_window_is_refused() -> None:
    """The option's bound is Whisper's 30 s; a model whose encoder hears less (max_source_positions 750: 15 s)
    refuses a length past its own window, naming it."""
    from dataclasses import replace

    from harness.core.options import RequestError
    from harness.prepare.specs import select_specs
    from harness.run.plan import check_audio_seconds

    (spec,) = select_specs(["whisper-tiny"], None, False)
    check_audio_seconds([spec], [5, 30])
    narrow = replace(spec, name="whisper-narrow", config=spec.config | {"max_source_positions": 750})
    with pytest.raises(RequestError, match=r"whisper-narrow hears at most 15 s \(its encoder's window\): "
                                           r"--audio-seconds 20 is longer; give 1 to 15"):  # fmt: skip
        check_audio_seconds([narrow], [5, 20])


def test_without_espeak_ng_the_input_is_noise_and_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no espeak-ng on it
    assert espeak_speech(tmp_path) is None
    assert noise_speech().source.startswith("synthetic white noise, not speech: espeak-ng is not on PATH")


@pytest.fixture(scope="module")
def rows(web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], dict[str, Any]]:  # noqa: F811
    """whisper-tiny on native ORT CPU and the page's wasm at 5 and 30 s of espeak-ng's passage, one run; the page
    of the 5 s case is fed the whole window (the planted WINDOW_AUDIO_FAULT), the 30 s case's its own."""
    from harness.browser.run import WINDOW_AUDIO_FAULT

    if not (ESPEAK and CHROMIUM):
        pytest.skip(NO_ESPEAK if not ESPEAK else "needs Chromium at /usr/bin/chromium")
    out = tmp_path_factory.mktemp("audio")
    db, fault = out / "a.duckdb", {"ACCELHARNESS_INJECT_FAULT": f"{WINDOW_AUDIO_FAULT}:5"}
    done = run_cli("run", *WHISPER, "--engines", "onnxruntime", "--hardware", "cpu", "--web-hardware", "wasm",
                   "--audio-seconds", "5,30", *QUICK, "--db", str(db), "--output-dir", str(out / "r"),
                   env=fault)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {(r["engine"], r["audio_seconds"]): r for r in _results(db)}


def _results(db: Path) -> list[dict[str, Any]]:
    """Every row of the store, details parsed, with its timed generations' times (ms)."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as connection:
        cursor = connection.execute("SELECT * FROM results")
        names = [d[0] for d in cursor.description]
        found = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for row in found:
            query = "SELECT latency_ms FROM samples WHERE result_id = ? ORDER BY iteration"
            row["samples_ms"] = [ms for (ms,) in connection.execute(query, [row["result_id"]]).fetchall()]
    return [r | {"details": json.loads(r["details"])} for r in found]


def test_each_audio_length_is_a_case_with_its_length_and_real_time_factor(rows: dict) -> None:
    from harness.core.labels import case_label

    engines = ("onnxruntime", "onnxruntime-web")
    assert sorted(rows) == [(engine, seconds) for engine in engines for seconds in (5, 30)]
    for (engine, seconds), row in rows.items():
        assert case_label(row) == f"b1 s8 tg4 @ d0 @ {seconds} s audio"
        details = row["details"]
        assert details["audio_seconds"] == seconds and details["audio_input"].startswith("espeak-ng (")
        assert details["audio_input"].endswith(f"trimmed to {seconds} s")  # a 35 s passage
        total_ms = float(np.median(row["samples_ms"]))  # the encoder's and every decoder step's, per generation
        assert row["real_time_factor"] == pytest.approx(seconds * 1000.0 / total_ms)
        assert 0 < row["encoder_ms"] <= row["ttft_ms"] < total_ms + 1e-6
        if (engine, seconds) == ("onnxruntime-web", 5):
            continue  # the planted fault's row
        assert row["status"] == "ok", row["error"]
        if engine == "onnxruntime-web":  # the page's tokens and prefill logits: native ORT's on the case's features
            assert details["token_parity"].startswith("all 4 tokens"), details["token_parity"]
        # issue 45: the built-in spec's own word-level tokenizer (harness.prepare.spec_tokenizer) makes every row's
        # tokens text, and the text a WER against the passage; equal tokens, equal WER (the planted row: below)
        assert isinstance(details["wer"], float) and row["output_text"] and details["tokenizer"].startswith("built in")
        assert details["wer_words"].startswith("the reference's first ") and "wer_not_measured" not in details
    assert rows["onnxruntime-web", 30]["details"]["wer"] == rows["onnxruntime", 30]["details"]["wer"]


def test_word_error_rate_counts_a_planted_word_against_the_passage() -> None:
    """One word of the passage's first N changed: WER 1/N against the prefix the text covers (a row writes
    --new-tokens tokens), after Whisper's normalization (case, punctuation, special tokens, numbers)."""
    from harness.prepare.audio import PASSAGE
    from harness.prepare.wer import ESPEAK_REFERENCE, Reference, normalizer, speech_reference, wer_fields, word_errors

    words = PASSAGE.split()[:20]
    planted = ["<|startoftranscript|><|en|>", *words[:5], "SLOWLY", *words[6:]]  # "fast" heard as "slowly"
    found = word_errors(PASSAGE, " ".join(planted), normalizer(None)[0])
    assert found is not None and (found.wer, found.words, found.substitutions) == (1 / 20, 20, 1)
    assert found.deletions == found.insertions == 0 and found.total == len(normalizer(None)[0](PASSAGE).split())
    said = word_errors("I counted 30 colours.", "i counted thirty colours", normalizer(None)[0])
    assert said is not None and said.wer == 0.0  # numbers as Whisper's normalizer writes them
    silent = word_errors(PASSAGE, "<|startoftranscript|> <|endoftext|>", normalizer(None)[0])  # only special tokens
    assert silent is not None and (silent.wer, silent.deletions, silent.hypothesis) == (1.0, 1, "")
    facts = wer_fields([" ".join(words)], speech_reference("espeak", None, None), None)
    assert facts["wer"] == 0.0 and facts["wer_reference"] == ESPEAK_REFERENCE and "wer_batch_rows" not in facts
    assert wer_fields(["x"], speech_reference("noise", None, None), None)["wer_not_measured"].startswith("the input")
    assert wer_fields(None, Reference("a b", "t"), None)["wer_not_measured"].startswith("no decoded text")


def test_a_rows_wer_beside_native_orts_says_whether_the_tokens_differ() -> None:
    """The report's WER cell: native ORT's own; another row's "= native ORT" where equal, else native ORT's figure
    and whether the tokens differ (the planted row: one token changed, its WER too)."""
    from harness.report.generation import wer_text

    case = {"model": "m", "batch_size": 1, "seq_len": 8, "precision": "fp32", "mode": "generate", "new_tokens": 4,
            "depth": 0, "audio_seconds": None}  # fmt: skip
    native = case | {"engine": "onnxruntime", "provider": "CPUExecutionProvider", "generated_tokens": "[[1, 2]]",
                     "details": {"wer": 0.5}}  # fmt: skip
    same = case | {"engine": "torch", "provider": None, "generated_tokens": "[[1, 2]]", "details": {"wer": 0.5}}
    planted = same | {"generated_tokens": "[[1, 3]]", "details": {"wer": 1.0}}
    assert wer_text(native, [native, same]) == "0.500" and wer_text(same, [native, same]) == "0.500 (= native ORT)"
    assert wer_text(planted, [native, planted]) == "1.000 (native ORT 0.500: tokens differ)"


def test_a_built_in_specs_tokenizer_is_made_offline_from_its_vocabulary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """whisper-tiny's toml names the passage-words tokenizer: its config's ids are Whisper's special tokens, every
    id below vocab_size one token, made in the cache with no hub; a toml naming another is refused."""
    from harness.prepare.prompts import decode
    from harness.prepare.spec_tokenizer import spec_tokenizer, vocabulary
    from harness.prepare.specs import SpecError, parse_spec_file, select_specs

    monkeypatch.setenv("ACCELHARNESS_CACHE_DIR", str(tmp_path))
    (spec,) = select_specs(["whisper-tiny"], None, False)
    tokens = vocabulary(spec.config["vocab_size"], spec.config)
    assert len(tokens) == len(set(tokens)) == 1000 and tokens[:4] == ["<|endoftext|>", "<|startoftranscript|>",
                                                                    "the", "harness"]  # fmt: skip
    folder = spec_tokenizer(spec)
    assert folder is not None and folder.is_relative_to(tmp_path)  # the cache
    assert decode(folder, [[1, 2, 3, 999, 0]]) == [f"<|startoftranscript|> the harness {tokens[999]} <|endoftext|>"]
    toml = Path("models/whisper.toml").read_text().replace('"passage-words"', '"gpt2"')
    with pytest.raises(SpecError, match="tokenizer 'gpt2' is not one of passage-words"):
        parse_spec_file(Path("whisper.toml"), toml)


def test_a_transcript_is_the_reference_of_a_given_wav(tmp_path: Path) -> None:
    from harness.prepare.wer import speech_reference

    wav, text = tmp_path / "talk.wav", tmp_path / "talk.txt"
    text.write_text("Hello there, world.\n", encoding="utf-8")
    given = speech_reference("wav", wav, text)
    assert given.text == "Hello there, world.\n" and given.source == "--transcript talk.txt (of talk.wav)"
    assert speech_reference("wav", wav, None).source == "no --transcript was given for --audio talk.wav"


def test_the_page_fed_the_window_for_a_5_s_case_is_a_mismatch(rows: dict) -> None:
    """The planted input bug (WINDOW_AUDIO_FAULT): the page of the 5 s case hears the whole 30 s window while
    its row is checked against native ORT on the case's 5 s: its prefill logits and every step's top-k leave
    native's tolerance."""
    row = rows["onnxruntime-web", 5]
    assert row["status"] == "mismatch", row["error"]
    assert row["error"].startswith("max_abs_diff") and "a top-8 logit differs from native ORT's" in row["error"]
