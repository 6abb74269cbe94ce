"""What does a checkpoint save cost the training loop? The step gap at a save, before and after.

    python benchmarks/checkpoint_save.py [--preset base] [--device auto|cpu|cuda]
        [--steps N] [--every K] [--step-ms MS] [--threads N]

A checkpoint of the ``--preset`` model as training saves it: weights, AdamW state (after
one real step of the engine, so it exists) and the weights' moving average, ``--device``
resident (base: ~105 M parameters, ~1.7 GB of checkpoint). Then two arms in one run, each
``--steps`` loop iterations of a stand-in step (a fixed amount of matrix work on the device,
``--step-ms`` long, synchronised at its end as a log step would be), saving every ``--every``
iterations into a run folder:

* synchronous (the baseline): the save on the training thread, as ``CheckpointManager.save``
  does it (``torch.save`` into memory, a checksum pass, the atomic write);
* background: ``BackgroundSaver`` (``artifacts.saver``): a host copy on the training thread,
  the serialisation, checksum and write in a background thread, at most one in flight.

Per arm: the median ordinary iteration, the median iteration that saved, and their
difference (the gap a save adds to the loop); the background arm's gap as a ratio of the
synchronous one; and the whole loop until the last save is on disk, which also counts what
the background work takes from the iterations it overlaps (on a CPU the step and the save
share the same cores; on a GPU the step's work is the device's). Every checkpoint written is loaded back and compared with the state it
was taken from (the arms write the same checkpoints).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import common


def build_state(preset: str, device: str, tmp: Path) -> tuple[dict, float, object]:
    """The engine's checkpoint entries for ``preset`` after one step, their size in GB, and
    the engine (alive: its tensors are the state's)."""
    import torch

    from myxtts.artifacts import checkpoint as ck
    from myxtts.config import load_config, resolve_device
    from myxtts.data.batch import BatchShape
    from myxtts.model.dummy import worst_case_batch
    from myxtts.model.xtts import build_model
    from myxtts.train.distributed import DistInfo
    from myxtts.train.engine import TrainEngine

    cfg = load_config(preset=preset, overrides=[f"train.device={device}", "train.compile=off",
                                                "train.cuda_graphs=off",
                                                f"train.output_dir={tmp / 'unused'}"])
    dev = resolve_device(cfg.train.device, "train.device")
    torch.manual_seed(0)
    engine = TrainEngine(cfg, build_model(cfg, 64, 1, None, None).to(dev), dev, DistInfo())
    shape = BatchShape(1, 16, 32, cfg.data.ref_frames, cfg.audio.n_mels)
    engine.step([worst_case_batch(shape, 64, 1, dev)])  # AdamW state exists from here on
    parts = engine.state_dict()
    state = ck.compose(ck.TrainingProgress(step=1), parts, {"config": cfg.to_dict()})
    nbytes = 0

    def count(v: object) -> None:
        nonlocal nbytes
        if isinstance(v, torch.Tensor):
            nbytes += v.numel() * v.element_size()
        elif isinstance(v, dict):
            for x in v.values():
                count(x)
        elif isinstance(v, list | tuple):
            for x in v:
                count(x)

    count(state)
    return state, nbytes / 1e9, engine


def stand_in_step(device: object, size: int, reps: int) -> None:
    import torch

    a = torch.ones(size, size, device=device)
    for _ in range(reps):
        a = torch.tanh(a @ a * (1.0 / size))
    if a.device.type == "cuda":
        torch.cuda.synchronize(a.device)


def calibrate(device: object, target_ms: float) -> tuple[int, int]:
    """(matrix size, repetitions) of a stand-in step of about ``target_ms``."""
    size, reps = 512, 1
    start = time.perf_counter()
    stand_in_step(device, size, 4)
    per_rep = (time.perf_counter() - start) / 4
    reps = max(1, round(target_ms / 1e3 / per_rep))
    return size, reps


def arm(name: str, state: dict, tmp: Path, args: argparse.Namespace, device: object,
        work: tuple[int, int]) -> dict:
    from myxtts.artifacts.runs import CheckpointManager
    from myxtts.artifacts.saver import BackgroundSaver

    manager = CheckpointManager(tmp / name / "checkpoints", keep_last=2)
    saver = BackgroundSaver(manager, device) if name == "background" else None
    if saver is not None:
        saver.reserve(state)  # as training does before step 1: the host buffers laid out
    ordinary, saving = [], []
    begin = time.perf_counter()
    for i in range(1, args.steps + 1):
        start = time.perf_counter()
        if saver is not None:
            saver.check()  # a failed save is raised at the next step
        stand_in_step(device, *work)
        if i % args.every == 0:
            if saver is None:
                manager.save(state, i)
            else:
                saver.save(state, i)
            saving.append(time.perf_counter() - start)
        else:
            ordinary.append(time.perf_counter() - start)
    if saver is not None:
        saver.close()
    return {"ordinary": statistics.median(ordinary), "saving": statistics.median(saving),
            "whole": time.perf_counter() - begin, "saves": len(saving), "folder": manager.dir}


def same_checkpoints(a: Path, b: Path, state: dict) -> bool:
    """Both arms' newest checkpoints load (checksum checked) and hold ``state``'s tensors."""
    import torch

    from myxtts.artifacts import checkpoint as ck

    def flat(v: object, key: str = "") -> dict:
        if isinstance(v, torch.Tensor):
            return {key: v.detach().cpu()}
        if isinstance(v, dict):
            return {k2: t for k, x in v.items() for k2, t in flat(x, f"{key}/{k}").items()}
        return {}

    want = flat({k: v for k, v in state.items() if k != ck.FORMAT})
    for folder in (a, b):
        path = sorted(folder.glob("ckpt_*.pt"))[-1]
        got = flat(ck.load(path))
        if any(k not in got or not torch.equal(got[k], v) for k, v in want.items()):
            return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="base", choices=["tiny", "small", "base"])
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")
    p.add_argument("--steps", type=int, default=24, help="loop iterations per arm (default 24)")
    p.add_argument("--every", type=int, default=6, help="a save every K iterations (default 6)")
    p.add_argument("--step-ms", type=float, default=200.0,
                   help="length of the stand-in step (default 200)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = p.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="myxtts-bench-save-") as tmp_name:
        tmp = Path(tmp_name)
        common.say(f"building the {args.preset} engine's state")
        state, gb, engine = build_state(args.preset, args.device, tmp)
        device = engine.device
        work = calibrate(device, args.step_ms)
        results = {}
        for name in ("synchronous", "background"):
            common.say(f"{name}: {args.steps} iterations, a save every {args.every}")
            results[name] = arm(name, state, tmp, args, device, work)
        same = same_checkpoints(results["synchronous"]["folder"],
                                results["background"]["folder"], state)
    gap = {k: r["saving"] - r["ordinary"] for k, r in results.items()}
    head = [f"{args.preset}: checkpoint {gb:.2f} GB on {device}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; stand-in step ~{args.step_ms:g} ms; "
            f"{args.steps} iterations per arm, a save every {args.every}; medians"]
    rows = [
        ("ordinary iteration ms", [f"{1e3 * r['ordinary']:.0f}" for r in results.values()]),
        ("iteration with a save ms", [f"{1e3 * r['saving']:.0f}" for r in results.values()]),
        ("gap a save adds ms", [f"{1e3 * g:.0f}" for g in gap.values()]),
        ("gap vs synchronous", ["1.000", f"{gap['background'] / gap['synchronous']:.3f}"
                                if gap["synchronous"] > 0 else "-"]),
        ("whole loop s (until the last save is written)",
         [f"{r['whole']:.1f}" for r in results.values()]),
        ("whole loop vs synchronous",
         ["1.000", f"{results['background']['whole'] / results['synchronous']['whole']:.3f}"]),
        ("saves / checkpoints equal the state", [f"{r['saves']} / {same}"
                                                 for r in results.values()]),
    ]
    print(common.table(list(results), rows, head, "arm"))


if __name__ == "__main__":
    main()
