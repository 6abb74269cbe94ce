"""Reading and writing audio files: the one place a clip on disk becomes a clean float32 array.

Why every failure becomes an ``AudioError`` with the file name and a fix: a dataset
of 100k clips always holds a few broken ones, and "LibsndfileError: Format not
recognised" with no path costs the user an afternoon. The CLI prints these as one line.

The rules for clips that decode but are wrong (each rejection names the file, what was
measured and the fix; ``prepare`` lists them in ``report.json``, ``inspect-data`` lists
the header ones):

- truncated: a WAV whose data chunk declares more frames than the file holds (a copy or
  download cut short) is rejected (``TRUNCATED_AUDIO``) with how much is missing; keeping
  the part that is there would pair half the audio with the whole transcript.
- out of range: samples beyond +-``MAX_FLOAT_PEAK`` (float files) mean the file is scaled
  wrong (integer values written as float); rejected (``OUT_OF_RANGE_AUDIO``). A peak between
  1 and ``MAX_FLOAT_PEAK`` is scaled down to full scale, with a warning naming the file.
- DC offset: a mean beyond +-``MAX_DC_OFFSET`` of full scale is a broken recording chain;
  rejected (``DC_OFFSET``): the fix is a high-pass filter before prepare.
- clipping: ``MAX_CLIPPED_FRACTION`` or more of the samples in flat runs at the clip's peak
  is hard clipping, distortion the model would learn; rejected (``CLIPPED_AUDIO``).
- phase-inverted channels: a multi-channel clip whose channels cancel when averaged is not
  silent; its loudest channel is used alone and a warning names the file.

The two fixes (``SCALED_AUDIO``, ``ONE_CHANNEL``) are logged, or, where the caller passes a
``notes`` list (``prepare``), recorded there so the report lists every clip kept after a fix.

This module deliberately does not import torch, so data readers and worker processes
that only need to load or inspect audio stay light.
"""

from __future__ import annotations

import io
import logging
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np
import soundfile as sf
import soxr

from myxtts.audio.processing import (
    SILENT_PEAK_DBFS,
    clipped_fraction,
    dc_offset,
    is_silent,
    normalize_loudness,
    peak_dbfs,
    trim_silence,
)
from myxtts.config import AudioConfig
from myxtts.system import atomic_write, path_kind

# Why a clip cannot be used, as a short stable category (reports count clips by it).
UNREADABLE_AUDIO = "unreadable audio"
WRONG_SAMPLE_RATE = "wrong sample rate"
SILENT_AUDIO = "silent audio"
TRUNCATED_AUDIO = "truncated audio"
OUT_OF_RANGE_AUDIO = "out-of-range audio"
DC_OFFSET = "DC offset"
CLIPPED_AUDIO = "clipped audio"
# What was done to a clip that is kept (the same report, under "fixed").
SCALED_AUDIO = "scaled down to full scale"
ONE_CHANNEL = "one channel of cancelling channels"

# Limits of the module doc's rules.
MAX_FLOAT_PEAK = 2.0  # 6 dB over full scale
MAX_DC_OFFSET = 0.1  # mean sample, as a fraction of full scale (-20 dBFS)
MAX_CLIPPED_FRACTION = 0.01

log = logging.getLogger(__name__)

# 16-bit PCM from float audio: sample x in [-1, 1] becomes clip(round(x * PCM16_SCALE)), and
# int16 samples divide by it to come back (the store's audio, raw PCM on stdout).
PCM16_SCALE = 32767.0


class AudioError(ValueError):
    """A clip cannot be used: unreadable, truncated, empty, non-finite, silent, out of range,
    offset, clipped or at the wrong rate.

    ``reason`` is the category (``UNREADABLE_AUDIO``, ``WRONG_SAMPLE_RATE``,
    ``SILENT_AUDIO``, ``TRUNCATED_AUDIO``, ...), set where the error is raised; the message
    names file and fix.
    """

    def __init__(self, message: str, reason: str = UNREADABLE_AUDIO) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple:  # keep the reason across processes (prepare's workers)
        return type(self), (str(self), self.reason)


class AudioInfo(NamedTuple):
    """What the file header says, without decoding the samples."""

    sample_rate: int
    n_samples: int
    channels: int
    duration_s: float


Notes = list  # of {"reason": SCALED_AUDIO or ONE_CHANNEL, "detail": message}


def _fixed(notes: Notes | None, reason: str, message: str) -> None:
    """A fix made to a kept clip: into ``notes`` when the caller collects them, else logged."""
    if notes is None:
        log.warning("%s", message)
    else:
        notes.append({"reason": reason, "detail": message})


_FIX_BROKEN = "re-export it as WAV/FLAC/OGG or remove it from the dataset"


def _check_exists(path: Path) -> None:
    """A regular file at ``path``, checked without opening it (a FIFO would block)."""
    kind = path_kind(path)
    if kind == "nothing":
        raise AudioError(f"{path}: audio file does not exist; check the path in the dataset metadata")
    if kind != "a file":
        raise AudioError(f"{path}: is {kind}, not a file; point the dataset metadata at an "
                         f"audio file")


def _reason(err: Exception, path: Path) -> str:
    """Why libsndfile could not open ``path``: its own words ("Format not recognised")
    without its repeat of the path -- except where they mislead about a regular file: an
    empty one, or one it says "does not exist or is not a regular file (possibly a pipe?)"
    (its words for a file whose format it cannot even guess, such as a damaged MP3)."""
    text = " ".join(str(getattr(err, "error_string", None) or err).split())
    try:
        size = path.stat().st_size
    except OSError:
        return text
    if size == 0:
        return "the file is empty: 0 bytes, a copy or download that never finished"
    if "possibly a pipe" in text:
        return f"the format of its {size} bytes is not recognised"
    return text


def is_wav_file(path: str | Path) -> bool:
    """``path`` starts as a WAV file does (RIFF/RF64 ... WAVE): what ``synthesize`` may
    replace."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
    except OSError:
        return False
    return head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE"


def _wav_shortfall(path: Path) -> tuple[int, int] | None:
    """``(declared frames, frames missing)`` when ``path`` is a RIFF/WAVE file whose data
    chunk declares more bytes than the file holds; None otherwise (other formats, a size
    left open by a streaming writer: 0 or 0xFFFFFFFF, anything unparsable)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            file_size = path.stat().st_size
            block_align = 0
            for _ in range(64):  # chunks before "data": fmt, fact, LIST, ... never many
                chunk = fh.read(8)
                if len(chunk) < 8:
                    return None
                cid, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
                start = fh.tell()
                if cid == b"fmt " and size >= 14:
                    block_align = struct.unpack("<H", fh.read(14)[12:14])[0]
                elif cid == b"data":
                    have = file_size - start
                    if size in (0, 0xFFFFFFFF) or size <= have or block_align <= 0:
                        return None
                    return size // block_align, (size - have) // block_align
                fh.seek(start + size + (size & 1))
    except (OSError, struct.error):
        return None
    return None


def _check_complete(path: Path, sample_rate: int) -> None:
    short = _wav_shortfall(path)
    if short is not None:
        declared, missing = short
        raise AudioError(
            f"{path}: truncated: the header declares {declared} frames "
            f"({declared / sample_rate:.2f} s) but {missing} ({missing / sample_rate:.2f} s, "
            f"{100 * missing / declared:.0f}%) are missing from the file; copy or export it "
            f"again, or remove it from the dataset", TRUNCATED_AUDIO)


def audio_info(path: str | Path) -> AudioInfo:
    """Header-only facts about a clip (fast: no samples are decoded)."""
    path = Path(path)
    _check_exists(path)
    try:
        info = sf.info(str(path))
    except (sf.SoundFileError, RuntimeError, OSError, ValueError, TypeError) as e:
        raise AudioError(f"{path}: cannot read audio header ({_reason(e, path)}); {_FIX_BROKEN}") from e
    sample_rate, n_samples = int(info.samplerate), int(info.frames)
    if sample_rate <= 0:
        raise AudioError(f"{path}: header gives sample rate {sample_rate}; {_FIX_BROKEN}")
    _check_complete(path, sample_rate)
    return AudioInfo(sample_rate, n_samples, int(info.channels), n_samples / sample_rate)


def _pcm16_to_float(data: np.ndarray) -> np.ndarray:
    """int16 [T, C] -> float32 [T, C] in [-1, 1), as libsndfile scales it (x / 32768)."""
    out = np.empty(data.shape, np.float32)
    np.multiply(data, np.float32(1.0 / 32768.0), out=out)
    return out


def read_audio(path: str | Path, notes: Notes | None = None) -> tuple[np.ndarray, int]:
    """Decode a clip as mono float32 at its own rate; errors for unreadable/empty/non-finite.

    Multi-channel audio is mixed down by averaging channels (not by taking the first:
    some recorders put the voice on one side only), unless the channels cancel (the module
    doc); a truncated WAV is an error. ``notes``: see the module doc.
    """
    path = Path(path)
    _check_exists(path)
    try:
        with sf.SoundFile(str(path)) as f:
            sample_rate = f.samplerate
            is_pcm16 = f.subtype == "PCM_16"
            if is_pcm16:
                # The common case (LJSpeech, most corpora). libsndfile's own int->float
                # conversion measures ~2x slower than reading int16 and scaling in
                # numpy; the values are identical (x / 32768 is exact in float32).
                data = _pcm16_to_float(f.read(dtype="int16", always_2d=True))  # [T, C]
            else:
                data = f.read(dtype="float32", always_2d=True)  # [T, C]
    except (sf.SoundFileError, RuntimeError, OSError, ValueError, TypeError, EOFError) as e:
        raise AudioError(f"{path}: cannot decode audio ({_reason(e, path)}); {_FIX_BROKEN}") from e
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise AudioError(f"{path}: clip has zero samples; {_FIX_BROKEN}")
    _check_complete(path, int(sample_rate))
    # Integer PCM cannot hold NaN/inf; float files can (and corrupt ones do). A finite sum
    # proves every sample finite without a clip-sized temporary; only a non-finite sum
    # (or a huge one that overflowed) needs the sample-by-sample count.
    if not is_pcm16 and not np.isfinite(data.sum()) and not np.isfinite(data).all():
        n_bad = int(data.size - np.count_nonzero(np.isfinite(data)))
        raise AudioError(f"{path}: {n_bad} samples are NaN or infinite (corrupt float audio); "
                         f"{_FIX_BROKEN}")
    wav = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]  # [T]
    if data.shape[1] > 1:
        wav = _uncancelled(path, data, wav, notes)
    return np.ascontiguousarray(wav, dtype=np.float32), int(sample_rate)


def _uncancelled(path: Path, data: np.ndarray, mix: np.ndarray, notes: Notes | None
                 ) -> np.ndarray:
    """``mix`` unless averaging the channels of ``data`` [T, C] lost more than 20 dB of the
    loudest channel's peak (phase-inverted channels cancel): then that channel alone."""
    channel_peak = np.max(np.abs(data), axis=0)  # [C]
    loudest = int(np.argmax(channel_peak))
    mix_peak = max(float(np.max(mix)), -float(np.min(mix)))
    if channel_peak[loudest] == 0.0 or mix_peak >= 0.1 * float(channel_peak[loudest]):
        return mix
    drop = 20.0 * np.log10(max(mix_peak, 1e-12) / float(channel_peak[loudest]))
    _fixed(notes, ONE_CHANNEL, f"{path}: its {data.shape[1]} channels cancel when averaged "
           f"(phase-inverted: the mix peaks {drop:.0f} dB below channel {loudest + 1}); "
           f"using channel {loudest + 1} alone")
    return data[:, loudest]


def _check_levels(path: Path, wav: np.ndarray, notes: Notes | None) -> np.ndarray:
    """The module doc's out-of-range, DC offset and clipping rules, on the clip as read;
    returns the clip (scaled down to full scale when its peak is a little over)."""
    peak = max(float(np.max(wav)), -float(np.min(wav)))
    if peak > MAX_FLOAT_PEAK:
        raise AudioError(f"{path}: samples reach {peak:.3g}, far outside [-1, 1] (limit "
                         f"{MAX_FLOAT_PEAK:g}): the file is scaled wrong (integer values "
                         f"written as float?); export it scaled to [-1, 1]", OUT_OF_RANGE_AUDIO)
    offset = dc_offset(wav)
    if abs(offset) > MAX_DC_OFFSET:
        raise AudioError(f"{path}: DC offset {offset:+.3f} of full scale (limit "
                         f"+-{MAX_DC_OFFSET:g}): a broken recording chain; high-pass it (e.g. "
                         f"sox IN OUT highpass 20) or remove it from the dataset", DC_OFFSET)
    clipped = clipped_fraction(wav)
    if clipped >= MAX_CLIPPED_FRACTION:
        raise AudioError(f"{path}: hard clipping: {100 * clipped:.1f}% of the samples sit in "
                         f"flat runs at the peak (limit {100 * MAX_CLIPPED_FRACTION:g}%); "
                         f"record it again at a lower level or remove it from the dataset",
                         CLIPPED_AUDIO)
    if peak > 1.0:
        _fixed(notes, SCALED_AUDIO, f"{path}: samples reach {peak:.3f}, over full scale; "
               f"scaled down by {20.0 * np.log10(peak):.1f} dB to fit [-1, 1]")
        wav = wav * np.float32(1.0 / peak)
    return wav


def load_audio(path: str | Path, cfg: AudioConfig, notes: Notes | None = None) -> np.ndarray:
    """Load a clip ready for feature extraction: float32 [T], mono, at ``cfg.sample_rate``,
    silence-trimmed if ``cfg.trim_silence`` and loudness-normalised if ``cfg.normalize_loudness``.

    Raises AudioError (naming the file and the fix) for anything that would make the clip
    useless or poison training: unreadable, truncated, empty, non-finite, silent, out of
    range, offset, clipped (the module doc's rules), or at another rate while
    ``cfg.resample`` is false. A clip kept after a fix is recorded in ``notes`` (module doc).
    """
    path = Path(path)
    wav, sample_rate = read_audio(path, notes)
    if not is_silent(wav):  # a silent clip is reported as silent (below)
        wav = _check_levels(path, wav, notes)
    if sample_rate != cfg.sample_rate:
        if not cfg.resample:
            raise AudioError(
                f"{path}: sample rate is {sample_rate} Hz but audio.sample_rate is "
                f"{cfg.sample_rate} Hz and resampling is off; pass --set audio.resample=true "
                f"or resample the data to {cfg.sample_rate} Hz", WRONG_SAMPLE_RATE)
        wav = soxr.resample(wav, sample_rate, cfg.sample_rate, quality="HQ").astype(np.float32)
    if is_silent(wav):
        raise AudioError(f"{path}: clip is silent (peak {peak_dbfs(wav):.1f} dBFS, below "
                         f"{SILENT_PEAK_DBFS:.0f} dBFS); remove it from the dataset", SILENT_AUDIO)
    if cfg.trim_silence:
        wav = trim_silence(wav, cfg.sample_rate, cfg.trim_db)
        if wav.size == 0:
            raise AudioError(f"{path}: nothing left after silence trimming; remove the clip or "
                             "pass --set audio.trim_silence=false", SILENT_AUDIO)
    if cfg.normalize_loudness:
        wav = normalize_loudness(wav, cfg.target_dbfs)
    return np.ascontiguousarray(wav, dtype=np.float32)


def save_wav(path: str | Path, wav, sample_rate: int) -> None:
    """Write a 16-bit PCM WAV atomically (temp file + rename: a killed run never leaves half a file).

    ``wav`` is a float array (numpy or torch) shaped [T] or [T, channels]; values are
    clipped to [-1, 1] (NaN becomes 0) so a loud synthesis saturates instead of wrapping.
    """
    if hasattr(wav, "detach"):  # torch tensor, without importing torch here
        wav = wav.detach().float().cpu().numpy()
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim not in (1, 2):
        raise ValueError(f"save_wav expects [T] or [T, channels] audio, got shape {wav.shape}")
    wav = np.clip(np.nan_to_num(wav, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    buf = io.BytesIO()
    sf.write(buf, wav, int(sample_rate), format="WAV", subtype="PCM_16")
    atomic_write(Path(path), buf.getvalue())
