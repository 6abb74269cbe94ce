"""The XTTS-v2 fine-tuning run the benchmarks time: the recipe ``myxtts train STORE
--init-from XTTS_DIR`` runs (``myxtts.train.xtts.XttsRecipe``: the store's loader, the GPT
with its optimizer, auto batch sizes, compiled blocks and CUDA graphs where the config asks
for them), with ``_trainer``'s staged batches and timed windows (``Paired``,
``loader_ratio``). As there, an arm differs from ``myxtts train`` by config overrides only.

A batch's shape key is ``(B, L_text, T_codes)`` (``train.xtts.flops.xtts_batch_key``), its
frames the clips' real codes (what the run's progress counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _trainer import Staged, Trainer


class XttsTrainer(Trainer):
    """One fine-tuning run of the XTTS-v2 ``folder`` on the XTTS ``store``, into ``run_dir``,
    with the ``xtts-finetune`` preset and ``overrides`` (``--set`` syntax)."""

    def __init__(self, folder: Path, store: Path, overrides: list[str], threads: int | None,
                 run_dir: Path) -> None:
        import torch

        from myxtts.cli.common import config_file
        from myxtts.config import load_config
        from myxtts.train.xtts.recipe import CODES_PER_SECOND, XttsRecipe

        if threads:
            torch.set_num_threads(threads)
        cfg = load_config(config_file("xtts-finetune"), None,
                          [*overrides, f"train.output_dir={run_dir}"])
        self.set_up(XttsRecipe(cfg, store, init_from=folder, show_progress=False),
                    CODES_PER_SECOND)
        self.data = None
        self.batches = self.run.loader.batches  # the loader's batch builder (same plan, seed)

    @staticmethod
    def key(batch: dict) -> tuple:
        from myxtts.train.xtts.flops import xtts_batch_key

        return xtts_batch_key(batch)

    @property
    def batch_sizes(self) -> list[int]:
        return list(self.run.sampler.bucket_batch_sizes)

    def shapes(self) -> list[Any]:
        from myxtts.train.xtts.batches import batch_shapes

        return sorted(set(batch_shapes(self.run.sampler.plan, self.cfg)), key=lambda s: -s.frames)

    def _planned(self, epoch: int, indices: list[int]) -> tuple[tuple, int]:
        """(key, real codes) of the batch the loader builds of ``indices``, without building
        it: the widths as ``XttsBatches.batch`` takes them."""
        b, store = self.batches, self.batches.store
        longest = int(b.positions[indices].max())
        if b.trim:
            width_c, width_t = longest, max(int(store.text_lengths[i]) for i in indices)
        else:
            width_c, width_t = b.plan.shape_for(longest)
        return (len(indices), int(width_t), int(width_c)), int(store.code_lengths[indices].sum())

    def upcoming(self, n: int) -> list[tuple[tuple, int]]:
        return [(key, frames) for key, frames, _, _ in self._upcoming(n)]

    def _upcoming(self, n: int) -> list[tuple[tuple, int, int, list[int]]]:
        s, epoch, pos = self.run.sampler, self.record.epoch, self.record.batches_consumed
        out: list[tuple[tuple, int, int, list[int]]] = []
        while len(out) < n:
            for indices in s.batches(epoch)[pos:pos + n - len(out)]:
                key, frames = self._planned(epoch, indices)
                out.append((key, frames, epoch, indices))
            epoch, pos = epoch + 1, 0
        return out

    def stage(self, steps: int) -> Staged:  # type: ignore[override]
        """One device batch per shape key among the next ``steps`` steps' batches (on a GPU
        one per bucket; an eager CPU step cuts each batch to its own widths, so there one per
        distinct batch), built by the run's own batch builder."""
        from myxtts.data.batch import to_model_dtypes

        staged: Staged = {}
        for key, frames, epoch, indices in self._upcoming(steps * self.cfg.train.grad_accum_steps):
            if key not in staged:
                batch = self.batches.batch(epoch, indices)
                staged[key] = (to_model_dtypes({k: v.to(self.device) for k, v in batch.items()}),
                               frames)
        self.sync()
        return staged
