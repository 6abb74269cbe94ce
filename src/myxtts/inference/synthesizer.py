"""Text + a few seconds of reference audio -> waveform, from a training checkpoint.

The checkpoint carries everything inference needs (config, vocabulary, mel statistics),
so a run folder or a single ``.pt`` file is enough; nothing is re-derived from the data.
The reference goes through the same ``MelSpectrogram`` as training (one feature definition).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from myxtts.audio.io import load_audio, save_wav
from myxtts.audio.mel import MelSpectrogram
from myxtts.config import Config, config_from_dict, resolve_device
from myxtts.model.vocoder import GriffinLim
from myxtts.text import Tokenizer, clean_text
from myxtts.train import checkpoint as ck
from myxtts.train.errors import TrainError

log = logging.getLogger(__name__)


def resolve_checkpoint(path: str | Path) -> Path:
    """A ``.pt`` file, or a run folder (its ``best.pt``, else the newest step checkpoint)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        for folder in (p / "checkpoints", p):
            if (folder / "best.pt").is_file():
                return folder / "best.pt"
            latest = ck.CheckpointManager(folder, 1).latest()
            if latest is not None:
                return latest
    raise TrainError(f"no checkpoint at {p}: pass a .pt file or a run folder containing "
                     f"checkpoints/ (train one with `myxtts train` or `myxtts demo`)")


class Synthesizer:
    def __init__(self, model: torch.nn.Module, cfg: Config, tokenizer: Tokenizer,
                 device: torch.device):
        self.model, self.cfg, self.tokenizer, self.device = model.eval(), cfg, tokenizer, device
        self.mel = MelSpectrogram(cfg.audio).to(device)
        self.vocoder = GriffinLim(cfg.audio).to(device)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto") -> Synthesizer:
        from myxtts.model.xtts import build_model

        dev = resolve_device(device, "--device")
        state = ck.load(resolve_checkpoint(path))
        cfg = config_from_dict(state[ck.CONFIG])
        tok = Tokenizer.from_dict(state[ck.VOCAB])
        model = build_model(cfg, tok.vocab_size, len(tok.languages),
                            state[ck.MEL_MEAN], state[ck.MEL_STD])
        model.load_state_dict(state[ck.MODEL])
        return cls(model.to(dev), cfg, tok, dev)

    def reference(self, audio_paths: Sequence[str | Path]) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference mel from one or more clips of the target voice, concatenated and cropped
        to ``data.ref_frames`` (the length the conditioning encoder was trained on)."""
        wavs = [load_audio(p, self.cfg.audio) for p in audio_paths]
        wav = torch.from_numpy(np.concatenate(wavs)).to(self.device)
        mel, n = self.mel(wav)
        n_frames, r = int(n), self.cfg.data.ref_frames
        start = max(0, (n_frames - r) // 2)
        crop = mel[start:start + r]
        return crop[None], torch.tensor([crop.shape[0]], device=self.device)

    def encode(self, texts: Sequence[str], language: str) -> tuple[torch.Tensor, torch.Tensor]:
        if language not in self.tokenizer.languages:
            raise TrainError(f"language {language!r} is not known to this model "
                             f"(it knows {', '.join(self.tokenizer.languages)})")
        ids = [self.tokenizer.encode(clean_text(t, language, self.cfg.text), language) for t in texts]
        for t, i in zip(texts, ids):
            if len(i) <= 3:
                raise TrainError(f"text {t!r} is empty after cleaning; give a sentence to speak")
        lengths = torch.tensor([len(i) for i in ids])
        tokens = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
        for b, i in enumerate(ids):
            tokens[b, : len(i)] = torch.tensor(i)
        return tokens.to(self.device), lengths.to(self.device)

    @torch.inference_mode()
    def synthesize_mel(self, texts: Sequence[str], reference: Sequence[str | Path],
                       language: str | None = None, seed: int | None = 0
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Batched over ``texts``, one voice. Returns log-mels [B, F, n_mels] and lengths [B]."""
        if seed is not None:
            torch.manual_seed(seed)  # prenet dropout stays on at inference: fix it for repeatability
        language = language or self.cfg.text.default_language
        tokens, token_lengths = self.encode(texts, language)
        ref, ref_len = self.reference(reference)
        b = tokens.shape[0]
        lang = torch.full((b,), self.tokenizer.language_id(language), device=self.device)
        return self.model.generate(tokens, token_lengths, lang, ref.expand(b, -1, -1),
                                   ref_len.expand(b))

    def synthesize(self, texts: Sequence[str], reference: Sequence[str | Path],
                   language: str | None = None, seed: int | None = 0) -> list[np.ndarray]:
        mels, lengths = self.synthesize_mel(texts, reference, language, seed)
        return self.vocoder.waveforms(mels, lengths)

    def synthesize_to_files(self, texts: Sequence[str], reference: Sequence[str | Path],
                            outputs: Sequence[str | Path], language: str | None = None,
                            seed: int | None = 0) -> list[Path]:
        paths = []
        for wav, out in zip(self.synthesize(texts, reference, language, seed), outputs):
            save_wav(Path(out), wav, self.cfg.audio.sample_rate)
            paths.append(Path(out))
        return paths
