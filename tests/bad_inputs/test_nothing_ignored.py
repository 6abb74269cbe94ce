"""Nothing silently ignored: clips a dataset's layout does not read are reported (a
LibriTTS subset inside a subset, clips beside the speaker folders, folders inside a
chapter), and a fine-tuning setting that would keep new rows unlearnt is refused naming
them (``train.freeze=[text_embeddings]`` while the data adds letters or a language)."""

from __future__ import annotations

from pathlib import Path

import pytest

from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import MISPLACED_AUDIO
from tests.bad_inputs.test_files_and_folders import _error, _run
from tests.test_bad_inputs import TRAIN, _wav


def _clip(chapter: Path, stem: str, text: str) -> None:
    _wav(chapter / f"{stem}.wav")
    (chapter / f"{stem}.normalized.txt").write_text(text, encoding="utf-8")


def _subset(root: Path, speakers: tuple[str, ...], chapter: str = "198") -> Path:
    for spk in speakers:
        for k in range(3):
            _clip(root / spk / chapter, f"{spk}_{chapter}_000000_00000{k}",
                  f"sentence {k} of speaker {spk}")
    return root


def _misplaced(report) -> list[str]:
    return sorted(Path(p.source).name for p in report if p.reason == MISPLACED_AUDIO)


def test_a_libritts_subset_inside_a_subset_is_reported(tmp_path, capsys):
    corpus = tmp_path / "LibriTTS"
    outer = _subset(corpus / "train-clean-100", ("19", "26"))
    _subset(outer / "train-clean-360", ("84", "85"))  # unpacked one level too deep
    cfg = load_config(overrides=["data.val_fraction=0"])
    for path in (corpus, outer):  # the corpus folder, or the subset given directly
        splits = read_dataset(path, cfg)
        assert {u.speaker for u in splits.all} == {"19", "26"}
        assert _misplaced(splits.report) == ["train-clean-360"]
        [p] = splits.report.by_reason(MISPLACED_AUDIO)
        assert "inside the subset train-clean-100" in p.detail and "move train-clean-360" in p.fix
    store = tmp_path / "store"
    rc, text, _ = _run(["prepare", str(corpus), "--out", str(store), "--workers", "1",
                        "--quiet"], capsys)
    assert rc == 0 and "clips outside the layout: 1" in text and "train-clean-360" in text
    rc, text, _ = _run(["inspect-data", str(corpus)], capsys)
    assert rc == 0 and "problems: none" not in text and "train-clean-360" in text


def test_clips_libritts_never_reads_are_reported_where_they_lie(tmp_path):
    corpus = tmp_path / "LibriTTS"
    subset = _subset(corpus / "train-clean-100", ("19", "26"))
    _wav(subset / "stray.wav")  # in the subset itself
    _wav(subset / "19" / "loose.wav")  # in a speaker folder, not a chapter
    _clip(subset / "26" / "198" / "extra", "26_198_000009_000000", "one level too deep")
    _subset(corpus / "mine", ("7",))  # beside the subsets, but none of them
    splits = read_dataset(corpus, load_config(overrides=["data.val_fraction=0"]))
    assert len(splits.all) == 6
    assert _misplaced(splits.report) == ["19", "extra", "mine", "train-clean-100"]


@pytest.fixture(scope="module")
def runs(micro_store, tmp_path_factory) -> dict[str, Path]:
    """A micro run trained on ``en`` (micro_store) and a store of ``fa`` voices."""
    from myxtts.synthetic import make_demo_data

    root = tmp_path_factory.mktemp("freeze")
    run = root / "run_en"
    assert main(["train", str(micro_store), "--output-dir", str(run), *TRAIN]) == 0
    data = make_demo_data(root / "fa", speakers=2, utterances=6, seed=5, languages=("fa",))
    store = root / "store_fa"
    assert main(["prepare", str(data), "--out", str(store), "--workers", "1", "--quiet",
                 "--set", "text.languages=[fa]", "--set", "text.default_language=fa"]) == 0
    return {"en": run, "fa": store, "en_store": micro_store, "root": root}


@pytest.mark.parametrize("freeze", ["[text_embeddings]", "[text_embeddings,decoder]"])
def test_freezing_the_rows_a_new_language_needs_is_refused_naming_them(freeze, runs, capsys):
    out = runs["root"] / f"tuned_{len(freeze)}"
    line = _error(["train", str(runs["fa"]), "--init-from", str(runs["en"]), "--output-dir",
                   str(out), *TRAIN, "--set", f"train.freeze={freeze}"], capsys,
                  "train.freeze=[text_embeddings", "language fa", "text_encoder.token_emb.weight rows",
                  "text_encoder.lang_emb.weight rows 1", "drop text_embeddings from train.freeze")
    assert "character(s)" in line
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def test_freezing_text_embeddings_is_fine_when_the_data_adds_none():
    from myxtts.artifacts import checkpoint as ck
    from myxtts.text import Tokenizer
    from myxtts.train.errors import TrainError
    from myxtts.train.finetune import check_freeze

    old = Tokenizer(["en"], list("abc "))
    base = {ck.VOCAB: old.to_dict()}
    check_freeze(["text_embeddings"], base, old)  # the model's own vocabulary: nothing new
    check_freeze(["decoder"], base, Tokenizer(["en", "fa"], list("abc شس")))  # rows free
    grown = Tokenizer(["en"], list("abc de"))
    d, e = grown.tokens.index("d"), grown.tokens.index("e")
    with pytest.raises(TrainError, match=rf"2 character\(s\) 'de', whose rows \(text_encoder"
                                         rf"\.token_emb\.weight rows {d}-{e}\)"):
        check_freeze(["text_embeddings"], base, grown)
