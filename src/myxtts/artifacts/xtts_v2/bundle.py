"""An XTTS-v2 model as one myxtts bundle (``myxtts export XTTS_DIR -o FILE``): the folder's
weights in our naming, its voices, DVAE and mel statistics as safetensors tensors, its
``config.json`` and ``vocab.json`` as JSON text in the metadata, sealed with the checksum
of every bundle (``artifacts.bundle``): one file to copy, no pickle, a damaged copy refused.

Tensors: ``model.NAME`` (the networks), ``voice.N.latent`` / ``voice.N.embedding`` (the
stored voices, whose names are the metadata's ``xtts.voices`` list, in order),
``dvae.NAME`` and ``mel_stats`` where the folder has them; the metadata's ``xtts.evaluation``
(JSON), where given, is the fine-tuning run's last evaluation in training. Reading checks
every field as reading the folder does (``model_file.check_model`` and the rest).
"""

from __future__ import annotations

import json
from pathlib import Path

from myxtts.artifacts import bundle as sealed
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.readback import json_field
from myxtts.artifacts.xtts_v2 import layout as lay
from myxtts.artifacts.xtts_v2.config_file import parse_config, text_tokens
from myxtts.artifacts.xtts_v2.folder import XttsV2Files, read_xtts_v2, speaker_shapes
from myxtts.artifacts.xtts_v2.model_file import check_model
from myxtts.artifacts.xtts_v2.run import is_xtts_run, read_xtts_run
from myxtts.artifacts.xtts_v2.torch_files import check_entries, check_mel_stats
from myxtts.system import atomic_write

FAMILY = "xtts-v2"
CONFIG, VOCAB, VOICES, EVALUATION = "xtts.config", "xtts.vocab", "xtts.voices", "xtts.evaluation"
MODEL, DVAE, VOICE, MEL_STATS = "model.", "dvae.", "voice.", "mel_stats"


def write_xtts_v2_bundle(out: str | Path, files: XttsV2Files) -> int:
    """``files`` as one bundle at ``out`` (``files.evaluation`` carried where set); returns
    its size in bytes."""
    tensors = {MODEL + k: v for k, v in files.weights.items()}
    names = list(files.speakers or {})
    for i, name in enumerate(names):
        voice = files.speakers[name]
        tensors[f"{VOICE}{i}.latent"] = voice["gpt_cond_latent"]
        tensors[f"{VOICE}{i}.embedding"] = voice["speaker_embedding"]
    tensors.update({DVAE + k: v for k, v in (files.dvae or {}).items()})
    if files.mel_stats is not None:
        tensors[MEL_STATS] = files.mel_stats
    meta = {sealed.FAMILY_KEY: FAMILY, VOCAB: files.vocab, VOICES: json.dumps(names),
            CONFIG: json.dumps(files.config_json or {}, ensure_ascii=False)}
    if files.evaluation is not None:
        meta[EVALUATION] = json.dumps(files.evaluation, ensure_ascii=False)
    blob = sealed.seal(tensors, meta)
    atomic_write(Path(out), blob)
    return len(blob)


def read_xtts_v2_bundle(path: str | Path) -> XttsV2Files:
    """The XTTS-v2 model a bundle holds, every field checked."""
    path = Path(path)
    meta, tensors = sealed.read_sealed(path)
    where = str(path)
    if meta.get(sealed.FAMILY_KEY) != FAMILY:
        raise ArtifactError(f"{where} is a bundle of a model of `myxtts train`, not of XTTS-v2")
    vocab = meta.get(VOCAB)
    if not isinstance(vocab, str):
        raise ArtifactError(f"{where}: no field {VOCAB!r}; not written by myxtts")
    raw = json_field(where, CONFIG, meta.get(CONFIG))
    config = parse_config(f"{where} ({CONFIG})", raw, text_tokens(path, vocab))
    names = json_field(where, VOICES, meta.get(VOICES, "[]"))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ArtifactError(f"{where}: field {VOICES!r} is not a list of voice names")
    parts = {p: {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}
             for p in (MODEL, DVAE, VOICE)}
    stray = [k for k in tensors if not k.startswith((MODEL, DVAE, VOICE)) and k != MEL_STATS]
    if stray:
        raise ArtifactError(f"{where}: tensor {stray[0]!r} is no field of an XTTS-v2 bundle; "
                            f"not written by myxtts")
    check_model(where, parts[MODEL], config, needs="the model of the bundle's config")
    speakers = {}
    for i, name in enumerate(names):
        voice = {"gpt_cond_latent": parts[VOICE].get(f"{i}.latent"),
                 "speaker_embedding": parts[VOICE].get(f"{i}.embedding")}
        check_entries(f"{where}: voice {name!r}", voice, speaker_shapes(config),
                      lambda _: False, needs="an XTTS-v2 voice of the model")
        speakers[name] = voice
    if len(parts[VOICE]) != 2 * len(names):
        raise ArtifactError(f"{where}: {len(parts[VOICE])} voice tensors for {len(names)} "
                            f"voices; not written by myxtts")
    dvae = parts[DVAE] or None
    if dvae is not None:
        check_entries(f"{where} (DVAE)", dvae, lay.dvae_layout(config), lay.integer_entry,
                      optional=lay.DVAE_OPTIONAL, needs="XTTS-v2's DVAE")
    stats = tensors.get(MEL_STATS)
    if stats is not None:
        stats = check_mel_stats(f"{where} ({MEL_STATS})", stats)
    evaluation = meta.get(EVALUATION)
    if evaluation is not None:
        evaluation = json_field(where, EVALUATION, evaluation)
        if not isinstance(evaluation, dict) or not isinstance(evaluation.get("metrics"), dict):
            raise ArtifactError(f"{where}: field {EVALUATION!r} is not an evaluation record; "
                                f"not written by myxtts")
    return XttsV2Files(config, parts[MODEL], vocab, raw, speakers or None, dvae, stats, path,
                       evaluation)


def is_xtts_v2(path: str | Path) -> bool:
    """A folder holding XTTS-v2's config.json, model.pth and vocab.json, a bundle of one, or
    a fine-tuning run of one (``run``): what ``-c`` and ``evaluate`` read as this family
    (anything else is read as a model of ``myxtts train``, whose reader names what is
    wrong)."""
    p = Path(path)
    if is_xtts_run(p):
        return True
    if p.is_dir():
        return all((p / name).is_file() for name in ("config.json", "model.pth", "vocab.json"))
    return sealed.is_bundle(p) and sealed.bundle_family(p) == FAMILY


def read_xtts_v2_any(path: str | Path, raw_weights: bool = False) -> XttsV2Files:
    """An XTTS-v2 folder as downloaded, a bundle of one, or a fine-tuning run of one (its
    trained GPT: the moving average of the weights where kept, unless ``raw_weights``)."""
    p = Path(path)
    if is_xtts_run(p):
        return read_xtts_run(p, raw_weights)
    return read_xtts_v2(p) if p.is_dir() else read_xtts_v2_bundle(p)

