"""The XTTS store (``myxtts prepare --xtts``): its codes are the reference DVAE's, its tokens
XttsTokenizer's, its identity refuses another model, a text the vocabulary cannot encode is
rejected with file and line, Persian grows the vocabulary, and a resumed or parallel
prepare writes the same bytes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.data.store import FeatureStore, StoreError, verify_store
from myxtts.data.xtts_store import XttsStore, check_model
from myxtts.data.xtts_store import build as xtts_build
from myxtts.data.xtts_store.plan import UNENCODABLE
from myxtts.synthetic import make_demo_data
from myxtts.train.xtts.prepare import prepare_xtts
from tests.xtts_v2.reference import coqui, reference_dvae

LANGUAGES = "text.languages=[en,fa]"
ODD_TEXT = "The fjørd was calm."  # "ø": Latin, so the readers keep it; not in the test vocab


def _dataset(root: Path) -> Path:
    """Two demo voices (English and Persian rows) at 24 kHz (so clips are resampled), and one
    English row whose text the vocabulary cannot encode, on the last line."""
    data = make_demo_data(root, speakers=2, utterances=4, seed=3, sample_rate=24000,
                          languages=("en", "fa"))
    first = (data / "metadata.csv").read_text(encoding="utf-8").splitlines()[0].split("|")
    shutil.copy(data / "wavs" / f"{first[0]}.wav", data / "wavs" / "odd.wav")
    with open(data / "metadata.csv", "a", encoding="utf-8") as fh:
        fh.write(f"odd|{ODD_TEXT}|{ODD_TEXT}|{first[3]}|en\n")
    return data


def _prepare(data: Path, out: Path, folder: Path, **kw):
    kw.setdefault("echo", lambda *a: None)
    return prepare_xtts(data, out, load_config(overrides=[LANGUAGES]), folder, workers=1,
                        progress=False, **kw)


@pytest.fixture(scope="module")
def built(reduced_folder, tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("xtts_store")
    data = _dataset(root / "data")
    _prepare(data, root / "store", reduced_folder)
    yield data, root / "store", reduced_folder
    torch.set_num_threads(threads)


def _rows(data: Path) -> dict[str, list[str]]:
    lines = (data / "metadata.csv").read_text(encoding="utf-8").splitlines()
    return {line.split("|")[0]: line.split("|") for line in lines}


def _reference_clip(path: Path):
    """coqui's ``load_audio(path, 22050)`` (mono, torchaudio's resampler, clipped), with the
    file decoded by soundfile: torchaudio.load needs torchcodec's native libraries."""
    import soundfile as sf
    import torch

    torchaudio = pytest.importorskip("torchaudio", reason="the reference's resampler")
    wav, rate = sf.read(str(path), dtype="float32", always_2d=True)
    audio = torch.from_numpy(wav.T.copy()).mean(dim=0, keepdim=True)
    return torchaudio.functional.resample(audio, rate, 22050).clip_(-1, 1)


@pytest.mark.slow
def test_codes_and_audio_equal_the_reference_trainers(built):
    import torch

    coqui()
    from TTS.tts.layers.tortoise.arch_utils import TorchMelSpectrogram

    data, store_path, folder = built
    dvae = reference_dvae()
    dvae.load_state_dict(torch.load(folder / "dvae.pth", weights_only=True))
    mel = TorchMelSpectrogram(mel_norm_file=str(folder / "mel_stats.pth"), sampling_rate=22050)
    checked = 0
    for split in ("train", "val"):
        store = XttsStore.open(store_path, split)
        for i in range(min(len(store), 3)):
            wav = _reference_clip(data / "wavs" / f"{store.ids[i]}.wav")  # [1, S]
            want = dvae.get_codebook_indices(mel(wav[None]))[0]
            assert np.array_equal(store.codes(i), want.numpy())
            assert store.code_lengths[i] == len(want)
            got = store.audio(i)
            assert got.dtype == np.float32 and got.shape == (wav.shape[-1],)
            assert np.abs(got - wav[0].numpy()).max() <= 0.5 / 32767 + 1e-7
            checked += 1
    assert checked >= 4


def test_tokens_are_xtts_tokenizers_and_ids_index_the_split(built):
    from myxtts.text.xtts_v2 import XttsTokenizer

    data, store_path, _ = built
    rows = _rows(data)
    tok = XttsTokenizer(XttsStore.vocab_path(store_path))
    for split in ("train", "val"):
        store = XttsStore.open(store_path, split)
        assert len(store) == len(store.ids) == len(store.text_lengths) == len(store.language_ids)
        for i, uid in enumerate(store.ids):
            row = rows[uid]
            want = tok.encode(row[2], row[4])
            assert store.text(i).dtype == np.int64 and store.text(i).tolist() == want
            assert store.languages[store.language_ids[i]] == row[4]
            assert store.speakers[store.speaker_ids[i]] == row[3]
    assert {lang for s in ("train", "val") for lang in
            np.array(XttsStore.open(store_path, s).languages)[XttsStore.open(store_path, s).language_ids]} == {"en", "fa"}


def test_identity_and_manifest(built):
    from myxtts.text.xtts_v2 import XttsTokenizer

    _, store_path, folder = built
    store = XttsStore.open(store_path, "train")
    ident = store.identity

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert ident == {"base_vocab_sha256": sha(folder / "vocab.json"),
                     "vocab_sha256": sha(store_path / "vocab.json"),
                     "dvae_sha256": sha(folder / "dvae.pth"),
                     "mel_stats_sha256": sha(folder / "mel_stats.pth"),
                     "languages": ["en", "fa"],
                     "number_text_tokens": XttsTokenizer(store_path / "vocab.json").n_tokens}
    manifest = json.loads((store_path / "manifest.json").read_text(encoding="utf-8"))
    for rel, meta in manifest["files"].items():
        assert meta == {"size": (store_path / rel).stat().st_size, "sha256": sha(store_path / rel)}
    assert {"train/codes.i16", "train/tokens.i32", "train/audio.i16", "val/index.npy",
            "vocab.json", "report.json"} <= set(manifest["files"])
    with pytest.raises(StoreError, match="--xtts"):
        FeatureStore.open(store_path)
    assert verify_store(store_path) == []
    assert main(["prepare", "--verify", str(store_path)]) == 0


@pytest.mark.slow
def test_another_model_is_refused_naming_both_hashes(built, tmp_path):
    import torch

    from myxtts.artifacts.xtts_v2 import read_xtts_v2

    _, store_path, folder = built
    check_model(store_path, read_xtts_v2(folder))  # the model it was made for
    check_model(store_path, folder)
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    torch.save(reference_dvae(seed=5).state_dict(), other / "dvae.pth")
    ident = XttsStore.open(store_path).identity
    new = hashlib.sha256((other / "dvae.pth").read_bytes()).hexdigest()
    with pytest.raises(StoreError) as e:
        check_model(store_path, other)
    assert "\n" not in str(e.value) and ident["dvae_sha256"] in str(e.value) and new in str(e.value)
    shutil.copy(folder / "dvae.pth", other / "dvae.pth")
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    vocab["model"]["vocab"]["zzzz"] = max(vocab["model"]["vocab"].values()) + 1
    (other / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(StoreError, match=ident["vocab_sha256"]):
        check_model(store_path, other)


def test_unencodable_text_is_rejected_with_file_and_line(built):
    data, store_path, _ = built
    report = json.loads((store_path / "report.json").read_text(encoding="utf-8"))
    odd = [r for r in report["rejected"] if r["id"] == "odd"]
    n_lines = len((data / "metadata.csv").read_text(encoding="utf-8").splitlines())
    assert len(odd) == 1 and odd[0]["reason"] == UNENCODABLE
    assert odd[0]["source"] == str(data / "metadata.csv") and odd[0]["line"] == n_lines
    assert f"metadata.csv:{n_lines}" in odd[0]["detail"] and "'ø'" in odd[0]["detail"]
    assert all("odd" not in XttsStore.open(store_path, s).ids for s in ("train", "val"))


def test_persian_grows_the_vocabulary(built):
    from tokenizers import Tokenizer

    from myxtts.text.xtts_v2 import XttsTokenizer

    _, store_path, folder = built
    base = Tokenizer.from_file(str(folder / "vocab.json")).get_vocab()
    grown = Tokenizer.from_file(str(store_path / "vocab.json")).get_vocab()
    assert all(grown[token] == i for token, i in base.items())
    assert "[fa]" in grown and "[fa]" not in base
    ids = XttsTokenizer(store_path / "vocab.json").encode("سلام، حال شما چطور است؟", "fa")
    assert 1 not in ids and ids[0] == grown["[fa]"]
    manifest = json.loads((store_path / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["added_languages"] == {"fa": grown["[fa]"]}


@pytest.mark.slow
def test_resumed_and_parallel_prepares_write_the_same_bytes(built, tmp_path, monkeypatch):
    data, store_path, folder = built
    files = json.loads((store_path / "manifest.json").read_text(encoding="utf-8"))["files"]

    def killed(*a, **k):
        raise KeyboardInterrupt  # after every chunk was committed, before any store file

    out = tmp_path / "resumed"
    with monkeypatch.context() as m:
        m.setattr(xtts_build, "_pack", killed)
        with pytest.raises(KeyboardInterrupt):
            _prepare(data, out, folder, chunk_size=8)
    chunks = sorted((out / ".work" / "chunks").iterdir())
    assert len(chunks) >= 2
    chunks[0].unlink()  # one chunk lost in flight: extracted again, the others reused
    with pytest.raises(StoreError, match="interrupted"):
        XttsStore.open(out)
    said: list[str] = []
    _prepare(data, out, folder, chunk_size=8, echo=said.append)
    assert any("resuming" in s for s in said)
    resumed = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["files"]
    assert resumed == files

    cli_out = tmp_path / "cli"
    assert main(["prepare", str(data), "--out", str(cli_out), "--xtts", str(folder),
                 "--workers", "2", "--quiet", "--set", LANGUAGES]) == 0
    assert json.loads((cli_out / "manifest.json").read_text(encoding="utf-8"))["files"] == files
    assert main(["prepare", str(data), "--out", str(cli_out), "--xtts", str(folder),
                 "--quiet", "--set", LANGUAGES]) == 0  # complete and current: nothing to do


def test_a_common_voice_release_declares_persian_and_grows_the_vocabulary(reduced_folder,
                                                                           tmp_path):
    """A bilingual Common Voice folder as downloaded, prepared with no language named: the
    languages it declares (en, fa) decide, Persian grows the store's vocabulary, its rows
    tokenize without [UNK]; its missing clip is reported with its line, its unreadable one
    with its file."""
    from tests.data.test_readers_downloaded import HAS_MP3, _common_voice

    if not HAS_MP3:
        pytest.skip("this libsndfile cannot write MP3")
    cv = _common_voice(tmp_path / "cv")
    store = tmp_path / "store"
    assert main(["prepare", str(cv), "--out", str(store), "--xtts", str(reduced_folder),
                 "--workers", "1"]) == 0
    report = json.loads((store / "report.json").read_text(encoding="utf-8"))
    missing = report["dataset_problems"][0]
    assert (Path(missing["source"]).name, missing["line"]) == ("train.tsv", 5)
    assert [r["id"] for r in report["rejected"]] == ["bad"]  # the clip that cannot be decoded
    train = XttsStore.open(store, "train")
    assert train.languages == ["en", "fa"]
    fa = train.languages.index("fa")
    persian = [i for i in range(len(train)) if train.language_ids[i] == fa]
    assert persian and all(1 not in train.text(i).tolist() for i in persian)  # no [UNK]
    from tokenizers import Tokenizer

    base = Tokenizer.from_file(str(reduced_folder / "vocab.json")).get_vocab()
    assert train.identity["number_text_tokens"] > max(base.values()) + 1
    assert train.identity["vocab_sha256"] != train.identity["base_vocab_sha256"]
