"""Other projects' loaders, as ``data_pipeline.py`` measures them against ours.

Run by the interpreter of a separate benchmark environment that has the peers installed
(``data_pipeline.py --peer-python PATH``): they are never dependencies of myxtts, and
nothing here imports myxtts. ``python _peers.py SPEC.json WORKERS SECONDS`` reads what the
driver wrote (``_peer_specs.py``: the clips or features, the batches of every epoch) and
prints one JSON line with ``_pipelines.timed_epochs``' measurements.

- ``coqui``: Coqui TTS's ``TTSDataset`` (``coqui-tts``) with its own ``collate_fn``: each
  clip loaded (``AudioProcessor.load_wav``: read, silence trim) in ``__getitem__``, its
  log-mel computed in the collate, in the loader workers.
- ``lhotse``: lhotse's precomputed-feature loading (``PrecomputedFeatures``, lhotse's
  ``collate_features``) of a ``CutSet`` per batch, the features written beforehand (not
  timed) by one of lhotse's feature writers; the dataset is reduced to that collation plus
  the token ids (no manifest validation), lhotse's fastest precomputed path.

Every peer iterates the batches it is given, epoch after epoch (the driver's bucket
sampler: the same utterances per batch as ours), with the DataLoader settings ours uses
(persistent workers, prefetch 2, one intra-op thread per process).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class PlanSampler:
    """Batch sampler over the driver's planned epochs (cycled if a run outlasts them)."""

    def __init__(self, epochs: list[list[list[int]]], to_batch: Any = None) -> None:
        self.epochs, self.to_batch, self.epoch = epochs, to_batch, 0

    def __iter__(self):
        batches = self.epochs[self.epoch % len(self.epochs)]
        self.epoch += 1
        for b in batches:
            yield b if self.to_batch is None else self.to_batch(b)

    def __len__(self) -> int:
        return len(self.epochs[self.epoch % len(self.epochs)])


def _one_thread(_worker_id: int = 0) -> None:
    import torch

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    torch.set_num_threads(1)


def _loader_kw(workers: int) -> dict:
    if not workers:
        return {"num_workers": 0}
    return {"num_workers": workers, "persistent_workers": True, "prefetch_factor": 2,
            "worker_init_fn": _one_thread}


def coqui_loader(spec: dict) -> Any:
    import torch
    from TTS.config.shared_configs import BaseAudioConfig
    from TTS.tts.datasets.dataset import TTSDataset
    from TTS.tts.utils.text.characters import Graphemes
    from TTS.tts.utils.text.tokenizer import TTSTokenizer
    from TTS.utils.audio import AudioProcessor

    a = spec["audio"]
    # The mel definition of ours (22,050 Hz, n_fft 1024, hop 256, 80 mels up to 8 kHz), the
    # rest Coqui's defaults (silence trimming on, its own normalisation of the log-mel).
    ap = AudioProcessor(BaseAudioConfig(
        sample_rate=a["sample_rate"], fft_size=a["n_fft"], hop_length=a["hop_length"],
        win_length=a["win_length"], num_mels=a["n_mels"], mel_fmin=a["fmin"], mel_fmax=a["fmax"],
        resample=False))
    samples = [{"text": text, "audio_file": path, "speaker_name": "spk", "language": "en",
                "audio_unique_name": f"clip{i}"}
               for i, (path, text) in enumerate(zip(spec["paths"], spec["texts"]))]
    tokenizer = TTSTokenizer(use_phonemes=False, characters=Graphemes())
    dataset = TTSDataset(outputs_per_step=1, ap=ap, samples=samples, tokenizer=tokenizer)

    index = {path: i for i, path in enumerate(spec["paths"])}

    def collate(items: list) -> dict:
        out = dataset.collate_fn(items)  # [B, T, n_mels] log-mels, sorted by text length
        return {"mel": out["mel"], "indices": torch.tensor([index[p] for p in out["item_idxs"]])}

    return torch.utils.data.DataLoader(dataset, batch_sampler=PlanSampler(spec["plan"]),
                                       collate_fn=collate, **_loader_kw(spec["workers"]))


def lhotse_loader(spec: dict, tmp: Path) -> Any:
    import numpy as np
    import torch
    from lhotse import CutSet, Features, MonoCut, SupervisionSegment
    from lhotse.dataset.collation import collate_features
    from lhotse.features.io import get_writer

    mels = np.load(spec["mels"])  # float32 [frames, n_mels], every utterance's in turn
    offsets = spec["offsets"]
    frame_shift = spec["audio"]["hop_length"] / spec["audio"]["sample_rate"]
    cuts = []
    with get_writer(spec["storage"])(tmp / "feats") as writer:
        for i in range(len(offsets) - 1):
            feats = mels[offsets[i]:offsets[i + 1]]
            key = writer.write(f"utt{i}", feats)
            duration = round(len(feats) * frame_shift, 6)
            features = Features(type="mel", num_frames=len(feats), num_features=feats.shape[1],
                                frame_shift=frame_shift, sampling_rate=spec["audio"]["sample_rate"],
                                start=0.0, duration=duration, storage_type=writer.name,
                                storage_path=str(writer.storage_path), storage_key=key)
            sup = SupervisionSegment(id=f"utt{i}", recording_id=f"utt{i}", start=0.0,
                                     duration=duration, text=spec["texts"][i])
            cuts.append(MonoCut(id=f"utt{i}", start=0.0, duration=duration, channel=0,
                                features=features, supervisions=[sup]))
    tokens = [torch.tensor(t, dtype=torch.long) for t in spec["tokens"]]

    class Precomputed(torch.utils.data.Dataset):
        def __getitem__(self, batch: CutSet) -> dict:
            features, lengths = collate_features(batch)
            ids = [int(c.id[3:]) for c in batch]
            return {"mel": features, "mel_lengths": lengths, "indices": torch.tensor(ids),
                    "tokens": torch.nn.utils.rnn.pad_sequence([tokens[i] for i in ids],
                                                              batch_first=True)}

    def to_cuts(batch: list[int]) -> CutSet:  # a list: a batch may repeat an utterance
        return CutSet.from_cuts([cuts[i] for i in batch])

    return torch.utils.data.DataLoader(Precomputed(), sampler=PlanSampler(spec["plan"], to_cuts),
                                       batch_size=None, **_loader_kw(spec["workers"]))


def main() -> None:
    import numpy as np

    sys.path.insert(0, str(HERE))
    from _pipelines import timed_epochs

    spec = json.loads(Path(sys.argv[1]).read_text())
    spec["workers"], spec["seconds"] = int(sys.argv[2]), float(sys.argv[3])
    _one_thread()
    with tempfile.TemporaryDirectory(prefix="myxtts-peer-") as tmp:
        if spec["peer"] == "coqui":
            loader = coqui_loader(spec)
        else:
            loader = lhotse_loader(spec, Path(tmp))
        out = timed_epochs(loader, spec["seconds"], np.asarray(spec["durations"]),
                           spec["audio"]["n_mels"])
    print(json.dumps({**out, "workers": spec["workers"], "plan": spec["digest"],
                      "clips": len(spec["durations"]), "storage": spec.get("storage", "")}))


if __name__ == "__main__":
    main()
