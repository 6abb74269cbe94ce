"""``myxtts prepare DATA --out STORE --xtts XTTS_DIR``: the XTTS store of a dataset, made with
the model's own DVAE.

``data.xtts_store`` does the work but may not import the model; this module supplies the
codec: ``dvae_codec(folder)``, a module-level factory that each worker process calls once
(by name: it pickles as a reference) to build the DVAE of the folder's ``dvae.pth`` and
the DVAE mel with its ``mel_stats.pth``. Cost per clip: the mel and the DVAE's encoder,
~0.5 G multiply-adds per second of audio, on one CPU thread per worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.xtts_v2.folder import DVAE, MEL_STATS, read_config, read_dvae
from myxtts.artifacts.xtts_v2.layout import DVAE_OPTIONAL
from myxtts.artifacts.xtts_v2.torch_files import check_mel_stats, load_pth
from myxtts.config import Config
from myxtts.data.prepare.build import PrepareResult
from myxtts.data.store.format import StoreError
from myxtts.data.xtts_store.build import prepare_xtts_store
from myxtts.data.xtts_store.format import tensor_sha256
from myxtts.model.xtts_v2.dvae import XttsDvae
from myxtts.model.xtts_v2.features import dvae_mel, dvae_mel_spec


class DvaeCodec:
    """22050 Hz audio ``[S]`` -> the DVAE's codes ``[ceil((1 + S // 256) / 4)]`` of the clip
    alone, as the reference trainer's ``TorchMelSpectrogram`` and ``get_codebook_indices``
    make them."""

    def __init__(self, dvae: XttsDvae, mel_stats: Tensor) -> None:
        self.dvae = dvae.eval()
        self.mel_stats = mel_stats.float()
        self.spec = dvae_mel_spec()

    @torch.no_grad()
    def __call__(self, audio: Tensor) -> Tensor:
        mel = dvae_mel(audio.float()[None], self.mel_stats, self.spec)  # [1, 80, F]
        return self.dvae.codes(mel)[0]


def read_dvae_files(folder: str | Path) -> tuple[dict[str, Tensor], Tensor]:
    """The DVAE state and mel statistics of an XTTS-v2 folder, read safely and checked; a
    one-line StoreError when it lacks them (a folder made for speaking only)."""
    folder = Path(folder)
    for name in (DVAE, MEL_STATS):
        if not (folder / name).is_file():
            raise StoreError(f"{folder} has no {name}, which fine-tuning needs (the GPT learns "
                             f"that DVAE's codes); use the complete XTTS-v2 download")
    try:
        config, _, _ = read_config(folder)
        state = read_dvae(folder / DVAE, config)
        stats = check_mel_stats(str(folder / MEL_STATS),
                                load_pth(folder / MEL_STATS, "XTTS-v2's mel_stats.pth"))
    except ArtifactError as e:
        raise StoreError(str(e)) from None
    return state, stats


def dvae_codec(folder: str) -> DvaeCodec:
    """The codec of the XTTS-v2 folder ``folder`` (a worker's factory: module level)."""
    state, stats = read_dvae_files(folder)
    dvae = XttsDvae()
    missing, unexpected = dvae.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(DVAE_OPTIONAL) for k in missing):
        raise StoreError(f"{Path(folder) / DVAE}: not XTTS-v2's DVAE (missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]})")
    return DvaeCodec(dvae, stats)


def prepare_xtts(data: str | Path, out: str | Path, cfg: Config, xtts_dir: str | Path,
                 **kwargs: Any) -> PrepareResult:
    """The XTTS store of ``data`` at ``out`` for the XTTS-v2 folder ``xtts_dir`` (keyword
    arguments: ``data.xtts_store.build.prepare_xtts_store``'s)."""
    state, stats = read_dvae_files(xtts_dir)  # checked here, before any work: one clear line
    tensors = {"dvae": tensor_sha256(state), "mel_stats": tensor_sha256({"mel_stats": stats})}
    return prepare_xtts_store(data, out, cfg, xtts_dir, dvae_codec, tensors=tensors, **kwargs)
