"""``myxtts doctor``'s data checks: the store or dataset given, and what its loader needs.

Why apart from ``environment``: these read the data (checksums, read speed, clip headers)
and size the loader; ``myxtts.data`` is imported inside the functions, so the doctor still
runs (and says so) without soundfile or soxr. Shared memory: each store-loader worker holds
``slots_per_worker`` /dev/shm slots sized for the largest bucket; Docker's default
64 MB /dev/shm cannot hold them, and workers then die with a bus error mid-epoch. The need is
exact with a healthy store, estimated from the config otherwise (and for on-the-fly
training's raw audio batches).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

from myxtts.config import Config, ConfigError
from myxtts.config.bounds import count
from myxtts.diagnose.doctor.check import Check, DataPlan, integrity

MIN_READ_MBS = 50.0  # below this, reading a store can starve a GPU between page-cache hits
READ_LIMIT = 2 << 30  # bytes of the mel file timed at most (keeps doctor in seconds)
READ_CHUNK = 16 << 20
MIN_TIMED_BYTES = 64 << 20  # a smaller file reads too fast to judge the disk by
ONTHEFLY_IN_FLIGHT = 3  # on-the-fly loader: prefetch_factor 2 per worker + the batch being read


def check_data(cfg: Config, path: str | Path | None, read_limit: int = READ_LIMIT,
               init_from: str | Path | None = None) -> tuple[list[Check], DataPlan]:
    """The checks of the store or dataset at ``path`` (none without a path), and the plan
    the loader checks size from. ``init_from``: an XTTS store's model folder, checked."""
    if path is None:
        return [], DataPlan()
    path = Path(path).expanduser()
    if not path.exists():
        return [Check("data", "fail", f"{path} does not exist",
                       "pass a store from `myxtts prepare DATA --out STORE`, or a dataset folder")
                ], DataPlan()
    try:  # deferred: the doctor runs without soundfile or soxr (module doc)
        from myxtts.data.store.format import AUDIO_FILE, store_state
        from myxtts.data.xtts_store import is_xtts_store
    except (ImportError, OSError) as e:
        return [Check("data", "fail", f"cannot load myxtts.data ({type(e).__name__}: {e})",
                       "install the missing package named above")], DataPlan()
    try:
        if is_xtts_store(path):  # its own checks; the read speed timed before verify's hashing
            from myxtts.diagnose.doctor.xtts import check_xtts_store  # deferred: torch

            return check_xtts_store(path, cfg, check_read_speed(path, read_limit, AUDIO_FILE),
                                    init_from)
        if store_state(path) in ("complete", "partial"):
            return check_store(path, cfg, read_limit)
        if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
            return check_run(path), DataPlan()
        return check_dataset(path, cfg), DataPlan(on_the_fly=True)
    except Exception as e:  # unreadable files, a broken clip the readers did not expect:
        # a failed check with the cause, never a traceback that hides the other checks
        first = (str(e).strip().splitlines() or [""])[0]
        return [Check("data", "fail", f"{path}: {type(e).__name__}: {first}",
                      f"fix the file named above, then `myxtts inspect-data {path}` or "
                      f"`myxtts prepare --verify {path}`")], DataPlan()


def check_store(path: Path, cfg: Config, read_limit: int = READ_LIMIT
                ) -> tuple[list[Check], DataPlan]:
    """Integrity (``verify_store``), features matching ``cfg``, batching, read speed."""
    # deferred: the doctor runs without soundfile or soxr (module doc)
    from myxtts.data.feed.loader import bucket_plan
    from myxtts.data.store import FeatureStore, StoreError
    from myxtts.data.store.format import store_state

    rebuild = f"myxtts prepare DATA --out {path} --force"
    if store_state(path) == "partial":
        rebuild = f"re-run the same `myxtts prepare DATA --out {path}` to resume it"
    speed = check_read_speed(path, read_limit)  # first: verify's hashing fills the page cache
    failed = integrity("store", path, rebuild)
    if failed is not None:
        return [failed], DataPlan()
    checks = []
    try:
        store = FeatureStore.open(path, "train", cfg)
    except StoreError as e:
        return [Check("store", "fail", str(e), rebuild)], DataPlan()
    splits = store.manifest.get("splits", {})
    count = {s: int(splits.get(s, {}).get("utterances", 0)) for s in ("train", "val")}
    hours = sum(float(splits.get(s, {}).get("hours", 0.0)) for s in ("train", "val"))
    checks.append(Check("store", "ok", f"{path} verified (checksums, index); {count['train']} "
                                        f"train + {count['val']} val utterances, {hours:.2f} h, "
                                        f"{len(store.speakers)} speakers"))
    if speed is not None:
        checks.append(speed)
    if len(store) == 0:
        return checks + [Check("batches", "fail", "the train split is empty",
                                f"prepare a dataset with more utterances ({rebuild})")], DataPlan()
    try:
        plan = bucket_plan(store.mel_lengths, store.token_lengths, cfg)
    except ConfigError as e:
        return checks + [Check("batches", "fail", str(e), "--set data.batch_frames=N (the "
                                "value the message names)")], DataPlan()
    from myxtts.data.feed.loader import store_batch_cost  # deferred: as above

    return checks, DataPlan(False, plan, store.n_mels,
                            store_batch_cost(store, cfg))


def read_file(path: Path, limit: int = READ_LIMIT) -> tuple[int, float]:
    """``(bytes, seconds)`` reading ``path`` from its start in large chunks, up to ``limit``
    bytes. The file's cached pages are dropped first where the OS allows, so the figure is
    the disk's rather than the page cache's."""
    buf = memoryview(bytearray(READ_CHUNK))
    n = 0
    with open(path, "rb", buffering=0) as fh:
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
        start = time.perf_counter()
        while n < limit:
            k = fh.readinto(buf[:min(READ_CHUNK, limit - n)])
            if not k:
                break
            n += k
        return n, time.perf_counter() - start


def check_read_speed(path: Path, limit: int = READ_LIMIT, name: str | None = None
                     ) -> Check | None:
    """How fast the train split's mel file (or ``name``) reads; None when there is none."""
    from myxtts.data.store.format import MEL_FILE  # deferred: no soundfile needed (module doc)

    name = name or MEL_FILE
    f = path / "train" / name
    if not f.is_file() or f.stat().st_size == 0:
        return None
    total = f.stat().st_size
    n, seconds = read_file(f, limit)
    mbs = n / 1e6 / max(seconds, 1e-9)
    part = "" if n >= total else f", the first {n / 1e6:.0f} of {total / 1e6:.0f} MB"
    found = (f"{mbs:.0f} MB/s reading train/{name} ({n / 1e6:.1f} MB in {seconds:.2f} s{part}; "
             f"a file still in the page cache reads at memory speed)")
    if n < MIN_TIMED_BYTES:
        return Check("store read speed", "ok", found + "; too small to judge the disk by")
    if mbs < MIN_READ_MBS:
        return Check("store read speed", "warn", found + f"; training wants >= {MIN_READ_MBS:.0f} "
                                                          f"MB/s", "slow disk: copy the store to a "
                                                                   "local SSD")
    return Check("store read speed", "ok", found)


def check_run(path: Path) -> list[Check]:
    """A run folder (``myxtts train``'s): its newest checkpoint that loads, and the ones
    that do not (the machine checks above ran with the run's own settings)."""
    # deferred: torch and soundfile; the doctor runs without them (module doc)
    from myxtts.artifacts.checkpoint import PROGRESS, load
    from myxtts.artifacts.errors import ArtifactError
    from myxtts.artifacts.runs import CheckpointManager

    manager = CheckpointManager(path / "checkpoints", keep_last=0)
    paths = manager.step_paths()
    if not paths:
        return [Check("run", "warn", f"{path}: a run folder without a step checkpoint yet",
                      f"`myxtts train DATA --output-dir {path}` starts it")]
    damaged, newest = [], None
    for p in reversed(paths):
        try:
            state = load(p)
        except ArtifactError as e:
            damaged.append(str(e))
            continue
        newest = (p, int(state[PROGRESS]["step"]))
        break
    if newest is None:
        return [Check("run", "fail", damaged[0], "delete the damaged checkpoints; training "
                      "then starts again from step 0")]
    found = Check("run", "ok", f"{path}: resumes from {newest[0].name} (step {newest[1]})")
    return [found] + [Check("run", "warn", d, "a resumed run skips it") for d in damaged]


def check_dataset(path: Path, cfg: Config) -> list[Check]:
    """``inspect_dataset``'s summary as one line: usable, with problems (clips skipped), or
    unreadable (``DatasetError``)."""
    # deferred: the doctor runs without soundfile or soxr (module doc)
    from myxtts.data.prepare.inspect import inspect_dataset
    from myxtts.data.prepare.records import DatasetError

    see = f"`myxtts inspect-data {path}` lists every problem"
    try:
        ins = inspect_dataset(path, cfg)
    except (DatasetError, ConfigError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return [Check("dataset", "fail", first, see)]
    utts = ins.splits.all
    found = (f"{path}: {count(len(utts), 'utterance')}, {ins.hours(utts):.2f} h, "
             f"{count(len(ins.splits.speakers), 'speaker')}")
    checks = []
    fix = ins.language_fix
    if fix is not None:  # inspect shows the data as the fix reads it: say what prepare drops
        languages = ",".join(cfg.text.languages)
        drops = (f"every row ({ins.language_drops} reported for its language)"
                 if ins.drops_every_row else f"{ins.language_drops} row(s) for their language")
        checks.append(Check("dataset languages", "fail" if ins.drops_every_row else "warn",
                            f"{path}: with text.languages=[{languages}] prepare and train drop "
                            f"{drops}", f"{fix.set_args} (pass it to prepare and train)"))
        found += f" (read with {fix.set_args})"
    decoded, failed = ins.decoded
    if decoded and failed == decoded:  # every clip decoded would be rejected: so, most likely,
        # every clip: prepare would keep nothing
        checks.append(Check("dataset audio", "fail", f"{path}: all {decoded} clip(s) decoded as "
                            f"prepare decodes them would be skipped ("
                            f"{', '.join(sorted(ins.report.counts_by_reason()))})", f"see {see}"))
    counts = ins.report.counts_by_reason()
    if not counts:
        return checks + [Check("dataset", "ok", found + ", no other problems" if checks
                               else found + ", no problems")]
    per_reason = ", ".join(f"{reason} {n}" for reason, n in counts.items())
    return checks + [Check("dataset", "warn", f"{found}; {len(ins.report)} problem(s), those "
                                              f"clips are skipped: {per_reason}", f"see {see}")]


# ---------------------------------------------------------------- loader workers, /dev/shm

def resolve_workers(cfg: Config, cpus: int, on_the_fly: bool = False,
                    batch_cost: tuple[float, int] | None = None) -> tuple[int, str]:
    """``(workers, where the number came from)`` as the loader resolves ``data.num_workers``
    (``batch_cost``: a store batch's, for the store loader's own rule)."""
    n = cfg.data.num_workers
    if n >= 0:
        return n, f"data.num_workers={n}"
    if batch_cost is not None and not on_the_fly and _default_workers(cpus, False) > 0:
        from myxtts.data.feed.loader import choose_workers  # deferred: torch, soundfile

        n, why = choose_workers(cpus, *batch_cost)
        return n, f"auto: {why}"
    return _default_workers(cpus, on_the_fly), (f"auto for {cpus} CPUs"
                                                + (", on the fly" if on_the_fly else ""))


def check_store_workers(workers: int, batch_cost: tuple[float, int]) -> Check:
    """Store workers against what they save the training process per batch (the loader's
    rule, ``data.feed.loader.choose_workers``; the CPU count is the CPUs check's)."""
    from myxtts.data.feed.loader import batch_cost_note, workers_pay  # deferred: torch, soundfile

    note = batch_cost_note(*batch_cost)
    if workers == 0 or workers_pay(*batch_cost):
        return Check("store workers", "ok", note)
    return Check("store workers", "warn",
                 f"{workers} loader worker{'' if workers == 1 else 's'} save the training "
                 f"process too little on this store to pay for their CPU: {note}",
                 "--num-workers 0 (or -1: the loader's own choice)")


def _default_workers(cpus: int, on_the_fly: bool) -> int:
    # deferred: the doctor runs without soundfile or soxr (module doc)
    from myxtts.data.feed.loader import default_num_workers
    from myxtts.data.feed.onthefly import default_onthefly_workers

    return default_onthefly_workers(cpus) if on_the_fly else default_num_workers(cpus)


def check_workers(workers: int, source: str, cpus: int, on_the_fly: bool = False) -> Check:
    """Workers >= CPUs compete with the training process for cores."""
    found = f"{cpus} CPUs, {workers} loader worker{'' if workers == 1 else 's'} ({source})"
    if workers < cpus:
        return Check("CPUs", "ok", found)
    best = _default_workers(cpus, on_the_fly)
    best = best if best < cpus else 0
    return Check("CPUs", "warn", f"{found}: the workers compete with the training process",
                  f"--num-workers {best}")


def shm_free_bytes(path: str | Path = "/dev/shm") -> int | None:
    """Free bytes of /dev/shm, None where the OS has none (macOS, Windows)."""
    return shutil.disk_usage(path).free if Path(path).is_dir() else None


def shm_per_worker(cfg: Config, plan: DataPlan, transfer: bool) -> tuple[int, int, str]:
    """``(bytes per batch, batches each worker holds in shared memory, how it was sized)``.
    ``transfer``: training on a GPU (batches travel in float16)."""
    # deferred: the doctor runs without soundfile or soxr (module doc)
    from myxtts.data.batch import PAD_MULTIPLE, BatchShape, round_up
    from myxtts.data.feed.loader import MAX_GROUP, batches_per_task, pad_multiple, plan_frames
    from myxtts.data.feed.slots import slot_bytes, slots_per_worker

    d, a = cfg.data, cfg.audio
    # the loader's own grouping of this store's batches; without a store, the most it groups
    slots = slots_per_worker(MAX_GROUP if plan.batch_cost is None
                             else batches_per_task(plan.batch_cost[0]))
    if plan.shm is not None:
        return plan.shm
    if plan.table is not None:
        return slot_bytes(plan.table, plan.n_mels, d.ref_frames, transfer), slots, "this store"
    batch = d.max_batch_size or 64
    if plan.on_the_fly:  # float32 waveforms, reference clips with their STFT margin, tokens
        margin = 2 * math.ceil(a.n_fft / 2 / a.hop_length)
        nbytes = (4 * a.hop_length * (plan_frames(cfg) + batch * (d.ref_frames + margin))
                  + 8 * batch * d.max_text_tokens)
        return nbytes, ONTHEFLY_IN_FLIGHT, "estimate for raw-audio batches"
    shape = BatchShape(batch, round_up(d.max_text_tokens, PAD_MULTIPLE),
                       round_up(math.ceil(plan_frames(cfg) / batch), pad_multiple(cfg)),
                       d.ref_frames, a.n_mels)
    return shape.nbytes(64, transfer), slots, "estimate from the config"


def check_shm(per_batch: int, batches: int, how: str, workers: int, free: int | None,
              ranks: int = 1) -> Check:
    """/dev/shm against workers x batches x bytes (x ranks: one loader per GPU under torchrun)."""
    if workers == 0:
        return Check("/dev/shm", "ok", "not needed: 0 loader workers (the training process "
                                       "builds the batches)")
    if free is None:
        return Check("/dev/shm", "skip", "no /dev/shm on this OS")
    need = per_batch * batches * workers * ranks
    per_rank = f" x {ranks} ranks, one per GPU under torchrun" if ranks > 1 else ""
    plural = "" if workers == 1 else "s"
    found = (f"{free / 2**20:.0f} MiB free, the loader needs ~{need / 2**20:.0f} MiB ({workers} "
             f"worker{plural} x {batches} batches x {per_batch / 2**20:.1f} MiB{per_rank}, {how})")
    if need > free:
        return Check("/dev/shm", "fail", found, "--num-workers 0 (no shared memory), or a larger "
                                                 "/dev/shm (Docker: docker run --shm-size=8g)")
    return Check("/dev/shm", "ok", found)


def check_loader(cfg: Config, plan: DataPlan, cpus: int, *, transfer: bool, ranks: int,
                 shm_free: int | None) -> list[Check]:
    """Worker count against the CPUs, and /dev/shm against what those workers need."""
    cost = plan.batch_cost
    if cost is not None:  # a GPU run copies a worker's batch into pinned memory; a CPU run not
        cost = (cost[0], cost[1] if transfer else 0)
    try:
        workers, source = resolve_workers(cfg, cpus, plan.on_the_fly, cost)
        per_batch, batches, how = shm_per_worker(cfg, plan, transfer)
    except (ImportError, OSError) as e:
        return [Check("loader", "skip", f"myxtts.data cannot load ({type(e).__name__}: {e})")]
    checks = [check_workers(workers, source, cpus, plan.on_the_fly)]
    if cost is not None:
        checks.append(check_store_workers(workers, cost))
    return checks + [check_shm(per_batch, batches, how, workers, shm_free, ranks)]


def check_roles(cfg: Config, plan: DataPlan, n_gpus: int, train_device: str) -> list[Check]:
    """Which multi-GPU mode fits (``benchmarks/data_roles.py`` measures them), and whether
    the data role's device and the memory caps can work here.

    DDP (every GPU trains on its shard) is the default and usually the faster use of
    several GPUs with a prepared store: the features cost nothing at training time. The
    data/model split (``data.data_device`` on another GPU, or a second stream of the
    training GPU) only helps on-the-fly training -- raw audio, heavy feature work, no time
    to prepare -- where the loader workers would otherwise be the bottleneck."""
    if train_device == "cpu":
        return [Check("GPU roles", "skip", "training on the CPU")]
    # deferred: the doctor's modules load without torch, whose failure is a check
    import torch

    from myxtts.train.memory import resolve_caps

    out = []
    data_device = None
    if plan.on_the_fly:
        data_device = torch.device(cfg.data.data_device)
        index = data_device.index or 0
        if data_device.type == "cuda" and index >= n_gpus:
            return [Check("GPU roles", "fail", f"data.data_device={cfg.data.data_device} but "
                          f"{n_gpus} GPU(s) are visible", f"--data-device cuda:0..cuda:{n_gpus - 1} "
                          f"or cpu")]
    try:
        resolve_caps(cfg, torch.device(train_device), data_device)
    except ConfigError as e:
        return [Check("memory caps", "fail", str(e), "see train.device_memory_cap / "
                      "data.data_device_memory_cap in `myxtts config show`")]
    if not plan.on_the_fly:
        how = (f"{n_gpus} GPUs: with a prepared store, DDP (each GPU trains on its shard): "
               f"torchrun --nproc_per_node={n_gpus} -m myxtts.cli.main train STORE" if n_gpus > 1
               else "one GPU; with a prepared store there is no data role to place")
        out.append(Check("GPU roles", "ok", how))
    elif data_device.type == "cpu":
        found = "raw audio: features in the CPU loader workers"
        if n_gpus > 1:
            out.append(Check("GPU roles", "warn", f"{found} while {n_gpus} GPUs are visible",
                             "`myxtts prepare DATA --out STORE` once, then DDP on every GPU "
                             "(usually fastest); or, without time to prepare, the data/model "
                             "split: --data-device cuda:1 --device cuda:0"))
        else:
            out.append(Check("GPU roles", "ok", f"{found}; if `myxtts profile` says the input "
                             f"is the bottleneck, --data-device cuda:0 makes them on the GPU "
                             f"(a second stream), or prepare a store"))
    else:
        shared = torch.device(train_device) == torch.device("cuda", data_device.index or 0)
        where = "a second stream of the training GPU" if shared else "its own GPU"
        out.append(Check("GPU roles", "ok", f"raw audio: features on {cfg.data.data_device} "
                         f"({where}), handed over through {cfg.data.ring_slots} slots"))
    return out
