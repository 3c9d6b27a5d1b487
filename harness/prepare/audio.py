"""Speech input for Whisper: a spoken passage synthesized offline by espeak-ng, or a WAV the user gives
(--audio), turned into log-mel features by the model's own feature extractor (transformers'
WhisperFeatureExtractor, built from the graph's mel bins and frames: no hub).

A WAV from elsewhere is data: its size, channels, sample width, rate and duration are read from its header and
bounded (harness.core.bounds) before its samples are; it is mixed to mono and resampled to the extractor's rate.
A case's audio is the speech fitted to its length (trimmed, or padded with silence: --audio-seconds), which
the extractor pads to the encoder's window as Whisper's processor does. Without espeak-ng and without --audio
the input is seeded white noise, and every row says so (`audio_input`): never a pretended sentence.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import wave
from dataclasses import dataclass
from functools import cache
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.bounds import (
    MAX_AUDIO_BYTES,
    MAX_AUDIO_CHANNELS,
    MAX_AUDIO_FILE_SECONDS,
    MAX_AUDIO_RATE,
    MIN_AUDIO_RATE,
)

SAMPLING_RATE = 16_000  # Whisper's feature extractor: 16 kHz samples,
HOP_LENGTH = 160  # a log-mel frame every 160 samples (10 ms),
N_FFT = 400  # over a 25 ms window
# The passage espeak-ng speaks, versioned: a speech row's WER names the version it was measured against
# (harness.prepare.wer), so a changed passage is a new version, never silently compared with an older one.
PASSAGE_VERSION = 1
# The passage espeak-ng speaks: 35 s at its default rate, longer than Whisper's 30 s window, so that every
# --audio-seconds length up to the window is speech trimmed, not silence added.
PASSAGE = (
    "The harness measures how fast a model runs on each machine it is given. It reads a spoken passage, turns "
    "the sound into log mel features, and asks the model to write down what it heard. Every engine gets the "
    "same features, so the times can be compared. The encoder reads thirty seconds of audio at once, whatever "
    "the length of the speech, and the decoder then writes one token at a time until it has written as many as "
    "it was asked for. A faster machine finishes sooner; a slower one takes longer, and the report says by how "
    "much. This voice is not a person: it was synthesized offline, on the machine that ran the test."
)
VOICE = "en-us"
ESPEAK_TIMEOUT_S = 60.0
NOISE_SECONDS, NOISE_LEVEL = 35.0, 0.05  # the fallback: seeded white noise as long as the passage
SAMPLE_WIDTHS = (1, 2, 3, 4)  # bytes per PCM sample the wave module reads (8-bit unsigned, 16/24/32-bit signed)
# The fmt chunk's first fields: format tag, channels, rate, bytes per second, block_align, bits per sample.
FMT_FIELDS = struct.Struct("<HHIIHH")
PCM_TAGS = (0x0001, 0xFFFE)  # WAVE_FORMAT_PCM, WAVE_FORMAT_EXTENSIBLE (PCM inside): the others the wave module refuses
MAX_CHUNKS_BEFORE_FMT = 64  # chunks (JUNK, bext, LIST, …) walked past to the fmt chunk: a bound on a hostile file


class AudioError(ValueError):
    """A WAV that cannot be used; the message says what was wrong and what is valid."""


@dataclass(frozen=True)
class Speech:
    """The audio a speech model's cases are cut from: mono float samples at SAMPLING_RATE, what it is (for the
    rows' details) and a digest naming it in the case files' names (a new source: new case files)."""

    samples: np.ndarray
    source: str
    digest: str
    kind: str = "wav"  # "espeak" (PASSAGE spoken), "wav" (--audio) or "noise": what a row's WER is measured against

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLING_RATE


def read_wav(path: Path) -> tuple[np.ndarray, int, int]:
    """A PCM WAV's samples mixed to mono (float32 in [-1, 1]), its rate and its channel count; AudioError for a
    file that is not one, or whose header is outside the bounds or promises more than the file holds."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise AudioError(f"cannot read it ({exc.strerror or exc})") from None
    if not path.is_file():
        raise AudioError("not a file; a WAV file is valid")
    if size > MAX_AUDIO_BYTES:
        raise AudioError(f"a WAV file of at most {MAX_AUDIO_BYTES // 2**20} MiB is valid (got {size:,} bytes)")
    try:
        _check_frame(path)
        with wave.open(str(path), "rb") as file:
            channels, width, rate = file.getnchannels(), file.getsampwidth(), file.getframerate()
            frames = file.getnframes()
            _check_header(channels, width, rate, frames, size)
            data = file.readframes(frames)
    except (wave.Error, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, AudioError):
            raise
        raise AudioError(f"not a PCM WAV file the wave module reads ({str(exc)[:200] or type(exc).__name__})") from None
    if len(data) != frames * channels * width:
        held = len(data) // (channels * width)
        raise AudioError(f"truncated: its header gives {frames:,} frames, the file holds {held:,}")
    return _pcm(data, width).reshape(-1, channels).mean(axis=1, dtype=np.float32), rate, channels


def _fmt_fields(path: Path) -> tuple[int, int, int] | None:
    """A PCM WAV's (channels, block_align, bits per sample) as its fmt chunk writes them; None where the file is
    no RIFF WAVE, its fmt chunk is not PCM or cannot be found (the wave module then says what is wrong)."""
    with path.open("rb") as file:
        riff = file.read(12)
        if len(riff) < 12 or riff[:4] != b"RIFF" or riff[8:] != b"WAVE":
            return None
        for _ in range(MAX_CHUNKS_BEFORE_FMT):
            head = file.read(8)
            if len(head) < 8:
                return None
            length = int.from_bytes(head[4:], "little")
            if head[:4] == b"fmt ":
                body = file.read(FMT_FIELDS.size)
                if len(body) < FMT_FIELDS.size:
                    return None
                tag, channels, _, _, align, bits = FMT_FIELDS.unpack(body)
                return (channels, align, bits) if tag in PCM_TAGS else None
            file.seek(length + (length & 1), os.SEEK_CUR)  # a chunk's body is padded to an even length
    return None


def _check_frame(path: Path) -> None:
    """The header's sample width and frame size as it writes them, before the wave module reads it: wave rounds
    bits up to bytes (a 1-bit WAV read as 8-bit) and makes a frame channels × that width whatever block_align
    says (a 2-channel file of 3-byte frames read as 4-byte ones): samples nobody recorded, fed as speech."""
    fields = _fmt_fields(path)
    if fields is None:
        return
    channels, align, bits = fields
    _check_channels(channels)
    if bits not in [8 * width for width in SAMPLE_WIDTHS]:
        valid = ", ".join(str(8 * width) for width in SAMPLE_WIDTHS)
        raise AudioError(f"{bits}-bit samples; PCM of {valid} bits is valid")
    if align != channels * bits // 8:
        raise AudioError(f"frames of {align} bytes (block_align) for {channels} channels of {bits}-bit samples; "
                         f"{channels} × {bits // 8} = {channels * bits // 8} bytes is valid")  # fmt: skip


def _check_channels(channels: int) -> None:
    if not 1 <= channels <= MAX_AUDIO_CHANNELS:
        raise AudioError(f"{channels} channels; 1 to {MAX_AUDIO_CHANNELS} are valid")


def _check_header(channels: int, width: int, rate: int, frames: int, size: int) -> None:
    """The header's facts within the bounds, before a sample is read."""
    _check_channels(channels)
    if width not in SAMPLE_WIDTHS:
        raise AudioError(f"{width}-byte samples; PCM of {', '.join(map(str, SAMPLE_WIDTHS))} bytes is valid")
    if not MIN_AUDIO_RATE <= rate <= MAX_AUDIO_RATE:
        raise AudioError(f"a rate of {rate:,} Hz; {MIN_AUDIO_RATE:,} to {MAX_AUDIO_RATE:,} Hz is valid")
    if not 0 < frames <= MAX_AUDIO_FILE_SECONDS * rate:
        raise AudioError(f"{frames:,} frames at {rate:,} Hz; 1 frame to {MAX_AUDIO_FILE_SECONDS} s is valid")
    if frames * channels * width > size:
        raise AudioError(f"truncated: its header gives {frames:,} frames, more than its {size:,} bytes hold")


def _pcm(data: bytes, width: int) -> np.ndarray:
    """Little-endian PCM samples as float32 in [-1, 1] (WAV's 8-bit samples are unsigned)."""
    if width == 1:
        return (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 3:  # 24-bit: each sample's three bytes placed high in an int32, the sign kept
        raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        value = (raw[:, 0] << 8 | raw[:, 1] << 16 | raw[:, 2] << 24).astype(np.int32)
        return value.astype(np.float32) / 2.0**31
    kind = np.dtype(f"<i{width}")
    return np.frombuffer(data, dtype=kind).astype(np.float32) / float(2 ** (8 * width - 1))


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """Samples at `rate` resampled to SAMPLING_RATE (polyphase, with its anti-aliasing filter)."""
    if rate == SAMPLING_RATE:
        return samples.astype(np.float32)
    from scipy.signal import resample_poly

    common = gcd(rate, SAMPLING_RATE)
    return resample_poly(samples, SAMPLING_RATE // common, rate // common).astype(np.float32)


def wav_speech(path: Path) -> Speech:
    """A --audio file as the speech its cases are cut from."""
    samples, rate, channels = read_wav(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    mono = "" if channels == 1 else f", {channels} channels mixed to mono"
    source = f"--audio {path.name}: {len(samples) / rate:.2f} s at {rate:,} Hz{mono}"
    return Speech(resample(samples, rate), source, f"w{digest}")


def espeak_speech(folder: Path) -> Speech | None:
    """PASSAGE spoken by espeak-ng (synthesized once into `folder`), or None where espeak-ng is not on PATH."""
    binary = shutil.which("espeak-ng")
    if binary is None:
        return None
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=ESPEAK_TIMEOUT_S).stdout
    digest = hashlib.sha256(f"{PASSAGE}|{VOICE}|{version.strip()}".encode()).hexdigest()[:16]
    wav = folder / f"espeak-{digest}.wav"
    if not wav.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = wav.with_name(f".{wav.name}.{os.getpid()}.tmp")  # two preparers at once: each its own
        subprocess.run([binary, "-v", VOICE, "-w", str(partial), PASSAGE], check=True, capture_output=True,
                       timeout=ESPEAK_TIMEOUT_S)  # fmt: skip
        partial.replace(wav)
    samples, rate, _ = read_wav(wav)
    source = f"espeak-ng ({version.split('Data')[0].strip()}, voice {VOICE}): a passage of {len(samples) / rate:.2f} s"
    return Speech(resample(samples, rate), source, f"e{digest}", "espeak")


def noise_speech() -> Speech:
    """The fallback: seeded white noise, said to be what it is."""
    rng = np.random.default_rng(0)
    samples = (NOISE_LEVEL * rng.standard_normal(int(NOISE_SECONDS * SAMPLING_RATE))).astype(np.float32)
    why = "synthetic white noise, not speech: espeak-ng is not on PATH and no --audio file was given"
    return Speech(samples, why, "noise0", "noise")


@cache
def speech_input(audio: Path | None) -> Speech:
    """The speech a run's speech cases are cut from: the --audio file, else espeak-ng's passage, else noise."""
    if audio is not None:
        return wav_speech(Path(audio))
    from harness.prepare.cache import cache_root

    return espeak_speech(cache_root() / "speech") or noise_speech()


def window_seconds(frames: int) -> float:
    """The seconds of audio an encoder window of `frames` log-mel frames covers (Whisper: 3000 frames, 30 s)."""
    return frames * HOP_LENGTH / SAMPLING_RATE


def fit(samples: np.ndarray, seconds: float) -> np.ndarray:
    """The samples trimmed, or padded with silence, to `seconds`."""
    wanted = round(seconds * SAMPLING_RATE)
    return np.pad(samples[:wanted], (0, max(0, wanted - len(samples))))


def log_mel(samples: np.ndarray, mel_bins: int, frames: int) -> np.ndarray:
    """The model's own log-mel features of 16 kHz samples, [1, mel_bins, frames]: transformers'
    WhisperFeatureExtractor built for this window (it pads the audio to it with silence)."""
    from transformers import WhisperFeatureExtractor

    if (frames * HOP_LENGTH) % SAMPLING_RATE:
        raise ValueError(f"an encoder window of {frames} frames is not a whole number of seconds at a 10 ms hop")
    extractor = WhisperFeatureExtractor(feature_size=mel_bins, sampling_rate=SAMPLING_RATE, hop_length=HOP_LENGTH,
                                        chunk_length=frames * HOP_LENGTH // SAMPLING_RATE, n_fft=N_FFT)  # fmt: skip
    features = extractor(samples, sampling_rate=SAMPLING_RATE, return_tensors="np")["input_features"]
    return np.asarray(features, dtype=np.float32)


def speech_features(speech: Speech, shape: tuple[int, ...], seconds: float | None = None) -> np.ndarray:
    """input_features of `shape` ([batch, mel bins, frames]): the speech fitted to `seconds` (None: the
    window), the same clip in every batch row."""
    batch, mel_bins, frames = shape
    clip = fit(speech.samples, window_seconds(frames) if seconds is None else seconds)
    return np.repeat(log_mel(clip, mel_bins, frames), batch, axis=0)


def describe(source: str, own_seconds: float, seconds: float) -> str:
    """What a case's audio is, for its row: the source, and the length it was fitted to."""
    how = "trimmed" if own_seconds > seconds else "padded with silence"
    return f"{source}; {how} to {seconds:g} s"


@cache
def takes_log_mel(encoder: Path) -> bool:
    """Whether an ONNX encoder (a folder's, given by --model-path) reads Whisper's log-mel features: a 3-D
    `input_features` [batch, mel bins, frames] (its proto read without weights, once per file)."""
    import onnx

    for value in onnx.load(str(encoder), load_external_data=False).graph.input:
        if value.name == "input_features":
            return len(value.type.tensor_type.shape.dim) == 3
    return False


WHISPER_POSITIONS = 1500  # WhisperConfig's default max_source_positions: 3000 frames, a 30 s window


def speech_window(spec: Any) -> float:
    """The seconds a speech model's encoder hears at once: 2 × max_source_positions frames (Whisper's conv
    stride halves the frames), from the spec's config."""
    positions = spec.config.get("max_source_positions", WHISPER_POSITIONS)
    return window_seconds(2 * positions)
