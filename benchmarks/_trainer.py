"""The run the training benchmarks time: the recipe ``myxtts train`` runs
(``myxtts.train.tts.TTSRecipe``, set up as training sets it up: memory caps, data and its
real loader, model, the engine with its optimizer, schedule, scaler, moving average,
compiled blocks and CUDA graphs, ready for every bucket shape: auto batch sizes, warm-up,
capture, shrink), plus staged batches and timed windows. A benchmark cannot leave out a part
of what the trainer does on that device: an arm that differs from ``myxtts train`` differs
by config overrides only (``--set train.compile=off``, ...), exactly as a user's run would.

A *window* is ``steps`` optimizer steps run by the training loop itself
(``Recipe.run_steps``: ``StepTimer`` around each fetch of a step's micro-batches; one host
sync at the end, then the loop's log-step read-back outside the timing). *Pre-staged*
batches sit in device memory before timing: one per bucket shape, replayed in whatever shape
order a window asks for -- the step's speed of light, since no input pipeline can beat data
that costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import median, say

Staged = dict[tuple, tuple[dict, int]]  # shape key -> (device batch, real frames)


class Trainer:
    """One run as ``myxtts train`` builds it for ``preset`` on ``data`` (a store or a raw
    dataset), into ``run_dir`` (its auto batch-size cache). ``overrides``: config settings,
    as ``--set`` gives them. ``setup_s``: seconds to build it (data, model, engine started up);
    ``report``: the engine's warm-up report (None where nothing was warmed up)."""

    def __init__(self, data: Path, preset: str, batch_frames: int | None, overrides: list[str],
                 threads: int | None, run_dir: Path) -> None:
        import torch

        from myxtts.config import load_config
        from myxtts.train.tts import TTSRecipe

        if threads:
            torch.set_num_threads(threads)
        sets = ([f"data.batch_frames={batch_frames}"] if batch_frames else []) + list(overrides)
        cfg = load_config(preset=preset, overrides=[*sets, f"train.output_dir={run_dir}"])
        self.set_up(TTSRecipe(cfg, data, show_progress=False), cfg.audio.frames_per_second)
        self.data = self.run.data

    def set_up(self, run: Any, fps: float) -> None:
        """Set ``run`` (a recipe, not set up yet) up, timed, and take what the windows read
        from it; ``fps``: the frames a second of audio has in its batches."""
        started = time.perf_counter()
        self.run = run
        run.setup()
        self.setup_s = time.perf_counter() - started
        self.cfg, self.engine = run.cfg, run.engine
        self.device, self.record = run.device, run.record
        self.cuda = self.device.type == "cuda"
        startup = self.engine.startup
        self.report = startup.report if startup is not None else None
        self.params_m = sum(p.numel() for p in self.engine.model.parameters()) / 1e6
        self.fps = fps

    @staticmethod
    def key(batch: dict) -> tuple:
        """A batch's shape key (the FLOP counter's and the staging's)."""
        from myxtts.observe.flops import batch_key

        return batch_key(batch)

    @property
    def batch_sizes(self) -> list[int]:
        """Each bucket's batch size, as the engine fitted them."""
        return list(self.data.sampler.bucket_batch_sizes)

    def shapes(self) -> list[Any]:
        """The bucket shapes of the run (``BatchShape``), longest first."""
        from myxtts.train.data import bucket_shapes

        return sorted(set(bucket_shapes(self.data.sampler, self.cfg)), key=lambda s: -s.frames)

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def stage(self, loader: Any = None, sampler: Any = None) -> Staged:
        """One device batch per bucket shape, from a loader of its own (the run's sampler and
        stream stay untouched). ``loader`` / ``sampler``: another source of the same plan
        (default: the store's)."""
        from myxtts.data.batch import to_model_dtypes
        from myxtts.data.feed.loader import build_loader

        if loader is None:
            loader, sampler = build_loader(self.data.loader.batches.store, self.cfg,
                                           device=self.device, num_workers=0,
                                           plan=self.data.sampler.plan)
        wanted, staged = set(self.data.sampler.shapes()), {}
        for epoch in range(4):  # every bucket has batches in every epoch; guard anyway
            sampler.set_epoch(epoch)
            for batch in loader:
                key = self.key(batch)
                if key in wanted and key not in staged:
                    staged[key] = (to_model_dtypes({k: v.to(self.device) for k, v in batch.items()}),
                                   int(batch["mel_lengths"].sum()))
            if len(staged) == len(wanted):
                break
        if set(staged) != wanted:
            raise RuntimeError(f"no batch of shape(s) {sorted(wanted - set(staged))} in 4 epochs")
        self.sync()
        return staged

    def prime(self, staged: Staged, keys: list[tuple] | None = None) -> None:
        """Each shape of ``keys`` (default: every staged one) once through the engine,
        untimed: first-call allocations and set-up."""
        keys = sorted(staged) if keys is None else keys
        accum = self.cfg.train.grad_accum_steps
        self.window(staged_fetch(staged, [k for k in keys for _ in range(accum)]), len(keys))

    def upcoming(self, n: int) -> list[tuple[tuple, int]]:
        """(shape key, real frames) of the next ``n`` batches the run's stream yields, from
        the sampler's deterministic plan and the stream's position in ``record``."""
        s, epoch, pos = self.data.sampler, self.record.epoch, self.record.batches_consumed
        out: list[tuple[tuple, int]] = []
        while len(out) < n:
            plan = [((len(b), s.text_caps[s.bucket_of[b[0]]], s.boundaries[s.bucket_of[b[0]]]),
                     int(s.mel_lengths[b].sum())) for b in s.batches(epoch)]
            out += plan[pos:pos + n - len(out)]
            epoch, pos = epoch + 1, 0
        return out

    def window(self, batches: Iterator[tuple[dict, int]], n_steps: int, flops: Any = None,
               gpu: Any = None) -> dict[str, float]:
        """``n_steps`` optimizer steps as the loop runs them; one sync at the end."""
        from myxtts.observe.flops import achieved_tflops
        from myxtts.observe.meters import StepTimer

        self.sync()  # the previous window's queued work is not this window's
        shapes = ShapeCount(self.key)
        if gpu is not None:
            gpu.start()
        timer = StepTimer(self.device)
        self.run.run_steps(n_steps, source=batches, timer=timer, watch=shapes)
        keys = shapes.keys
        iv = timer.collect()
        util = gpu.stop() if gpu is not None else None
        self.engine.read()  # the loop's log-step read-back, outside the timing
        out = {"steps_per_s": iv.steps_per_s, "utt_per_s": iv.utterances_per_s,
               "audio_s_per_s": iv.audio_s_per_s, "frames_per_s": iv.audio_s_per_s * self.fps,
               "wait_share": iv.data_wait_share, "seconds": iv.seconds}
        if flops is not None:
            out["tflops"] = achieved_tflops(flops.total(keys), iv.seconds)
        if util is not None:
            out["gpu_util"] = util
        return out

    def close(self) -> None:
        """Free the run's device memory (its graphs' pool included) before the next arm."""
        import gc

        import torch

        self.run.cleanup()
        self.run = self.engine = self.data = None  # type: ignore[assignment]
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


class ShapeCount:
    """A window's view of its steps (``train.recipe.StepWatch``): every batch's shape key
    (``key(batch)``)."""

    def __init__(self, key: Any) -> None:
        self.key, self.keys = key, []

    def fetching(self) -> None:
        pass  # (the window's timer times the fetch)

    def fetched(self) -> None:
        pass

    def stepped(self, micro: list[dict], frames: int) -> None:
        self.keys += [self.key(b) for b in micro]


def staged_fetch(staged: Staged, keys: list[tuple]) -> Iterator[tuple[dict, int]]:
    """The staged batches of ``keys``, in that order."""
    return (staged[k] for k in keys)


class Paired:
    """One run fed by its real input path (the recipe's stream: loader -> side-stream
    prefetch) and by pre-staged batches in the same shape order, window by window. ``lead``:
    untimed loader steps before each loader window; ``exact``: a batch matches the plan only
    with its real frames too (else its shape alone); ``gpu``: a ``GpuUtilSampler`` each
    window runs (its mean utilisation in the window's figures); ``flops``: the step's FLOP
    counter (``total(keys)``; the windows' TFLOP/s)."""

    def __init__(self, t: Trainer, staged: Staged, lead: int = 0, exact: bool = True,
                 gpu: Any = None, flops: Any = None) -> None:
        self.t, self.staged, self.lead, self.exact = t, staged, lead, exact
        self.gpu, self.flops = gpu, flops
        self.accum = t.cfg.train.grad_accum_steps
        self.stream = t.run.stream()
        self.mismatches = 0
        self.windows: dict[str, list[dict]] = {"loader": [], "pre-staged": []}
        self.plan: list[tuple] = []

    def loader(self, n_steps: int) -> Iterator[tuple[dict, int]]:
        """The stream's batches of ``n_steps`` steps, each checked against the plan (read
        now, before any window times them)."""
        plan = self.t.upcoming(n_steps * self.accum)

        def batches() -> Iterator[tuple[dict, int]]:
            for want in plan:
                batch, frames = next(self.stream)
                got = (self.t.key(batch), frames)
                self.mismatches += (got if self.exact else got[0]) != (want if self.exact else want[0])
                yield batch, frames

        return batches()

    def round(self, r: int, steps: int) -> None:
        """A loader and a pre-staged window of ``steps`` on the same shapes (A/B, then B/A)."""
        a = self.accum
        self.plan = [k for k, _ in self.t.upcoming((self.lead + steps) * a)][self.lead * a:]
        for kind in (["loader", "pre-staged"] if r % 2 == 0 else ["pre-staged", "loader"]):
            if kind == "loader" and self.lead:  # what was buffered meanwhile is no free batch
                self.t.window(self.loader(self.lead), self.lead)
            batches = self.loader(steps) if kind == "loader" else staged_fetch(self.staged, self.plan)
            self.windows[kind].append(self.t.window(batches, steps, self.flops, self.gpu))

    def result(self) -> dict[str, Any]:
        """Per-round ratios of steps/s, medians per kind, shape-order mismatches."""
        w = self.windows
        out: dict[str, Any] = {k: {m: median([x[m] for x in v]) for m in v[0]} for k, v in w.items()}
        out.update(ratios=[a["steps_per_s"] / b["steps_per_s"]
                           for a, b in zip(w["loader"], w["pre-staged"])],
                   mismatches=self.mismatches)
        return out

    def close(self) -> None:
        self.t.run.close_stream()  # stops an on-the-fly data role's producer thread


def loader_ratio(t: Trainer, staged: Staged, steps: int, rounds: int, warmup: int,
                 name: str, gpu: Any = None, flops: Any = None) -> dict[str, Any]:
    """The run's real input path against the same engine fed pre-staged batches in the same
    shape order, in interleaved windows after ``warmup`` untimed loader steps (``gpu``,
    ``flops``: see :class:`Paired`)."""
    pair = Paired(t, staged, gpu=gpu, flops=flops)
    t.window(pair.loader(warmup), warmup)
    for r in range(rounds):
        pair.round(r, steps)
        say(f"{name}: round {r + 1}/{rounds}: " + ", ".join(
            f"{a} {w[-1]['steps_per_s']:.2f} steps/s" for a, w in pair.windows.items()))
    out = pair.result()
    pair.close()
    return out
