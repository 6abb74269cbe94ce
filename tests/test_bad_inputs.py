"""A catalogue of hostile and careless inputs, run against every command as a user would.

For each case: the exit code, no traceback, a message naming the file / line / key (and
for rows of a dataset: reported with file and line while the rest is prepared), and nothing
already written lost (the run or store the case points at is byte-identical afterwards).
Outcomes: ``error`` (a one-line error, exit 2), ``reported`` (the bad rows reported and
skipped, the command succeeds), ``handled`` (the command does the right thing anyway).
Generated data only; commands run in-process (``myxtts.cli.main.main``) to fit CI's budget.
Cases that need processes of their own (signals, concurrent writers, torchrun) live in
tests/train/test_loop.py, test_run_lock.py and test_multinode.py.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.cli.main import main
from tests.helpers import MICRO_MODEL

SR = 22050
READ_ONLY = Path("/sys/myxtts-test")  # sysfs refuses new files, even to root
TRAIN = ["--quiet", "--max-steps", "2", *[a for item in [*MICRO_MODEL, "train.device=cpu",
         "data.num_workers=0", "train.tensorboard=false", "train.synth_every=0",
         "data.batch_frames=1200"] for a in ("--set", item)]]


@dataclass(frozen=True)
class Case:
    name: str
    argv: Callable[[dict], list[str]]  # the fixture paths -> command line
    outcome: str  # error | reported | handled
    needles: tuple[str, ...]  # each must appear in the output (names the file/line/key)
    keep: str | None = None  # fixture path that must be unchanged afterwards
    rc: int | None = None  # exit code when not the outcome's (a check that found problems: 1)
    cuda_free_only: bool = False  # the case is "no CUDA here": skipped on a CUDA machine
    read_only: bool = False  # needs a read-only file system (sysfs): skipped where there is none


def _wav(path: Path, seconds: float = 0.6, value: float | None = None, sr: int = SR) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * sr)) / sr
    wav = 0.3 * np.sin(2 * np.pi * 220 * t) if value is None else np.full_like(t, value)
    sf.write(path, wav.astype(np.float32), sr, subtype="FLOAT" if value is not None else "PCM_16")
    return path


def _dataset(root: Path, rows: list[str], clips: dict[str, Callable[[Path], None]] | None = None
             ) -> Path:
    """LJSpeech layout: ``rows`` of metadata.csv; a good clip per row id unless ``clips``
    says how to make it (or the id is missing from the folder on purpose)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    clips = clips or {}
    for row in rows:
        uid = row.split("|")[0]
        make = clips.get(uid, lambda p: _wav(p))
        if make is not None:
            make(root / "wavs" / f"{uid}.wav")
    return root


GOOD = [f"g{i}|the cat sat on the mat {i}|the cat sat on the mat {i}" for i in range(4)]


@pytest.fixture(scope="module")
def paths(micro_store, tmp_path_factory) -> dict:
    """Everything the cases point at, made once."""
    root = tmp_path_factory.mktemp("hostile")
    run = root / "run"
    assert main(["train", str(micro_store), "--output-dir", str(run), *TRAIN]) == 0
    ref = sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))[0]
    p = {"root": root, "store": micro_store, "raw": micro_store.parent / "data", "run": run,
         "ref": ref, "ckpt": run / "checkpoints" / "ckpt_00000002.pt"}
    (root / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (root / "empty.txt").write_text("   \n")
    (root / "bad.yaml").write_text("train: [unclosed\n")
    (root / "a_file").write_text("not a folder")
    (root / "zero.pt").write_bytes(b"")
    (root / "junk.pt").write_bytes(b"PK\x03\x04 not really a zip")
    (root / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    _wav(root / "short.wav", seconds=0.1)
    (root / "dir_ref").mkdir()
    store_copy = root / "store_copy"
    shutil.copytree(micro_store, store_copy)
    mel = store_copy / "train" / "mel.f16"
    mel.write_bytes(mel.read_bytes()[: mel.stat().st_size // 2])
    p["truncated_store"] = store_copy
    p["rows"] = {
        "non_utf8": _raw_bytes(root / "d_non_utf8", GOOD, b"g9|caf\xe9 latin-1 line\n"),
        "malformed": _dataset(root / "d_malformed", [*GOOD, "g9"]),
        "missing_audio": _dataset(root / "d_missing", [*GOOD, "g9|no clip for me"], {"g9": None}),
        "corrupt_audio": _dataset(root / "d_corrupt", [*GOOD, "g9|a broken clip"],
                                  {"g9": lambda q: q.write_bytes(b"RIFF....WAVEjunk")}),
        "empty_audio": _dataset(root / "d_empty", [*GOOD, "g9|an empty clip"],
                                {"g9": lambda q: q.write_bytes(b"")}),
        "silent_audio": _dataset(root / "d_silent", [*GOOD, "g9|a silent clip"],
                                 {"g9": lambda q: _wav(q, value=0.0)}),
        "nan_audio": _dataset(root / "d_nan", [*GOOD, "g9|a clip of NaN"],
                              {"g9": lambda q: _wav(q, value=float("nan"))}),
        "too_long": _dataset(root / "d_long", [*GOOD, "g9|a very long clip"],
                             {"g9": lambda q: _wav(q, seconds=21.0)}),
        "too_short": _dataset(root / "d_short", [*GOOD, "g9|a blip"],
                              {"g9": lambda q: _wav(q, seconds=0.05)}),
        "empty_text": _dataset(root / "d_empty_text", [*GOOD, "g9| "]),
        "punct_text": _dataset(root / "d_punct", [*GOOD, "g9|?! ... !"]),
        "foreign_text": _dataset(root / "d_foreign", [*GOOD, "g9|hello привет 🙂"]),
        "duplicate_id": _dataset(root / "d_dup", [*GOOD, GOOD[0]]),
        "other_rate": _dataset(root / "d_rate", [*GOOD, "g9|sixteen kilohertz"],
                               {"g9": lambda q: _wav(q, sr=16000)}),
        "all_bad": _dataset(root / "d_all_bad", ["b1|?!", "b2|..."]),
    }
    return p


def _raw_bytes(root: Path, rows: list[str], extra: bytes) -> Path:
    _dataset(root, rows)
    with open(root / "metadata.csv", "ab") as fh:
        fh.write(extra)
    _wav(root / "wavs" / "g9.wav")
    return root


def _prepare(kind: str) -> Callable[[dict], list[str]]:
    return lambda p: ["prepare", str(p["rows"][kind]), "--out", str(p["root"] / f"s_{kind}"),
                      "--workers", "1", "--quiet"]


def _synth(*extra: str, ref: str = "ref", text: str = "lamo tesi") -> Callable[[dict], list[str]]:
    def argv(p: dict) -> list[str]:
        base = ["synthesize", "-c", str(p["run"]), "-r", str(p[ref]) if ref in p else ref,
                "-o", str(p["root"] / "out.wav"), "--device", "cpu"]
        base += ["-t", text] if text else []
        return base + [e.format(**{k: v for k, v in p.items() if isinstance(v, Path)})
                       for e in extra]
    return argv


CASES = [
    # ---- configuration
    Case("unknown config key", lambda p: ["config", "show", "--set", "train.lrr=1"], "error",
         ("train.lrr",)),
    Case("wrong type", lambda p: ["config", "show", "--set", "train.max_steps=abc"], "error",
         ("train.max_steps",)),
    Case("nan learning rate", lambda p: ["train", str(p["store"]), "--set", "train.lr=nan",
                                         "--output-dir", str(p["root"] / "r_nan")], "error",
         ("train.lr must be a finite number",)),
    Case("out of range", lambda p: ["config", "show", "--set", "data.val_fraction=1.5"], "error",
         ("data.val_fraction",)),
    Case("broken YAML", lambda p: ["config", "show", "--config", str(p["root"] / "bad.yaml")],
         "error", ("bad.yaml",)),
    Case("config is a folder", lambda p: ["config", "show", "--config", str(p["root"])],
         "error", ("hostile",)),
    Case("config missing", lambda p: ["config", "show", "--config", str(p["root"] / "no.yaml")],
         "error", ("no.yaml",)),
    Case("unknown preset", lambda p: ["config", "show", "--set", "model.preset=huge"], "error",
         ("model.preset",)),
    # ---- datasets: rows reported by file and line, the rest prepared
    Case("non-UTF-8 line", _prepare("non_utf8"), "reported", ("not UTF-8", "metadata.csv:5")),
    Case("malformed row", _prepare("malformed"), "reported", ("malformed row", "metadata.csv:5")),
    Case("missing audio", _prepare("missing_audio"), "reported", ("missing audio", "g9")),
    Case("corrupt audio", _prepare("corrupt_audio"), "reported", ("g9.wav",)),
    Case("empty audio file", _prepare("empty_audio"), "reported", ("g9.wav",)),
    Case("silent audio", _prepare("silent_audio"), "reported", ("g9.wav",)),
    Case("NaN audio", _prepare("nan_audio"), "reported", ("g9.wav",)),
    Case("too long audio", _prepare("too_long"), "reported", ("too long",)),
    Case("too short audio", _prepare("too_short"), "reported", ("too short",)),
    Case("empty transcript", _prepare("empty_text"), "reported", ("metadata.csv:5",)),
    Case("punctuation-only transcript", _prepare("punct_text"), "reported",
         ("nothing to say", "metadata.csv:5")),
    Case("Cyrillic and emoji in an en row", _prepare("foreign_text"), "reported",
         ("characters outside the language", "metadata.csv:5", "CYRILLIC")),
    Case("duplicate id", _prepare("duplicate_id"), "reported", ("duplicate id",)),
    Case("other sample rate, resampling off",
         lambda p: [*_prepare("other_rate")(p), "--set", "audio.resample=false"], "reported",
         ("g9.wav",)),
    Case("every row bad", _prepare("all_bad"), "error", ("d_all_bad",)),
    Case("dataset missing", lambda p: ["prepare", str(p["root"] / "nope"), "--out",
                                       str(p["root"] / "s_x")], "error", ("nope",)),
    Case("dataset is a plain file", lambda p: ["prepare", str(p["root"] / "a_file"), "--out",
                                               str(p["root"] / "s_y")], "error", ("a_file",)),
    Case("store folder is a file", lambda p: ["prepare", str(p["raw"]), "--out",
                                              str(p["root"] / "a_file"), "--quiet"], "error",
         ("a_file",)),
    Case("verify a truncated store", lambda p: ["prepare", "--verify", str(p["truncated_store"])],
         "reported", ("train/mel.f16", "truncated"), keep="truncated_store", rc=1),
    Case("verify a folder that is no store", lambda p: ["prepare", "--verify", str(p["root"])],
         "reported", ("not a feature store",), rc=1),
    Case("inspect a missing dataset", lambda p: ["inspect-data", str(p["root"] / "nope")],
         "error", ("nope",)),
    # ---- training
    Case("train on a missing path", lambda p: ["train", str(p["root"] / "nope"), *TRAIN], "error",
         ("nope", "does not exist")),
    Case("train on a truncated store", lambda p: ["train", str(p["truncated_store"]),
                                                  "--output-dir", str(p["root"] / "r_t"), *TRAIN],
         "error", ("mel.f16",), keep="truncated_store"),
    Case("resume from a damaged checkpoint",
         lambda p: ["train", str(p["store"]), "--resume", str(p["root"] / "junk.pt"),
                    "--output-dir", str(p["root"] / "r_j"), *TRAIN], "error",
         ("junk.pt", "cannot be read")),
    Case("resume from an empty checkpoint",
         lambda p: ["train", str(p["store"]), "--resume", str(p["root"] / "zero.pt"),
                    "--output-dir", str(p["root"] / "r_z"), *TRAIN], "error",
         ("zero.pt", "is empty")),
    Case("output folder is a file", lambda p: ["train", str(p["store"]), *TRAIN, "--output-dir",
                                               str(p["root"] / "a_file")], "error",
         ("cannot write", "a_file")),
    Case("train on CUDA without CUDA", lambda p: ["train", str(p["store"]), *TRAIN, "--set",
                                                  "train.device=cuda", "--output-dir",
                                                  str(p["root"] / "r_c")],
         "error", ("train.device",), cuda_free_only=True),
    Case("memory cap on a CPU run", lambda p: ["train", str(p["store"]), *TRAIN, "--set",
                                               "train.device_memory_cap=0.5", "--output-dir",
                                               str(p["root"] / "r_m")], "error",
         ("train.device_memory_cap",)),
    Case("vocoder on a store without audio",
         lambda p: ["train-vocoder", str(p["store"]), "--output-dir", str(p["root"] / "v"),
                    "--max-steps", "1", "--device", "cpu"], "error", ("--audio",)),
    # ---- synthesis
    Case("checkpoint missing", lambda p: ["synthesize", "-c", str(p["root"] / "none"), "-t", "a",
                                          "-r", str(p["ref"]), "-o", str(p["root"] / "o.wav")],
         "error", ("none",)),
    Case("checkpoint of 0 bytes", lambda p: ["synthesize", "-c", str(p["root"] / "zero.pt"), "-t",
                                             "a", "-r", str(p["ref"]), "-o",
                                             str(p["root"] / "o.wav")], "error",
         ("zero.pt", "is empty")),
    Case("checkpoint not a zip", lambda p: ["synthesize", "-c", str(p["root"] / "junk.pt"), "-t",
                                            "a", "-r", str(p["ref"]), "-o",
                                            str(p["root"] / "o.wav")], "error", ("junk.pt",)),
    Case("reference missing", _synth(ref="/nonexistent/voice.wav"), "error", ("voice.wav",)),
    Case("reference is a folder", _synth(ref="dir_ref"), "error", ("dir_ref is a folder",)),
    Case("reference corrupt", _synth(ref="corrupt_wav"), "error", ("corrupt.wav",)),
    Case("reference too short", _synth(ref="short_wav"), "error", ("short.wav",)),
    Case("text only punctuation", _synth(text="?! ..."), "error", ("nothing this model can speak",)),
    Case("text file not UTF-8", _synth("--text-file", "{root}/latin1.txt", text=""), "error",
         ("latin1.txt", "UTF-8")),
    Case("text file empty", _synth("--text-file", "{root}/empty.txt", text=""), "error",
         ("empty.txt",)),
    Case("text file is a folder", _synth("--text-file", "{root}", text=""), "error",
         ("--text-file",)),
    Case("unknown language", _synth("-l", "xx"), "error", ("'xx'",)),
    Case("vocoder missing", _synth("--vocoder", "{root}/novoc"), "error", ("novoc",)),
    Case("synthesize on CUDA without CUDA", _synth("--device", "cuda"), "error", ("--device",),
         cuda_free_only=True),
    Case("output into a file's place", _synth("-o", "{root}/a_file/out.wav"), "error",
         ("a_file",)),
    # ---- outputs on a read-only file system (sysfs: read-only even for root)
    Case("store on a read-only file system", lambda p: ["prepare", str(p["raw"]), "--out",
                                                        f"{READ_ONLY}/store", "--quiet"],
         "error", ("cannot write", "--out"), read_only=True),
    Case("demo data on a read-only file system",
         lambda p: ["make-demo-data", f"{READ_ONLY}/data", "--utterances", "2"], "error",
         ("cannot write",), read_only=True),
    Case("run folder on a read-only file system",
         lambda p: ["train", str(p["store"]), *TRAIN, "--output-dir", f"{READ_ONLY}/run"],
         "error", ("cannot write", "--output-dir"), read_only=True),
    Case("demo on a read-only file system", lambda p: ["demo", "--out", f"{READ_ONLY}/demo"],
         "error", ("cannot write",), read_only=True),
    Case("wav on a read-only file system", _synth("-o", f"{READ_ONLY}/o/out.wav"), "error",
         ("cannot write",), read_only=True),
    Case("inspect report on a read-only file system",
         lambda p: ["inspect-data", str(p["raw"]), "--json", f"{READ_ONLY}/r/problems.json"],
         "error", ("cannot write", "--json"), read_only=True),
    # ---- handled: the right thing happens anyway
    Case("resume skips a damaged newest checkpoint", lambda p: _damaged_resume(p), "handled",
         ("skipping a damaged checkpoint",)),
]


def _damaged_resume(p: dict) -> list[str]:
    run = p["root"] / "r_damaged"
    if not run.exists():
        shutil.copytree(p["run"], run)
        (run / "checkpoints" / "ckpt_00000003.pt").write_bytes(b"")  # newer, and broken
        (run / "checkpoints" / "latest.txt").write_text("ckpt_00000003.pt")
    return ["train", str(p["store"]), "--output-dir", str(run), *TRAIN[:1], "--max-steps", "3",
            *TRAIN[3:]]


def _digest(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(q for q in path.rglob("*") if q.is_file())
    return {str(q): hashlib.sha256(q.read_bytes()).hexdigest() for q in files}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.slow
def test_bad_input(case: Case, paths: dict, capsys, caplog) -> None:
    if case.cuda_free_only and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if case.read_only and not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs here (not Linux)")
    p = dict(paths)
    p["corrupt_wav"], p["short_wav"] = p["root"] / "corrupt.wav", p["root"] / "short.wav"
    p["dir_ref"] = p["root"] / "dir_ref"
    before = _digest(p[case.keep]) if case.keep else None
    argv = case.argv(p)
    with caplog.at_level("WARNING"):
        rc = main(argv)  # an unexpected exception fails the test with its traceback
    out = capsys.readouterr()
    text = out.out + out.err + caplog.text
    assert "Traceback" not in text, text
    if case.outcome == "error":
        assert rc == 2, (rc, text)
        errors = [ln for ln in out.err.splitlines() if ": error: " in ln]
        assert len(errors) == 1, out.err  # one line says what is wrong and the fix
    else:
        assert rc == (0 if case.rc is None else case.rc), (rc, text)
    for needle in case.needles:
        assert needle in text, (needle, text[-3000:])
    if before is not None:
        assert _digest(p[case.keep]) == before, "the case changed what was already written"


def test_the_catalogue_covers_every_outcome():
    kinds = {c.outcome for c in CASES}
    assert kinds == {"error", "reported", "handled"} and len(CASES) >= 55
