"""Data stays inside the dataset: a row whose clip path leads out of its reader's folder
(``..``, an absolute path elsewhere) is reported with file and line and never opened, by
every reader and through every command that reads data (prepare, inspect-data, doctor);
a clip that is a link, or lies in a linked folder, is read when its target is a regular
file (the rule: ``myxtts.data.prepare.readers.common``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import OUTSIDE_DATASET
from tests.test_bad_inputs import GOOD, _dataset, _wav

HEADER = ["client_id", "path", "sentence", "up_votes", "down_votes", "locale"]
# Row paths that leave clips/ (up, absolute, through a subfolder, by another root); each names a
# file that exists, so only the rule keeps it out.
LEAVING = ["../outside.wav", "{elsewhere}/secret.wav", "../../../../../etc/passwd",
           "/etc/passwd", "sub/../../outside.wav", "{root}/outside.wav"]


def _cv(root: Path, elsewhere: Path) -> tuple[Path, list[int]]:
    """A Common Voice release of WAV clips: 4 good rows, the ``LEAVING`` rows, then a clip
    that is a link to a clip elsewhere, and a clip in a linked folder (both fine). Returns
    the folder and the tsv lines of the rows that leave."""
    clips = root / "clips"
    for i in range(4):
        _wav(clips / f"g{i}.wav")
    _wav(root / "outside.wav")  # in the dataset folder, but not under clips/
    _wav(elsewhere / "secret.wav")
    library = elsewhere.parent / "library"  # a shared clip folder the release links into
    _wav(library / "lib.wav")
    (clips / "sub").mkdir()
    (clips / "linked.wav").symlink_to(library / "lib.wav")
    (clips / "shared").symlink_to(library)
    rows = [[f"spk{i % 2}", f"g{i}.wav", f"the cat sat on the mat {i}", "2", "0", "en"]
            for i in range(4)]
    leaving = [p.format(root=root, elsewhere=elsewhere) for p in LEAVING]
    rows += [["spk0", p, "a row that points elsewhere", "2", "0", "en"] for p in leaving]
    rows += [["spk1", "linked.wav", "a linked clip", "2", "0", "en"],
             ["spk1", "shared/lib.wav", "a clip in a linked folder", "2", "0", "en"]]
    (root / "train.tsv").write_text("\n".join("\t".join(r) for r in [HEADER, *rows]) + "\n",
                                    encoding="utf-8")
    return root, list(range(6, 6 + len(LEAVING)))


def _outside(report) -> list[tuple[str, int]]:
    return [(Path(p.source).name, p.line) for p in report if p.reason == OUTSIDE_DATASET]


def test_common_voice_rows_that_leave_clips_are_reported_and_never_packed(tmp_path, capsys):
    root, lines = _cv(tmp_path / "cv", tmp_path / "elsewhere")
    store = tmp_path / "store"
    assert main(["prepare", str(root), "--out", str(store), "--workers", "1", "--quiet",
                 "--set", "data.val_fraction=0"]) == 0
    out = capsys.readouterr().out
    assert "kept 6 of 6 utterances" in out  # 4 good + the two linked clips
    assert f"outside the dataset: {len(LEAVING)}" in out and "train.tsv:6 [outside]" in out
    report = json.loads((store / "report.json").read_text())
    leaving = [(Path(p["source"]).name, p["line"]) for p in report["dataset_problems"]
               if p["reason"] == OUTSIDE_DATASET]
    assert leaving == [("train.tsv", n) for n in lines]
    assert "'../../../../../etc/passwd' leads outside" in json.dumps(report)
    packed = json.loads((store / "train" / "ids.json").read_text())["ids"]
    assert sorted(packed) == ["g0", "g1", "g2", "g3", "lib", "linked"]
    # inspect-data and doctor read through the same readers: the same rows, by line
    assert main(["inspect-data", str(root), "--max-problems", "9"]) == 0
    out = capsys.readouterr().out
    for n in lines:
        assert f"train.tsv:{n} " in out and "outside the dataset" in out
    assert main(["doctor", str(root), "--set", "train.compile=off"]) in (0, 1)
    out = capsys.readouterr().out
    assert f"outside the dataset {len(LEAVING)}" in out, out


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_manifest_audio_paths_stay_in_the_manifests_folder(suffix, tmp_path):
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    for i in range(3):
        _wav(data / "clips" / f"c{i}.wav")
    _wav(elsewhere / "secret.wav")
    (data / "linked").symlink_to(elsewhere)
    paths = ["clips/c0.wav", str(data / "clips" / "c1.wav"),  # relative, absolute inside
             "linked/secret.wav",  # a linked folder: its clips are read
             "../elsewhere/secret.wav", str(elsewhere / "secret.wav"), "/etc/passwd",
             "clips/../../elsewhere/secret.wav"]
    texts = [f"row {i} of the manifest" for i in range(len(paths))]
    manifest = data / f"m{suffix}"
    if suffix == ".csv":
        manifest.write_text("audio,text,id\n" + "".join(
            f"{p},{t},u{i}\n" for i, (p, t) in enumerate(zip(paths, texts))))
    else:
        manifest.write_text("".join(json.dumps({"audio": p, "text": t, "id": f"u{i}"}) + "\n"
                                    for i, (p, t) in enumerate(zip(paths, texts))))
    splits = read_dataset(manifest, load_config(overrides=["data.val_fraction=0"]))
    assert sorted(u.id for u in splits.all) == ["u0", "u1", "u2"]
    first = 2 if suffix == ".csv" else 1  # the csv's header is line 1
    assert _outside(splits.report) == [(manifest.name, first + i) for i in (3, 4, 5, 6)]


def test_ids_that_name_a_path_out_of_wavs_or_a_speaker_folder(tmp_path):
    lj = _dataset(tmp_path / "lj", [*GOOD, "../outside|a row that climbs out",
                                    "/etc/passwd|an absolute id"], {"../outside": None,
                                                                    "/etc/passwd": None})
    _wav(lj / "outside.wav")  # wavs/../outside.wav exists: only the rule keeps it out
    splits = read_dataset(lj, load_config(overrides=["data.val_fraction=0"]))
    assert len(splits.all) == 4 and _outside(splits.report) == [("metadata.csv", 5),
                                                                 ("metadata.csv", 6)]
    spk = tmp_path / "spk" / "anna"
    _wav(spk / "a1.wav")
    _wav(spk / "a2.wav")
    _wav(tmp_path / "spk" / "bob.wav")
    (spk / "metadata.csv").write_text("a1|first words\na2|second words\n../bob|not anna's\n")
    splits = read_dataset(tmp_path / "spk", load_config(overrides=["data.val_fraction=0"]))
    assert len(splits.all) == 2 and _outside(splits.report) == [("metadata.csv", 3)]


def test_a_link_to_something_that_is_no_regular_file_is_never_opened(tmp_path):
    root, _ = _cv(tmp_path / "cv", tmp_path / "elsewhere")
    (root / "clips" / "zero.wav").symlink_to("/dev/zero")  # reading it would never end
    with open(root / "train.tsv", "a", encoding="utf-8") as fh:
        fh.write("\t".join(["spk0", "zero.wav", "endless zeros", "2", "0", "en"]) + "\n")
    splits = read_dataset(root, load_config(overrides=["data.val_fraction=0"]))
    assert "zero" not in {u.id for u in splits.all}
    [p] = [p for p in splits.report if p.utterance_id == "zero"]
    assert p.line == 6 + len(LEAVING) + 2 and "character device, not an audio file" in p.detail
    assert os.path.islink(root / "clips" / "zero.wav")
