"""Speaker similarity: the cosine of two clips' d-vectors from a GE2E speaker encoder.

The encoder (Wan et al., 2018: a 3-layer LSTM over 40 mel bands of 16 kHz audio, a 256-d
unit-length output) and its trained weights are those the ``resemblyzer`` wheel ships
(``pretrained.pt``, read here with ``weights_only=True``: no pickle runs). resemblyzer's own
modules are not imported: they import ``webrtcvad``, whose ``import pkg_resources`` fails
under setuptools 81 and newer. So the network and its input are rebuilt here (~40 lines),
as resemblyzer computes them: power mels of 25 ms windows every 10 ms, 1.6 s partial
utterances at 1.3 per second, the mean of their embeddings made unit length (tested to
match resemblyzer's ``embed_utterance`` on the same waveform). One difference in the
preprocessing: only leading and trailing silence is trimmed (resemblyzer also shortens long
pauses inside a clip with a voice-activity detector).

Similarity of two clips of one speaker is typically 0.75-0.95 with this encoder, of two
different speakers lower; a clip against itself gives 1.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import soxr
import torch
from torch import nn

from myxtts.audio.mel import mel_filterbank
from myxtts.audio.processing import trim_silence
from myxtts.config import AudioConfig
from myxtts.metrics import EvaluationError, require

SAMPLE_RATE = 16000
_MEL = AudioConfig(sample_rate=SAMPLE_RATE, n_fft=400, hop_length=160, win_length=400,
                   n_mels=40, fmin=0.0, fmax=SAMPLE_RATE / 2)
PARTIAL_FRAMES = 160  # 1.6 s per partial utterance
PARTIALS_PER_S = 1.3
MIN_COVERAGE = 0.75  # a last partial needs this share of real audio, else it is dropped
TARGET_DBFS = -30.0  # quieter clips are raised to this RMS level (never lowered)


def weights_file() -> Path:
    """resemblyzer's ``pretrained.pt``, found without importing the package."""
    require("resemblyzer", what="speaker similarity")
    spec = importlib.util.find_spec("resemblyzer")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.is_file():
        raise EvaluationError(f"resemblyzer is installed without its weights ({path} is "
                              f"missing); reinstall it: pip install --force-reinstall resemblyzer")
    return path


class SpeakerEncoder(nn.Module):
    """GE2E d-vectors of clips: ``embed(wav, sample_rate) -> float32 [256]``, unit length."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.lstm = nn.LSTM(_MEL.n_mels, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)
        state = torch.load(weights_file(), map_location="cpu", weights_only=True)["model_state"]
        self.load_state_dict({k: v for k, v in state.items()
                              if k.startswith(("lstm.", "linear."))})
        self.register_buffer("window", torch.hann_window(_MEL.win_length), persistent=False)
        self.register_buffer("basis", mel_filterbank(_MEL), persistent=False)  # [201, 40]
        self.device = torch.device(device)
        self.to(self.device).eval()

    def power_mel(self, wav: np.ndarray) -> torch.Tensor:
        """[frames, 40] mel power of a 16 kHz clip (zero-padded centred frames, as librosa
        >= 0.10 computes them for resemblyzer)."""
        x = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)).to(self.device)
        spec = torch.stft(x, _MEL.n_fft, _MEL.hop_length, _MEL.win_length, self.window,
                          center=True, pad_mode="constant", return_complex=True)  # [201, F]
        return (spec.abs().square().T @ self.basis)  # [F, 40]

    @torch.inference_mode()
    def embed(self, wav: np.ndarray, sample_rate: int) -> np.ndarray:
        """The clip's d-vector: float32 [256], unit length."""
        wav = np.asarray(wav, dtype=np.float32)
        if sample_rate != SAMPLE_RATE:
            wav = soxr.resample(wav, sample_rate, SAMPLE_RATE).astype(np.float32)
        trimmed = trim_silence(wav, SAMPLE_RATE, 40.0)
        return self.embed_levelled(_raise_volume(trimmed if trimmed.size else wav))

    @torch.inference_mode()
    def embed_levelled(self, wav: np.ndarray) -> np.ndarray:
        """d-vector of a 16 kHz clip already trimmed and levelled (resemblyzer's
        ``embed_utterance``)."""
        hop = _MEL.hop_length
        n_frames = int(np.ceil((len(wav) + 1) / hop))
        step = int(round(SAMPLE_RATE / PARTIALS_PER_S / hop))
        starts = list(range(0, max(1, n_frames - PARTIAL_FRAMES + step + 1), step))
        last = starts[-1] * hop
        if len(starts) > 1 and (len(wav) - last) / (PARTIAL_FRAMES * hop) < MIN_COVERAGE:
            starts.pop()
        end = (starts[-1] + PARTIAL_FRAMES) * hop
        wav = np.pad(wav, (0, max(0, end - len(wav))))
        mel = self.power_mel(wav)
        partials = torch.stack([mel[s:s + PARTIAL_FRAMES] for s in starts])  # [P, 160, 40]
        _, (hidden, _) = self.lstm(partials)
        embeds = torch.relu(self.linear(hidden[-1]))  # [P, 256]
        embeds = embeds / embeds.norm(dim=1, keepdim=True)
        mean = embeds.mean(0)
        return (mean / mean.norm()).cpu().numpy()


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two d-vectors (unit length: their dot product)."""
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _raise_volume(wav: np.ndarray) -> np.ndarray:
    """``wav`` raised to ``TARGET_DBFS`` RMS when quieter (resemblyzer's levelling)."""
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64)))) if wav.size else 0.0
    if rms == 0.0:
        return wav
    gain_db = TARGET_DBFS - 20.0 * np.log10(rms)
    return (wav * 10.0 ** (gain_db / 20.0)).astype(np.float32) if gain_db > 0 else wav
