"""The XTTS store's chunk: a worker loads each clip at 22050 Hz, asks the codec for its DVAE
codes and commits the chunk as one ``.npz`` (``data.prepare.chunks``' mechanism: atomic
rename, complete chunks skipped on resume, a kill loses only the chunks in flight).

Clips are read as the reference trainer reads them: mono at their own rate
(``audio.io.read_audio``), resampled with the sinc resampler XTTS-v2 was trained with
(``audio.sinc_resample``, bit-exact to torchaudio's), clipped to [-1, 1]; not trimmed,
not normalised. The codes are those of the float clip alone; the int16 audio kept beside
them is what the recipe cuts conditioning segments from.

Why a codec factory: the data layer must not import the model, so the DVAE reaches the
workers as ``task["factory"]`` (a module-level function, picklable by name) and
``task["source"]`` (the XTTS-v2 folder); each worker builds the codec once and keeps it.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.audio.io import AudioError, read_audio
from myxtts.data.prepare.chunks import write_chunk
from myxtts.data.prepare.records import TOO_LONG, TOO_SHORT
from myxtts.data.store.audio import quantize
from myxtts.data.store.format import AUDIO_DTYPE, StoreError
from myxtts.data.xtts_store.format import CODE_DTYPE, MAX_SAMPLES, MIN_SAMPLES, SAMPLE_RATE

_CODECS: dict[tuple[str, str], Any] = {}  # per worker: (factory, source) -> codec


def clip_at_22k(path: str | Path) -> Any:
    """A clip as XTTS-v2's trainer hears it: float32 tensor ``[S]`` at 22050 Hz in [-1, 1]."""
    import torch  # deferred: workers cap their threads before torch (data.prepare.chunks)

    from myxtts.audio.sinc_resample import sinc_resample  # deferred: torch

    wav, rate = read_audio(path)
    audio = sinc_resample(torch.from_numpy(np.ascontiguousarray(wav, np.float32)), int(rate),
                          SAMPLE_RATE)
    return audio.clamp_(-1.0, 1.0)


def _codec(factory: Any, source: str) -> Any:
    key = (f"{factory.__module__}.{factory.__qualname__}", source)
    if key not in _CODECS:
        _CODECS.clear()  # one model per worker at a time
        _CODECS[key] = factory(source)
    return _CODECS[key]


def extract_xtts_chunk(task: dict[str, Any]) -> dict[str, Any]:
    """Worker: one chunk's clips -> codes and int16 audio, committed atomically. The
    ``.npz`` (no pickle): ``codes`` int16 and ``n_codes`` int32 per clip (0 = rejected),
    ``audio`` int16 and ``n_samples``, ``rejections`` (JSON as uint8)."""
    import torch  # deferred: as above

    codec = _codec(task["factory"], task["source"])
    n = len(task["utterances"])
    n_codes, n_samples = np.zeros(n, np.int32), np.zeros(n, np.int32)
    codes, waves, rejections = [], [], []
    audio_s = 0.0
    for j, (uid, path) in enumerate(task["utterances"]):
        try:
            audio = clip_at_22k(path)
        except AudioError as e:
            rejections.append({"id": uid, "audio_path": path, "reason": e.reason,
                               "detail": str(e)})
            continue
        samples = int(audio.shape[-1])
        audio_s += samples / SAMPLE_RATE
        if not MIN_SAMPLES <= samples <= MAX_SAMPLES:
            short = samples < MIN_SAMPLES
            rejections.append({
                "id": uid, "audio_path": path, "reason": TOO_SHORT if short else TOO_LONG,
                "detail": f"{samples / SAMPLE_RATE:.2f} s at 22050 Hz; XTTS-v2's trainer takes "
                          f"{MIN_SAMPLES / SAMPLE_RATE:.1f} to {MAX_SAMPLES / SAMPLE_RATE:.2f} s"})
            continue
        with torch.no_grad():
            got = np.asarray(codec(audio), np.int64).reshape(-1)
        n_codes[j], n_samples[j] = len(got), samples
        codes.append(got.astype(CODE_DTYPE))
        waves.append(quantize(audio.numpy()))
    buf = io.BytesIO()
    np.savez(buf, codes=np.concatenate([np.zeros(0, CODE_DTYPE), *codes]), n_codes=n_codes,
             audio=np.concatenate([np.zeros(0, AUDIO_DTYPE), *waves]), n_samples=n_samples,
             rejections=np.frombuffer(json.dumps(rejections, ensure_ascii=False).encode(),
                                      np.uint8))
    write_chunk(task["path"], buf.getvalue())
    return {"n": n, "audio_s": audio_s, "rejected": len(rejections)}


def read_xtts_chunk(path: Path, n_utterances: int) -> dict[str, Any]:
    """A committed chunk, checked: its arrays (``rejections`` decoded) or a StoreError."""
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in ("codes", "n_codes", "audio", "n_samples", "rejections")}
        out["rejections"] = json.loads(out["rejections"].tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise StoreError(f"{path}: damaged chunk ({e}); re-run the same prepare command") from e
    if (len(out["n_codes"]) != n_utterances or len(out["n_samples"]) != n_utterances
            or out["codes"].dtype != CODE_DTYPE or out["audio"].dtype != AUDIO_DTYPE
            or len(out["codes"]) != int(out["n_codes"].sum())
            or len(out["audio"]) != int(out["n_samples"].sum())):
        raise StoreError(f"{path}: damaged chunk; delete it and re-run the same prepare command")
    return out


def xtts_chunk_ok(path: Path, n_utterances: int) -> bool:
    """True when a chunk left by an earlier run is complete and fits the plan."""
    try:
        read_xtts_chunk(path, n_utterances)
        return True
    except StoreError:
        return False
