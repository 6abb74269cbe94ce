"""The XTTS-v2 folder as a user downloads it, read whole and checked; and written back out in
the same layout (``myxtts export --format xtts``), which coqui-tts reads as its own.

The folder: ``config.json`` (coqui's config), ``model.pth`` (the weights), ``vocab.json``
(the BPE vocabulary) -- these three are needed to speak -- and, optional,
``speakers_xtts.pth`` (the built-in voices: per name a GPT conditioning latent and a
speaker embedding), ``dvae.pth`` and ``mel_stats.pth`` (the audio-code DVAE and the mel
statistics, needed to fine-tune). Every file is read without running code
(``torch_files``) and checked against the config before use; each failure is one
:class:`ArtifactError` line naming the file and what it should be.

A folder written here carries a record of the files it wrote (``.myxtts-xtts``); writing
into an existing folder replaces such a folder only, never a folder of other files (the
downloaded one included). Each file is written atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.xtts_v2 import layout as lay
from myxtts.artifacts.xtts_v2.config_file import config_json, parse_config, read_json, text_tokens
from myxtts.artifacts.xtts_v2.model_file import check_model, read_model, released_state
from myxtts.artifacts.xtts_v2.torch_files import check_entries, check_mel_stats, load_pth
from myxtts.model.xtts_v2.config import XttsV2Config
from myxtts.outputs import is_inside
from myxtts.system import LOCK_FILE, FolderError, atomic_open, atomic_write, path_kind

CONFIG, MODEL, VOCAB = "config.json", "model.pth", "vocab.json"
SPEAKERS, DVAE, MEL_STATS = "speakers_xtts.pth", "dvae.pth", "mel_stats.pth"
REQUIRED = (CONFIG, MODEL, VOCAB)
_OURS = (CONFIG, MODEL, VOCAB, SPEAKERS, DVAE, MEL_STATS)
WRITTEN_MARKER = ".myxtts-xtts"  # the files write_xtts_v2 wrote in its folder, one a line
_LATENT, _EMBEDDING = "gpt_cond_latent", "speaker_embedding"
_FOLDER_HINT = ("it should be the XTTS-v2 folder as downloaded (config.json, model.pth, "
                "vocab.json, speakers_xtts.pth, ...)")


@dataclass
class XttsV2Files:
    """What an XTTS-v2 folder holds, read and checked: ``weights`` in our naming (the
    state-dict contract of ``myxtts.model.xtts_v2``), ``vocab`` the text of ``vocab.json``,
    ``config_json`` the folder's own ``config.json`` (its other keys are kept when written
    back). ``speakers``: ``{name: {"gpt_cond_latent": [1, 32, D], "speaker_embedding":
    [1, 512, 1]}}``; ``dvae``: the DVAE's state dict; ``mel_stats``: ``[80]``; each None
    where the folder has no such file. ``source``: the folder read, if any. ``evaluation``:
    the last evaluation in training of the fine-tuning run behind the model, where a bundle
    carries one (``myxtts.evaluate.record``'s record; a folder as downloaded has none)."""

    config: XttsV2Config
    weights: dict[str, torch.Tensor]
    vocab: str
    config_json: dict[str, Any] | None = None
    speakers: dict[str, dict[str, torch.Tensor]] | None = None
    dvae: dict[str, torch.Tensor] | None = None
    mel_stats: torch.Tensor | None = None
    source: Path | None = None
    evaluation: dict[str, Any] | None = None


def read_xtts_v2(folder: str | Path) -> XttsV2Files:
    """The XTTS-v2 folder ``folder``, every file read safely and checked (module doc)."""
    folder = Path(folder)
    there = path_kind(folder)
    if there != "a folder":
        what = "does not exist" if there == "nothing" else f"is {there}, not a folder"
        raise ArtifactError(f"{folder} {what}; {_FOLDER_HINT}")
    for name in REQUIRED:
        if not (folder / name).is_file():
            raise ArtifactError(f"{folder} has no {name}; {_FOLDER_HINT}")
    config, raw, vocab = read_config(folder)
    weights = read_model(folder / MODEL, config)
    speakers = read_speakers(folder / SPEAKERS, config) if (folder / SPEAKERS).is_file() else None
    dvae = read_dvae(folder / DVAE, config) if (folder / DVAE).is_file() else None
    stats = None
    if (folder / MEL_STATS).is_file():
        stats = check_mel_stats(str(folder / MEL_STATS),
                                load_pth(folder / MEL_STATS, "XTTS-v2's mel_stats.pth"))
    return XttsV2Files(config, weights, vocab, raw, speakers, dvae, stats, folder)


def read_config(folder: Path) -> tuple[XttsV2Config, dict[str, Any], str]:
    """``config.json`` and ``vocab.json`` of ``folder``: the config, its JSON, the vocabulary."""
    try:
        vocab = (folder / VOCAB).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{folder / VOCAB} cannot be read ({e}); it should be XTTS-v2's "
                            f"vocab.json as downloaded") from None
    tokens = text_tokens(folder / VOCAB, vocab)
    raw = read_json(folder / CONFIG)
    return parse_config(str(folder / CONFIG), raw, tokens), raw, vocab


def read_speakers(path: Path, config: XttsV2Config) -> dict[str, dict[str, torch.Tensor]]:
    """``speakers_xtts.pth``: per voice name its GPT conditioning latent ``[1, 32, D]`` and
    speaker embedding ``[1, d_vector_dim, 1]``."""
    raw = load_pth(path, "XTTS-v2's speakers_xtts.pth")
    where, shapes = str(path), speaker_shapes(config)
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise ArtifactError(f"{where} holds a {type(raw).__name__}, not voices by name; it "
                            f"should be XTTS-v2's speakers_xtts.pth as downloaded")
    for name, voice in raw.items():
        check_entries(f"{where}: voice {name!r}", voice, shapes, lambda _: False,
                      needs="an XTTS-v2 voice of config.json's model")
    return raw


def speaker_shapes(config: XttsV2Config) -> dict[str, tuple[int, ...]]:
    return {_LATENT: (1, 32, config.args.gpt_n_model_channels),
            _EMBEDDING: (1, config.args.d_vector_dim, 1)}


def read_dvae(path: Path, config: XttsV2Config) -> dict[str, torch.Tensor]:
    """``dvae.pth``: the DVAE's state dict (its loss's code histogram may be absent)."""
    raw = load_pth(path, "XTTS-v2's dvae.pth")
    check_entries(str(path), raw, lay.dvae_layout(config), lay.integer_entry,
                  optional=lay.DVAE_OPTIONAL, needs="XTTS-v2's DVAE")
    return raw


def _refuse_other_files(out: Path) -> set[str]:
    """The files an earlier :func:`write_xtts_v2` recorded in ``out`` (none for a new or empty
    folder); FolderError naming ``out`` when it holds anything else, never replaced."""
    there = path_kind(out)
    if there == "nothing":
        return set()
    if there != "a folder":
        raise FolderError(f"cannot write the XTTS-v2 folder {out}: it is {there}; give a folder")
    found = sorted(p for p in out.iterdir() if p.name not in (WRITTEN_MARKER, LOCK_FILE))
    if not found:
        return set()
    try:
        recorded = set((out / WRITTEN_MARKER).read_text(encoding="utf-8").split("\n")) - {""}
    except (OSError, UnicodeDecodeError):
        raise FolderError(f"{out} holds files myxtts did not write there (e.g. {found[0].name}); "
                          f"choose a new or empty folder") from None
    recorded &= set(_OURS)  # names only: a record is never a path to remove elsewhere
    for p in found:
        if p.name not in recorded or not p.is_file():
            raise FolderError(f"{out} holds {p.name}, which myxtts did not write there; move it "
                              f"out or choose a new or empty folder")
    return recorded


def write_xtts_v2(out: str | Path, files: XttsV2Files) -> Path:
    """Write ``files`` to the folder ``out`` in the released layout (module doc): coqui-tts's
    ``Xtts.load_checkpoint`` reads it, and :func:`read_xtts_v2` reads back what was written.
    ``out`` is new, empty, or a folder written here before (replaced); not inside
    ``files.source``. Returns ``out``."""
    out = Path(out)
    if files.source is not None and is_inside(out, files.source):
        raise FolderError(f"cannot write the XTTS-v2 folder into {out}: it is the folder the "
                          f"model was read from ({files.source}); choose another folder")
    earlier = _refuse_other_files(out)
    config, where = files.config, "the model to write"
    number, start, stop = text_tokens(Path(VOCAB), files.vocab)
    if (number, start, stop) != (config.number_text_tokens, config.start_text_token,
                                 config.stop_text_token):
        raise ArtifactError(f"the vocabulary to write has {number} tokens ([START] {start}, "
                            f"[STOP] {stop}), the config says {config.number_text_tokens} "
                            f"([START] {config.start_text_token}, [STOP] "
                            f"{config.stop_text_token}); write the vocabulary the model was "
                            f"trained with")
    check_model(where, files.weights, config, needs="the config's model")
    if files.speakers is not None:
        for name, voice in files.speakers.items():
            check_entries(f"voice {name!r}", voice, speaker_shapes(config), lambda _: False,
                          needs="an XTTS-v2 voice of the model")
    if files.dvae is not None:
        check_entries("the DVAE to write", files.dvae, lay.dvae_layout(config),
                      lay.integer_entry, optional=lay.DVAE_OPTIONAL, needs="XTTS-v2's DVAE")
    if files.mel_stats is not None:
        check_mel_stats("the mel statistics to write", files.mel_stats)
    planned = {CONFIG, MODEL, VOCAB} | {name for name, part in (
        (SPEAKERS, files.speakers), (DVAE, files.dvae), (MEL_STATS, files.mel_stats))
        if part is not None}
    out.mkdir(parents=True, exist_ok=True)
    # recorded before any file is written: a write killed half-way leaves a folder that a
    # second write may still replace
    atomic_write(out / WRITTEN_MARKER, "\n".join(sorted(earlier | planned)) + "\n")
    _save(out / MODEL, {"model": _plain(released_state(files.weights))})
    for name, part in ((SPEAKERS, files.speakers), (DVAE, files.dvae), (MEL_STATS, files.mel_stats)):
        if part is not None:
            _save(out / name, _plain(part))
    atomic_write(out / VOCAB, files.vocab)
    text = json.dumps(config_json(config, files.config_json), indent=4, ensure_ascii=False)
    atomic_write(out / CONFIG, text + "\n")
    for name in sorted(earlier - planned):  # an earlier write's file this one has not
        (out / name).unlink(missing_ok=True)
    atomic_write(out / WRITTEN_MARKER, "\n".join(sorted(planned)) + "\n")
    return out


def _plain(value: Any) -> Any:
    """``value`` with each tensor on the CPU, detached, and a copy of its own where it is a
    view of a larger storage (``torch.save`` would write all of that storage)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu")
        if t.untyped_storage().nbytes() != t.numel() * t.element_size() or not t.is_contiguous():
            t = t.contiguous().clone()
        return t
    return value


def _save(path: Path, obj: Any) -> None:
    with atomic_open(path) as fh:
        torch.save(obj, fh)
