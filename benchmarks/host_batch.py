"""Host cost of one store batch, per path: what the training process spends building a batch
before it goes to the device (``StoreBatches.batch``: gathers, crops and the copy out of the
memory map; 0 loader workers, one thread).

Arms, measured interleaved in the same run on the same batches:

* ``cpu``: a CPU run's batch (float32 mels: the store's float16 frames are cast as they
  fill the batch);
* ``gpu``: a GPU run's batch (the store's float16 bytes copied once, no cast on the host);
* ``gpu, widen+narrow`` (the baseline): the same float16 batch as a per-item pipeline makes
  it: each utterance's frames and reference crop widened to float32 copies, then narrowed
  into a zeroed batch one utterance at a time.

Two frame budgets: the CPU's planning budget and a large-GPU one (batches several times
larger). Pinned memory needs CUDA and is left out here: where CUDA is available the GPU arm's
``build_loader`` allocates the batch pinned (no second copy), which this script does not time.

    python benchmarks/host_batch.py [--store STORE] [--data DATA] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import common
from common import prepare, say

BUDGETS = {"planning budget (12000 frames)": 12000, "large GPU (48000 frames)": 48000}


def _per_item(store, cfg, plan):
    """The baseline's batch of ``idx``: float32 copies per utterance (its frames, and the
    reference crop the store path takes, ``StoreBatches``' hash), narrowed into a zeroed
    float16 batch one utterance at a time."""
    import numpy as np

    from myxtts.data.batch import BatchShape, allocate
    from myxtts.data.feed.dataset import mix64

    ref_frames = cfg.data.ref_frames
    mels = store.mel_array.view(np.ndarray)  # plain views: no memmap hooks per slice

    def mel(i: int) -> np.ndarray:
        start = int(store.mel_offsets[i])
        return mels[start:start + int(store.mel_lengths[i])]

    def item(i: int) -> tuple[np.ndarray, np.ndarray]:
        h = mix64(0, 0, i)
        refs = store.ref_table[i][store.ref_table[i] >= 0]
        ref = mel(int(refs[h % len(refs)]))
        start = (h >> 32) % (len(ref) - ref_frames + 1) if len(ref) > ref_frames else 0
        return mel(i).astype(np.float32), ref[start:start + ref_frames].astype(np.float32)

    def batch(idx: list[int]) -> dict[str, torch.Tensor]:
        items = [item(i) for i in idx]
        n_frames, n_text = plan.shape_for(max(len(m) for m, _ in items))
        out = allocate(BatchShape(len(idx), n_text, n_frames, ref_frames, store.n_mels), True)
        for j, (i, (mel, ref)) in enumerate(zip(idx, items)):
            toks = store.tokens(i)
            out["tokens"][j, :len(toks)] = toks
            # narrowed back to float16 (torch's cast: numpy's float16 cast is ~2x slower)
            torch.from_numpy(out["mel"][j, :len(mel)]).copy_(torch.from_numpy(mel))
            torch.from_numpy(out["ref_mel"][j, :len(ref)]).copy_(torch.from_numpy(ref))
            out["mel_lengths"][j], out["token_lengths"][j] = len(mel), len(toks)
            out["ref_lengths"][j], out["indices"][j] = len(ref), i
            out["speaker_ids"][j] = store.speaker_ids[i]
            out["language_ids"][j] = store.language_ids[i]
            out["stop_target"][j, max(len(mel) - 1, 0):] = 1.0
        return {k: torch.from_numpy(v) for k, v in out.items()}

    return batch


def _arms(store, cfg):
    from myxtts.data.feed.dataset import StoreBatches
    from myxtts.data.feed.loader import build_sampler, pad_multiple

    sampler = build_sampler(store.mel_lengths, store.token_lengths, cfg, seed=0)
    batches = sampler.batches(0)

    def arm(transfer: bool):
        built = StoreBatches(store, sampler.plan, cfg.data.ref_frames, seed=0,
                             pad_multiple=pad_multiple(cfg), transfer=transfer)
        return lambda idx: built.batch(0, idx)

    arms = {"cpu (float32)": arm(False), "gpu (float16, no host cast)": arm(True),
            "gpu, widen+narrow (baseline)": _per_item(store, cfg, sampler.plan)}
    return arms, batches


def measure(store, cfg, rounds: int) -> dict[str, float]:
    arms, batches = _arms(store, cfg)
    per_arm: dict[str, list[float]] = {name: [] for name in arms}
    for fn in arms.values():  # warm the page cache and the allocator
        for idx in batches[:4]:
            fn(idx)
    for r in range(rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for name in order:
            fn = arms[name]
            t0 = time.perf_counter()
            for idx in batches:
                fn(idx)
            per_arm[name].append((time.perf_counter() - t0) / len(batches) * 1e3)
    utts = statistics.mean(len(b) for b in batches)
    out = {name: statistics.median(v) for name, v in per_arm.items()}
    out["utterances per batch"] = utts
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_arguments(p, presets=None, steps=None, batch_frames=None, threads=None, set=None,
                         rounds="rounds per arm, interleaved (default 7)")
    args = p.parse_args()
    args.rounds = args.rounds or 7
    torch.set_num_threads(1)
    from myxtts.config import load_config
    from myxtts.data.store import FeatureStore

    with tempfile.TemporaryDirectory() as tmp:
        store_path = args.store
        if store_path is None or not (store_path / "manifest.json").exists():
            _, store_path = prepare(args.data, args.store, Path(tmp))
        rows = []
        for label, frames in BUDGETS.items():
            cfg = load_config(overrides=[f"data.batch_frames={frames}", "data.max_batch_size=0"])
            store = FeatureStore.open(store_path, "train", cfg)
            say(f"measuring {label}")
            rows.append((label, measure(store, cfg, args.rounds)))
    base = "gpu, widen+narrow (baseline)"
    print(f"host ms per batch (median of {args.rounds} interleaved rounds, 1 thread, 0 workers)")
    print(f"{'budget':<34} {'arm':<30} {'ms/batch':>9} {'vs baseline':>12}")
    for label, res in rows:
        print(f"{label:<34} ({res['utterances per batch']:.1f} utterances per batch)")
        for name in ("cpu (float32)", "gpu (float16, no host cast)", base):
            print(f"{'':<34} {name:<30} {res[name]:>9.2f} {res[name] / res[base]:>11.3f}x")


if __name__ == "__main__":
    main()
