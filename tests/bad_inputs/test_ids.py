"""An utterance id is a name, never a path: a row whose id holds a path separator, "..", a
NUL or another control character, only dots, or more than 200 characters is reported with
file and line and never kept, by every layout's reader (the ids of a manifest are the
user's own text), so nothing downstream -- evaluation audio, vocoder samples -- writes
outside its folder or over a user's clip; a store whose ids file was edited is refused in
one line; and an output name made from any id stays in its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from myxtts.config import load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import BAD_ID
from myxtts.data.store import FeatureStore, StoreError
from myxtts.outputs import MAX_NAME_CHARS, name_problem, safe_name
from tests.bad_inputs.test_files_and_folders import _error, _run
from tests.test_bad_inputs import _wav

HOSTILE = ["../../escaped/spk0_0002", "/abs/where/victim", "victimdata/wavs/spk0_0019",
           "back\\slash", "nul\x00byte", "bell\x07", "..", ".", "x" * (MAX_NAME_CHARS + 1),
           "tab\there"]
FINE = ["u0", "LJ001-0001", "spk 3 take 2", "سلام_۱", "a.b", "x" * MAX_NAME_CHARS]


def _manifest(root: Path, suffix: str) -> tuple[Path, dict[str, int]]:
    """A manifest of FINE then HOSTILE ids, each row with a good clip of its own; returns
    it and the line of each hostile row."""
    rows = []
    for i, uid in enumerate(FINE + HOSTILE):
        _wav(root / "clips" / f"c{i}.wav")
        rows.append({"audio": f"clips/c{i}.wav", "text": f"row {i} of the manifest", "id": uid})
    path = root / f"m{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        first = 1
    else:  # a tab-separated manifest cannot hold a tab or a line break: those rows are left out
        rows = [r for r in rows if "\t" not in r["id"]]
        path.write_text("audio\ttext\tid\n" + "".join(
            f"{r['audio']}\t{r['text']}\t{r['id']}\n" for r in rows), encoding="utf-8")
        first = 2
    lines = {r["id"]: first + k for k, r in enumerate(rows)}
    return path, {uid: lines[uid] for uid in HOSTILE if uid in lines}


@pytest.mark.parametrize("suffix", [".jsonl", ".tsv"])
def test_ids_that_are_no_names_are_reported_with_their_line_and_left_out(suffix, tmp_path):
    manifest, hostile = _manifest(tmp_path / "data", suffix)
    splits = read_dataset(manifest, load_config(overrides=["data.val_fraction=0"]))
    assert sorted(u.id for u in splits.all) == sorted(FINE)
    found = sorted((Path(p.source).name, p.line) for p in splits.report if p.reason == BAD_ID)
    assert found == sorted((manifest.name, line) for line in hostile.values())
    for p in splits.report:  # the report itself never prints a path or a control character
        assert name_problem(p.utterance_id or "x") is None or p.reason != BAD_ID


def test_inspect_and_prepare_name_each_row_and_the_store_holds_none(tmp_path, capsys):
    manifest, hostile = _manifest(tmp_path / "data", ".jsonl")
    rc, text, _ = _run(["inspect-data", str(manifest)], capsys)
    assert f"{BAD_ID} ({len(hostile)})" in text, text
    for line in sorted(hostile.values())[:5]:  # (the first five of a kind are listed)
        assert f"{manifest}:{line} [" in text, text
    store = tmp_path / "store"
    rc, text, _ = _run(["prepare", str(manifest), "--out", str(store), "--set",
                        "data.val_fraction=0", "--set", "data.min_val_utterances=0"], capsys)
    assert rc == 0, text
    assert sorted(FeatureStore.open(store, "train").ids) == sorted(FINE)


def test_a_store_whose_ids_were_edited_into_paths_is_refused_in_one_line(micro_store, tmp_path,
                                                                         capsys):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(micro_store, store)
    ids_file = store / "train" / "ids.json"
    ids = json.loads(ids_file.read_text(encoding="utf-8"))
    ids["ids"][3] = "../../victimdata/wavs/spk0_0019"
    ids_file.write_text(json.dumps(ids), encoding="utf-8")
    with pytest.raises(StoreError, match=r"ids.json: utterance 3 id .* holds a path separator"):
        FeatureStore.open(store, "train")
    _error(["train", str(store), "--output-dir", str(tmp_path / "run"), "--max-steps", "1"],
           capsys, "ids.json", "utterance 3", "--force")


def test_a_file_name_made_of_any_id_stays_in_its_folder(tmp_path):
    folder = tmp_path / "audio"
    for uid in HOSTILE + FINE:
        name = safe_name(f"{uid}.model.wav")
        assert name_problem(name) is None or name == "_", (uid, name)
        assert (folder / name).resolve().parent == folder.resolve(), (uid, name)
    for uid in FINE:  # a name that is fine already comes back as it was
        assert safe_name(uid) == uid
