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
import os
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np
import soundfile as sf
import soxr

from myxtts.audio import processing
from myxtts.audio.processing import (
    SILENT_PEAK_DBFS,
    clipped_fraction,
    dc_offset,
    is_silent,
    normalize_loudness,
    peak_dbfs,
    trim_bounds,
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

# The store's 16-bit audio: sample x in [-1, 1] is stored as clip(round(x * PCM16_SCALE)), and
# int16 samples divide by it to come back. Audio written out (wav files, raw PCM) goes
# through ``to_pcm16`` instead.
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
    left open by a streaming writer: 0 or 0xFFFFFFFF, anything unparsable). One read of the
    file's head in the usual case (it runs on every load of every clip on the fly)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            file_size = os.fstat(fh.fileno()).st_size

            def read(pos: int, n: int) -> bytes:  # from the head, else from the file
                if pos + n <= len(head):
                    return head[pos:pos + n]
                fh.seek(pos)
                return fh.read(n)

            pos, block_align = 12, 0
            for _ in range(64):  # chunks before "data": fmt, fact, LIST, ... never many
                chunk = read(pos, 8)
                if len(chunk) < 8:
                    return None
                cid, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
                start = pos + 8
                if cid == b"fmt " and size >= 14:
                    block_align = struct.unpack("<H", read(start, 14)[12:14])[0]
                elif cid == b"data":
                    have = file_size - start
                    if size in (0, 0xFFFFFFFF) or size <= have or block_align <= 0:
                        return None
                    return size // block_align, (size - have) // block_align
                pos = start + size + (size & 1)
    except (OSError, struct.error):
        return None
    return None


_HEAD_BYTES = 4096  # a WAV's chunks before its samples (fmt, fact, LIST) nearly always fit


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
    wav, sample_rate, _ = _read(Path(path), notes)
    return wav, sample_rate


def _decode(f: sf.SoundFile, frames: int = -1) -> tuple[np.ndarray, bool]:
    """``(float32 [T, C], is 16-bit PCM)``: the next ``frames`` frames of an open file (-1:
    all the rest)."""
    if f.subtype == "PCM_16":
        # The common case (LJSpeech, most corpora). libsndfile's own int->float
        # conversion measures ~2x slower than reading int16 and scaling in
        # numpy; the values are identical (x / 32768 is exact in float32).
        return _pcm16_to_float(f.read(frames, dtype="int16", always_2d=True)), True
    return f.read(frames, dtype="float32", always_2d=True), False


_DECODE_ERRORS = (sf.SoundFileError, RuntimeError, OSError, ValueError, TypeError, EOFError)


def _read(path: Path, notes: Notes | None) -> tuple[np.ndarray, int, int]:
    """:func:`read_audio`'s clip and rate, and the file's channel count."""
    _check_exists(path)
    try:
        with sf.SoundFile(str(path)) as f:
            sample_rate = f.samplerate
            data, is_pcm16 = _decode(f)  # [T, C]
    except _DECODE_ERRORS as e:
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
    return np.ascontiguousarray(wav, dtype=np.float32), int(sample_rate), data.shape[1]


def read_span(path: str | Path, start: int, stop: int) -> np.ndarray:
    """Samples ``[start, stop)`` of a one-channel clip as float32, decoded the way
    :func:`read_audio` decodes the whole clip (the same values), without the rest: what
    the on-the-fly loader reads of a reference clip whose span :func:`load_audio_span` gave
    (a seek and a read of the crop, ~10x less than loading the clip)."""
    path = Path(path)
    try:
        with sf.SoundFile(str(path)) as f:
            f.seek(start)
            data, _ = _decode(f, stop - start)
    except _DECODE_ERRORS as e:
        raise AudioError(f"{path}: cannot decode audio ({_reason(e, path)}); {_FIX_BROKEN}") from e
    if data.shape != (stop - start, 1):
        raise AudioError(f"{path}: has changed while in use (samples {start}-{stop} of one "
                         f"channel expected, {data.shape[0]} x {data.shape[1]} read); "
                         f"{_FIX_BROKEN}")
    return np.ascontiguousarray(data[:, 0])


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


def _check_levels(path: Path, wav: np.ndarray, peak: float, notes: Notes | None
                  ) -> tuple[np.ndarray, float]:
    """The module doc's out-of-range, DC offset and clipping rules, on the clip as read
    (``peak``: its ``processing.peak``); returns the clip (scaled down to full scale when
    its peak is a little over) and its peak."""
    if peak > MAX_FLOAT_PEAK:
        raise AudioError(f"{path}: samples reach {peak:.3g}, far outside [-1, 1] (limit "
                         f"{MAX_FLOAT_PEAK:g}): the file is scaled wrong (integer values "
                         f"written as float?); export it scaled to [-1, 1]", OUT_OF_RANGE_AUDIO)
    offset = dc_offset(wav)
    if abs(offset) > MAX_DC_OFFSET:
        raise AudioError(f"{path}: DC offset {offset:+.3f} of full scale (limit "
                         f"+-{MAX_DC_OFFSET:g}): a broken recording chain; high-pass it (e.g. "
                         f"sox IN OUT highpass 20) or remove it from the dataset", DC_OFFSET)
    clipped = clipped_fraction(wav, level=peak)
    if clipped >= MAX_CLIPPED_FRACTION:
        raise AudioError(f"{path}: hard clipping: {100 * clipped:.1f}% of the samples sit in "
                         f"flat runs at the peak (limit {100 * MAX_CLIPPED_FRACTION:g}%); "
                         f"record it again at a lower level or remove it from the dataset",
                         CLIPPED_AUDIO)
    if peak > 1.0:
        _fixed(notes, SCALED_AUDIO, f"{path}: samples reach {peak:.3f}, over full scale; "
               f"scaled down by {20.0 * np.log10(peak):.1f} dB to fit [-1, 1]")
        wav = wav * np.float32(1.0 / peak)
        peak = processing.peak(wav)
    return wav, peak


def load_audio(path: str | Path, cfg: AudioConfig, notes: Notes | None = None) -> np.ndarray:
    """Load a clip ready for feature extraction: float32 [T], mono, at ``cfg.sample_rate``,
    silence-trimmed if ``cfg.trim_silence`` and loudness-normalised if ``cfg.normalize_loudness``.

    Raises AudioError (naming the file and the fix) for anything that would make the clip
    useless or poison training: unreadable, truncated, empty, non-finite, silent, out of
    range, offset, clipped (the module doc's rules), or at another rate while
    ``cfg.resample`` is false. A clip kept after a fix is recorded in ``notes`` (module doc).
    """
    return load_audio_span(path, cfg, notes)[0]


def load_audio_span(path: str | Path, cfg: AudioConfig, notes: Notes | None = None
                    ) -> tuple[np.ndarray, tuple[int, int] | None]:
    """:func:`load_audio`'s clip and, where that clip is exactly the file's samples
    ``[start, stop)`` (one channel, at ``cfg.sample_rate``, not scaled, not loudness-
    normalised), that span: ``read_span(path, start + a, start + b)`` then equals
    ``clip[a:b]``. None otherwise."""
    path = Path(path)
    wav, sample_rate, channels = _read(path, notes)
    as_read = wav
    # The peak is measured once and passed on: every pass over the clip is paid on every
    # clip of every epoch when features are made on the fly.
    level = processing.peak(wav)
    if not is_silent(wav, level):  # a silent clip is reported as silent (below)
        wav, level = _check_levels(path, wav, level, notes)
    plain = (channels == 1 and wav is as_read and sample_rate == cfg.sample_rate
             and not cfg.normalize_loudness)
    if sample_rate != cfg.sample_rate:
        if not cfg.resample:
            raise AudioError(
                f"{path}: sample rate is {sample_rate} Hz but audio.sample_rate is "
                f"{cfg.sample_rate} Hz and resampling is off; pass --set audio.resample=true "
                f"or resample the data to {cfg.sample_rate} Hz", WRONG_SAMPLE_RATE)
        wav = soxr.resample(wav, sample_rate, cfg.sample_rate, quality="HQ").astype(np.float32)
        level = processing.peak(wav)
    if is_silent(wav, level):
        raise AudioError(f"{path}: clip is silent (peak {peak_dbfs(wav, level):.1f} dBFS, below "
                         f"{SILENT_PEAK_DBFS:.0f} dBFS); remove it from the dataset", SILENT_AUDIO)
    start, stop = 0, len(wav)
    if cfg.trim_silence:
        start, stop = trim_bounds(wav, cfg.sample_rate, cfg.trim_db, level=level)
        wav = wav[start:stop]
        if wav.size == 0:
            raise AudioError(f"{path}: nothing left after silence trimming; remove the clip or "
                             "pass --set audio.trim_silence=false", SILENT_AUDIO)
    if cfg.normalize_loudness:
        wav = normalize_loudness(wav, cfg.target_dbfs)
    return np.ascontiguousarray(wav, dtype=np.float32), (start, stop) if plain else None


def to_pcm16(wav) -> np.ndarray:
    """Float audio -> int16 samples: the one conversion of every 16-bit output (a wav file, a
    wav written as it is made, raw PCM on stdout), so they hold the same samples. NaN -> 0,
    clipped to [-1, 1] (a loud synthesis saturates, never wraps), then libsndfile 1.2's own
    float-to-16-bit rule (``x * 2**31`` rounded, its top 16 bits: ``floor(x * 32768)``, 1.0
    -> 32767), so the samples do not depend on the libsndfile installed."""
    wav = np.nan_to_num(np.asarray(wav, dtype=np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    wide = np.rint(np.clip(wav, -1.0, 1.0).astype(np.float64) * 2.0**31)  # exact: 24-bit mantissa
    return (np.clip(wide, -2.0**31, 2.0**31 - 1).astype(np.int64) >> 16).astype(np.int16)


def save_wav(path: str | Path, wav, sample_rate: int) -> None:
    """Write float audio (numpy or torch, [T] or [T, channels]) as a 16-bit PCM WAV through
    :func:`to_pcm16`, atomically (temp file + rename: a killed run never leaves half a file)."""
    if hasattr(wav, "detach"):  # torch tensor, without importing torch here
        wav = wav.detach().float().cpu().numpy()
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim not in (1, 2):
        raise ValueError(f"save_wav expects [T] or [T, channels] audio, got shape {wav.shape}")
    buf = io.BytesIO()
    sf.write(buf, to_pcm16(wav), int(sample_rate), format="WAV", subtype="PCM_16")
    atomic_write(Path(path), buf.getvalue())
