"""data.max_val_utterances: validation runs on a fixed, seeded subset of the val split, the
same for every rank, world size and resume, from a store and on the fly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.data.feed.sampler import capped_subset
from myxtts.train.data import open_train_data
from myxtts.train.distributed import DistInfo
from tests.helpers import micro_config

CPU = torch.device("cpu")
CAP = 5


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A raw dataset whose seeded val split (a third of 2 x 12 utterances) exceeds the cap,
    and the store prepared from it."""
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data

    root = tmp_path_factory.mktemp("valcap")
    data = make_demo_data(root / "data", speakers=2, utterances=12, seed=5)
    cfg = micro_config(root / "unused", "data.val_fraction=0.34")
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda *a: None)
    return {"store": root / "store", "raw": data}


def _validated(data) -> set[int]:
    """The val utterances this rank's validation runs on (its real batches)."""
    s = data.val_sampler
    return {int(i) for b in s.batches(0)[:s.real_batches] for i in b}


def test_the_subset_depends_on_the_seed_only():
    a = capped_subset(100, 10, 7)
    assert a is not None and len(a) == 10 and np.array_equal(a, np.sort(a))
    assert np.array_equal(a, capped_subset(100, 10, 7))
    assert not np.array_equal(a, capped_subset(100, 10, 8))
    assert capped_subset(100, 0, 7) is None and capped_subset(10, 10, 7) is None


@pytest.mark.parametrize("kind", ["store", "raw"])
def test_validation_covers_exactly_the_cap_on_every_rank_layout_and_resume(sources, tmp_path,
                                                                          kind):
    cfg = micro_config(tmp_path, "data.val_fraction=0.34", f"data.max_val_utterances={CAP}",
                       "data.batch_frames=600")
    whole = open_train_data(cfg, sources[kind], CPU, DistInfo(), None)
    n_val = len(whole.val_sampler.mel_lengths)
    assert n_val > CAP  # the split is larger than the cap
    subset = _validated(whole)
    assert len(subset) == CAP
    assert subset == set(capped_subset(n_val, CAP, cfg.data.split_seed).tolist())
    for world in (2, 3):
        union: set[int] = set()
        for rank in range(world):
            data = open_train_data(cfg, sources[kind], CPU, DistInfo(rank=rank, world_size=world),
                                   None)
            union |= _validated(data)
        assert union == subset, f"world size {world}"
    # a resumed run (its checkpoint supplies vocabulary and statistics on the fly)
    state = {ck.VOCAB: whole.tokenizer.to_dict(),
             ck.MEL_MEAN: torch.as_tensor(whole.mel_mean), ck.MEL_STD: torch.as_tensor(whole.mel_std)}
    again = open_train_data(cfg, sources[kind], CPU, DistInfo(), state)
    assert _validated(again) == subset
    # no cap: the whole split
    free = micro_config(tmp_path, "data.val_fraction=0.34", "data.max_val_utterances=0",
                        "data.batch_frames=600")
    assert _validated(open_train_data(free, sources[kind], CPU, DistInfo(), None)) == \
        set(range(n_val))
