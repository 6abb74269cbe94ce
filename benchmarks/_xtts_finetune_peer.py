"""coqui-tts's XTTS-v2 GPT fine-tuning timed as ``xtts_finetune.py`` measures it against ours.

Run by the interpreter of the peer environment (``--peer-python``), never imported by
myxtts; ``xtts_finetune.py`` imports only :func:`peak_rss_mb`, :class:`PssPeak` and
:func:`serve` from it (standard library only), so that both sides count memory and answer
commands the same way:

    python _xtts_finetune_peer.py usable FOLDER DATA
    python _xtts_finetune_peer.py serve FOLDER DATA --batch-size B --workers W [--threads T]
        [--sample-pss]

``usable`` lists the clips of DATA (an LJSpeech-style folder: metadata.csv, wavs/) that
coqui's GPT trainer can learn from with FOLDER's vocabulary: no [UNK] token (its dataset
asserts on one and silently draws another clip instead), at most ``max_text_length``
tokens, audio of at least 0.5 s and at most ``max_wav_length`` samples. The benchmark
gives both sides only those, so both train on the same utterances.

``serve`` builds coqui's ``GPTTrainer`` on FOLDER's files the way its recipe
(``recipes/ljspeech/xtts_v2/train_gpt_xtts.py``) does: ``GPTArgs`` with the folder's
architecture, conditioning 66150-132300 samples, ``max_wav_length`` 255995,
``max_text_length`` 200, the folder's model.pth / dvae.pth / mel_stats.pth / vocab.json;
``XttsAudioConfig`` 22050 Hz; AdamW (betas 0.9/0.96, eps 1e-8, weight decay 1e-2 on
weights only), lr 5e-6, MultiStepLR. Its samples come from ``load_tts_samples`` with the
``ljspeech`` formatter (no eval split: every clip trains). The ``trainer`` package's
``Trainer`` object (loggers, output folders, checkpoints) is not built; its per-step work
is reproduced exactly:

- the loader is the model's own ``get_data_loader`` (``XTTSDataset``: per item the text
  tokenised, the clip decoded, then decoded again for the conditioning slice, its own
  ``collate_fn``; ``num_loader_workers`` workers, not persistent: a new epoch starts new
  workers, as the Trainer's epoch loop does);
- ``on_train_epoch_start``: the whole model in eval mode, the GPT in train mode;
- per step ``format_batch`` then ``format_batch_on_device`` (the conditioning mels and
  the DVAE codes, under no_grad), ``train_step`` (the GPT forward, the weighted losses),
  ``loss.backward()``, ``optimizer.step()``, ``zero_grad(set_to_none=True)`` and the
  losses read back as floats for logging: the Trainer's ``optimize`` with fp32,
  ``grad_clip`` 0 and gradient accumulation 1 (the recipe's 84 would only thin out the
  optimizer steps; both sides step every batch). The scheduler steps after each epoch
  (the config's ``scheduler_after_epoch``), so never inside a timed window.

It then answers the benchmark's commands on stdin (:func:`serve`, which ours uses too):
``steps N`` runs N optimizer steps and answers one JSON line with their seconds,
utterances, ``cpu_seconds`` (this process's CPU time, its loader workers' not counted),
``phases`` (the seconds spent waiting for the loader, formatting on the device,
in the forward, the backward and the optimizer) and the last loss; ``epoch`` does the same
to the end of the loader's pass under way (a whole pass when none is); ``finish`` answers
peak_rss_mb (see :func:`peak_rss_mb`), main_rss_mb, workers_rss_mb, loaded_rss_mb and
peak_pss_mb (see :class:`PssPeak`, sampled from before the model's build). Kept alive
between commands, the trainer can take turns with ours.

``torchaudio.load`` cannot decode here (this environment's torchaudio has no working
decoding backend), so coqui's ``load_audio`` is replaced, where its dataset module looks
it up, by one that decodes with soundfile and does the rest of the same work: channels
averaged, resampled with ``torchaudio.functional.resample`` when the file's rate differs,
the range checked and clipped to [-1, 1].
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RECIPE = {  # recipes/ljspeech/xtts_v2/train_gpt_xtts.py
    "min_conditioning_length": 66150, "max_conditioning_length": 132300,
    "max_wav_length": 255995, "max_text_length": 200}


# ---------------------------------------------------------------- memory (both sides use it)

def _descendants(pid: int) -> list[int]:
    """Pids of every live process below ``pid`` (children of all its threads, recursively)."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *_descendants(kid)]
    return found


def _proc_mb(pid: int, file: str, key: str) -> float:
    """A ``key: N kB`` line of ``/proc/PID/FILE`` in MiB; 0 once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/{file}").read_text()
    except OSError:
        return 0.0
    line = next((x for x in text.splitlines() if x.startswith(key + ":")), f"{key}: 0 kB")
    return int(line.split()[1]) / 1024


def peak_rss_mb() -> dict[str, float]:
    """Peak resident memory in MiB of this process and of its loader workers, read while the
    workers are still alive (call it before the loader's iterator is dropped).

    ``main_rss_mb``: this process's ``ru_maxrss``. ``workers_rss_mb``: the sum of the peak
    RSS (``VmHWM``) of every live descendant, or, when none is alive, the largest exited
    child's ``ru_maxrss``. ``peak_rss_mb``: their sum. Pages a forked worker still shares
    with its parent are counted in each process that touched them, so the sum is an upper
    bound of the tree's footprint, the same bound for both sides.
    """
    import os

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    live = sum(_proc_mb(pid, "status", "VmHWM") for pid in _descendants(os.getpid()))
    kids = live or resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mb": own + kids, "main_rss_mb": own, "workers_rss_mb": kids}


class PssPeak:
    """The largest proportional set size (PSS: each shared page split among the processes
    sharing it) of this process and its descendants together, sampled every ``every``
    seconds by a thread between ``start()`` and ``stop()`` (which returns it, in MiB). The
    tree's real footprint, unlike summed RSS peaks; a peak shorter than the period can be
    missed. One read of ``smaps_rollup`` walks a process's page tables: about 8 ms for a
    training process here, so the default period costs 4-8% of a core (the benchmark
    samples in its memory pass only)."""

    def __init__(self, every: float = 0.2) -> None:
        import threading

        self.every, self.peak = every, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> float:
        import os

        me = os.getpid()
        total = sum(_proc_mb(pid, "smaps_rollup", "Pss") for pid in [me, *_descendants(me)])
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self.sample()

    def start(self) -> PssPeak:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> float:
        self.sample()
        self._done.set()
        self._thread.join()
        return self.peak


# ---------------------------------------------------------------- coqui's trainer, built

def _patch_load_audio() -> None:
    """coqui's dataset decodes with ``torchaudio.load``, which has no backend here: the same
    work (decode, mono, resample when needed, range check, clip) with soundfile instead.
    Patched in the dataset module, whose functions look the name up there; forked loader
    workers inherit it."""
    import logging

    import soundfile as sf
    import torch
    import torchaudio
    from TTS.tts.layers.xtts.trainer import dataset

    log = logging.getLogger("TTS.tts.models.xtts")

    def load_audio(path, sampling_rate):
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)  # frames x channels
        audio = torch.from_numpy(data.T.copy())
        if audio.size(0) != 1:
            audio = audio.mean(dim=0, keepdim=True)
        if rate != sampling_rate:
            audio = torchaudio.functional.resample(audio, rate, sampling_rate)
        if torch.any(audio > 10) or not torch.any(audio < 0):
            log.error("Error with %s. Max=%.2f min=%.2f", path, audio.max(), audio.min())
        return audio.clip_(-1, 1)

    dataset.load_audio = load_audio


def build(folder: Path, batch_size: int, workers: int):
    """coqui's GPTTrainer and its config, set up as the recipe does, on ``folder``'s files."""
    import dataclasses

    from TTS.tts.configs.xtts_config import XttsAudioConfig
    from TTS.tts.layers.xtts.trainer.gpt_trainer import GPTArgs, GPTTrainer, GPTTrainerConfig

    saved = json.loads((folder / "config.json").read_text())
    fields = {f.name for f in dataclasses.fields(GPTArgs)}
    arch = {k: v for k, v in saved["model_args"].items() if k in fields}
    args = GPTArgs(**{**arch, **RECIPE, "debug_loading_failures": False,
                      "mel_norm_file": str(folder / "mel_stats.pth"),
                      "dvae_checkpoint": str(folder / "dvae.pth"),
                      "xtts_checkpoint": str(folder / "model.pth"),
                      "tokenizer_file": str(folder / "vocab.json"),
                      "gpt_use_masking_gt_prompt_approach": True,
                      "gpt_use_perceiver_resampler": saved["model_args"]["gpt_use_perceiver_resampler"]})
    config = GPTTrainerConfig(
        model_args=args, audio=XttsAudioConfig(sample_rate=22050, dvae_sample_rate=22050,
                                               output_sample_rate=24000),
        languages=saved.get("languages", ["en"]), batch_size=batch_size, eval_batch_size=batch_size,
        num_loader_workers=workers, optimizer="AdamW", optimizer_wd_only_on_weights=True,
        optimizer_params={"betas": [0.9, 0.96], "eps": 1e-8, "weight_decay": 1e-2}, lr=5e-06,
        lr_scheduler="MultiStepLR",
        lr_scheduler_params={"milestones": [50000 * 18, 150000 * 18, 300000 * 18], "gamma": 0.5,
                             "last_epoch": -1})
    return GPTTrainer(config), config


def samples(data: Path, config=None) -> list[dict]:
    """``data``'s clips through ``load_tts_samples`` (the ``ljspeech`` formatter: the
    metadata's third column, English) in ``config``'s ``datasets`` (a default trainer config
    when None); every clip trains."""
    from TTS.config.shared_configs import BaseDatasetConfig
    from TTS.tts.datasets import load_tts_samples
    from TTS.tts.layers.xtts.trainer.gpt_trainer import GPTTrainerConfig

    config = config or GPTTrainerConfig()
    config.datasets = [BaseDatasetConfig(formatter="ljspeech", dataset_name="ljspeech",
                                         path=str(data), meta_file_train="metadata.csv",
                                         language="en")]
    train, _ = load_tts_samples(config, eval_split=False)
    return train


def usable(folder: Path, data: Path) -> dict:
    """The clips the reference trainer accepts with ``folder``'s vocabulary (see the module
    docstring), by id, and why each other one is left out."""
    import soundfile as sf
    from TTS.tts.layers.xtts.tokenizer import VoiceBpeTokenizer

    tok = VoiceBpeTokenizer(str(folder / "vocab.json"))
    keep, dropped = [], {}
    for s in samples(data):
        clip = Path(s["audio_file"]).stem
        ids = tok.encode(s["text"], s["language"])
        frames = sf.info(s["audio_file"]).frames
        if 1 in ids or 0 in ids:
            dropped[clip] = "[UNK] or [STOP] in its tokens"
        elif len(ids) > RECIPE["max_text_length"]:
            dropped[clip] = f"{len(ids)} text tokens"
        elif not 0.5 * 22050 <= frames <= RECIPE["max_wav_length"]:
            dropped[clip] = f"{frames} samples"
        else:
            keep.append(clip)
    return {"ids": keep, "dropped": dropped}


class PeerTrainer:
    """coqui's trainer on ``folder``'s files over ``data``, ready to step (see the module
    docstring): :meth:`steps` runs optimizer steps, :meth:`epoch` the rest of a pass over
    the data, :meth:`finish` reads the memory peaks."""

    def __init__(self, folder: Path, data: Path, batch_size: int, workers: int, threads: int,
                 sample_pss: bool = True):
        import torch

        # the sampler walks the page tables of the whole process tree (~8 ms a time, 4-8%
        # of a core): only the memory pass runs it, never a timed turn
        self.pss = PssPeak().start() if sample_pss else None
        _patch_load_audio()
        torch.set_num_threads(threads)  # coqui's dataset module sets 1 when imported
        self.model, config = build(folder, batch_size, workers)
        self.loader = self.model.get_data_loader(config, is_eval=False,
                                                 samples=samples(data, config), verbose=False)
        self.optimizer = self.model.get_optimizer()
        self.model.get_scheduler([self.optimizer])  # stepped after epochs only: never here
        self.model.eval()  # GPTTrainer.on_train_epoch_start
        self.model.xtts.gpt.train()
        self.batch_size, self.workers = batch_size, workers
        self.loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.batches, self.consumed = iter(self.loader), 0

    def _next(self):
        try:
            batch = next(self.batches)
        except StopIteration:  # the Trainer's next epoch: a new pass, new workers
            self.batches, self.consumed = iter(self.loader), 0
            batch = next(self.batches)
        self.consumed += 1
        return batch

    def steps(self, n: int) -> dict:
        """Run ``n`` optimizer steps; their seconds, utterances, ``phases`` and last loss."""
        model, optimizer = self.model, self.optimizer
        phases = dict.fromkeys(("loader", "on_device", "forward", "backward", "optimizer"), 0.0)
        utterances, logged = 0, {}
        cpu = time.process_time()
        t0 = start = time.perf_counter()
        for _ in range(n):
            batch = self._next()
            t1 = time.perf_counter()
            batch = model.format_batch_on_device(model.format_batch(batch))
            t2 = time.perf_counter()
            _, losses = model.train_step(batch, None)
            t3 = time.perf_counter()
            losses["loss"].backward()
            t4 = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            logged = {k: float(v.detach()) for k, v in losses.items()}  # the Trainer's logging
            t5 = time.perf_counter()
            for name, (a, b) in zip(phases, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))):
                phases[name] += b - a
            t0 = t5
            utterances += int(batch["text_lengths"].shape[0])
        return {"seconds": time.perf_counter() - start, "steps": n, "utterances": utterances,
                "cpu_seconds": time.process_time() - cpu, "phases": phases,
                "loss": logged.get("loss")}

    def epoch(self) -> dict:
        """:meth:`steps` to the end of the loader's pass under way (a whole new pass when
        the last one ended: its workers start inside it, as in the Trainer's epoch)."""
        left = len(self.loader) - self.consumed
        if left == 0:
            self.batches, self.consumed, left = iter(self.loader), 0, len(self.loader)
        return self.steps(left)

    def finish(self) -> dict:
        """The memory peaks (:func:`peak_rss_mb` while the loader's workers are alive, the
        sampled PSS peak), then the loader's workers are let go."""
        import torch

        memory = peak_rss_mb()
        memory["peak_pss_mb"] = None if self.pss is None else self.pss.stop()
        self.batches = None
        return {**memory, "loaded_rss_mb": self.loaded, "batch_size": self.batch_size,
                "workers": self.workers, "threads": torch.get_num_threads()}


def serve(make, commands=None) -> None:
    """Build a trainer with ``make()`` and answer the benchmark's commands, one per line of
    ``commands`` (stdin): ``steps N`` (runs N optimizer steps, answers what
    :meth:`PeerTrainer.steps` returns), ``epoch`` (the same to the end of the data's pass
    under way, :meth:`PeerTrainer.epoch`) and ``finish`` (answers the memory peaks, then
    returns). Answers are JSON lines on the process's original stdout, which is then
    pointed at stderr: whatever else prints (a library's log) never mixes into them."""
    import os

    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def answer(obj: dict) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    trainer = make()
    answer({"ready": True})
    for line in commands if commands is not None else sys.stdin:
        command, *arg = line.split()
        if command == "steps":
            answer(trainer.steps(int(arg[0])))
        elif command == "epoch":
            answer(trainer.epoch())
        elif command == "finish":
            answer(trainer.finish())
            return
        else:
            raise SystemExit(f"unknown command {line.strip()!r}: steps N, epoch or finish")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("usable", "serve"))
    p.add_argument("folder", type=Path)
    p.add_argument("data", type=Path)
    p.add_argument("--batch-size", type=int, default=3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sample-pss", action="store_true", help="sample the process tree's PSS "
                   "(the memory pass; it costs CPU time)")
    a = p.parse_args()
    if a.command == "usable":
        print(json.dumps(usable(a.folder, a.data)))
    else:
        serve(lambda: PeerTrainer(a.folder, a.data, a.batch_size, a.workers, a.threads,
                                  a.sample_pss))


if __name__ == "__main__":
    main()
