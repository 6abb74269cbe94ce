"""``myxtts doctor STORE`` on an XTTS store (``myxtts prepare --xtts``): its integrity (the
store's own verify: file table, checksums, and the invariants training relies on), the
XTTS-v2 model it was made for (the identity its manifest records: the hashes of the DVAE,
the mel statistics and the vocabulary, its languages), its size and splits, and the batch
plan the fine-tuning loader would use (``train.xtts.batches.xtts_plan``: the store's lengths
alone, no model needed), with the cost of its largest batch for the loader checks. With
``init_from``: that the XTTS-v2 folder is the model the store was made for
(``data.xtts_store.check_model``).

Imports are inside the functions, as in ``doctor.data``: the doctor runs (and says what is
missing) without numpy's or torch's stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from myxtts.config import Config, ConfigError, resolve_device
from myxtts.config.bounds import count
from myxtts.diagnose.doctor.check import Check, DataPlan, integrity

IN_FLIGHT = 2  # the XTTS loader's DataLoader: prefetch_factor 2 per worker
HASH_SHOWN = 12  # leading hex digits of a sha256 shown


def check_xtts_store(path: Path, cfg: Config, speed: Check | None,
                     init_from: str | Path | None = None) -> tuple[list[Check], DataPlan]:
    """The checks of the XTTS store at ``path`` (``speed``: its read-speed check, made before
    verify fills the page cache), and the plan the loader checks weigh: the build time and
    bytes of its largest batch, which each loader worker holds ``IN_FLIGHT`` of in shared
    memory (an empty plan when the store cannot be batched)."""
    # deferred: numpy and torch, which the doctor reports on rather than needs
    import torch

    from myxtts.data.feed.loader import plan_frames
    from myxtts.data.store import StoreError
    from myxtts.data.xtts_store import XttsStore
    from myxtts.model.xtts_v2.features import N_MELS
    from myxtts.train.xtts.batches import (
        XttsBatches,
        batch_shapes,
        largest_batch_cost,
        xtts_plan,
        xtts_sampler,
    )

    rebuild = f"myxtts prepare DATA --out {path} --xtts XTTS_DIR --force"
    failed = integrity("XTTS store", path, rebuild)
    if failed is not None:
        return [failed], DataPlan()
    try:
        train, val = XttsStore.open(path, "train"), XttsStore.open(path, "val")
    except StoreError as e:
        return [Check("XTTS store", "fail", str(e), rebuild)], DataPlan()
    splits = train.manifest.get("splits", {})
    hours = sum(float(splits.get(s, {}).get("hours", 0.0)) for s in ("train", "val"))
    checks = [Check("XTTS store", "ok", f"{path} verified (checksums, index, tokens and codes in "
                                        f"range); {len(train)} train + {len(val)} val "
                                        f"utterances, {hours:.2f} h, "
                                        f"{count(len(train.speakers), 'speaker')}"),
              Check("XTTS model", "ok", made_for(train.manifest))]
    if init_from is not None:
        checks.append(check_folder(path, init_from))
    if speed is not None:
        checks.append(speed)
    if len(train) == 0:
        return checks + [Check("batches", "fail", "the train split is empty",
                               f"prepare a dataset with more utterances ({rebuild})")], DataPlan()
    try:
        plan = xtts_plan(train, cfg, plan_frames(cfg))
    except ConfigError as e:
        return checks + [Check("batches", "fail", str(e), "--set data.batch_frames=N (the value "
                                                          "the message names)")], DataPlan()
    shapes = sorted(set(batch_shapes(plan, cfg)), key=lambda s: s.frames)
    checks.append(Check("batches", "ok", f"{count(len(shapes), 'bucket shape')} at data.batch_frames={plan_frames(cfg)} code "
                                         f"positions (T_codes:batch "
                                         + " ".join(f"{s.frames}:{s.batch}" for s in shapes) + ")"))
    # A run on the CPU has its loader make the voice segments' cloning mels (on a GPU the
    # step makes them): cost the batch as that loader builds it, so that the worker count
    # said here is the one training picks. The mels' cost does not depend on the statistics.
    stats = torch.ones(N_MELS) if _runs_on_cpu(cfg) else None
    batches = XttsBatches(train, plan, cfg.data.shuffle_seed, cfg, mel_stats=stats)
    cost = largest_batch_cost(batches, xtts_sampler(train, plan, cfg.data.shuffle_seed))
    return checks, DataPlan(batch_cost=cost, shm=(cost[1], IN_FLIGHT, "this XTTS store"))


def made_for(manifest: dict[str, Any]) -> str:
    """The XTTS-v2 model a store was made for, as its manifest's identity records it."""
    ident = manifest["identity"]
    added = manifest.get("added_languages") or {}
    grown = (f" (the vocabulary grown from {_h(ident['base_vocab_sha256'])} by "
             f"{', '.join(sorted(added))})" if ident["vocab_sha256"] != ident["base_vocab_sha256"]
             else "")
    return (f"made for the XTTS-v2 model whose dvae.pth, mel_stats.pth and vocab.json have "
            f"sha256 {_h(ident['dvae_sha256'])}..., {_h(ident['mel_stats_sha256'])}..., "
            f"{_h(ident['vocab_sha256'])}...{grown}; languages {', '.join(ident['languages'])}, "
            f"{ident['number_text_tokens']} text tokens")


def check_folder(path: Path, folder: str | Path) -> Check:
    """``folder`` is the XTTS-v2 model the store at ``path`` was made for."""
    # deferred: numpy, as above
    from myxtts.data.store import StoreError
    from myxtts.data.xtts_store import check_model

    if not Path(folder).is_dir():
        return Check("--init-from", "fail", f"{folder} is no folder",
                     "give the XTTS-v2 folder the store was prepared with")
    try:
        check_model(path, Path(folder))
    except StoreError as e:
        return Check("--init-from", "fail", str(e).split("; ", 1)[0],
                     str(e).split("; ", 1)[-1])
    return Check("--init-from", "ok", f"{folder} is the model {path} was made for (dvae.pth, "
                                      f"mel_stats.pth and vocab.json match)")


def _h(sha: str) -> str:
    return sha[:HASH_SHOWN]


def _runs_on_cpu(cfg: Config) -> bool:
    """Whether ``train.device`` puts the run on the CPU (an unusable setting counts as the
    CPU here: the doctor's device check names it)."""
    try:
        return resolve_device(cfg.train.device, "train.device").type == "cpu"
    except ConfigError:
        return True
