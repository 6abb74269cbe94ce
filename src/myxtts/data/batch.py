"""The batch: the one contract between the data pipeline and the model.

Producers (the store's ``StoreBatches``, the ``OnTheFlyLoader``, ``model.dummy.random_batch``)
build it; consumers (``XTTS.forward``, the losses, the loader's shared-memory slots, the
device feed) read it. ``FIELDS`` defines every field once (``RAW_FIELDS`` the on-the-fly wav
batch), so slot layout, ``allocate`` and ``crop`` follow from the table. Padding: token ids
are ``PAD_ID``, mels 0.0, ``stop_target`` 1.0 from the last real frame on. ``mel`` and
``ref_mel`` travel to a GPU as float16 (``FieldSpec.transfer_dtype``: half the bytes a
worker writes and PCIe carries) and are cast exactly on the device. Why a plain dict typed
as :class:`Batch`, not a dataclass: ``torch.compile``, ``pin_memory``, the slots and the
device feed all walk dicts of tensors without special cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
from torch import Tensor

PAD_ID = 0  # token id of text padding (the tokenizer reserves it)
# Sequence axes are padded to multiples of this (tensor-core friendly): text to L, mel
# frames to whole groups of PAD_MULTIPLE decoder steps (frames_per_step frames each).
PAD_MULTIPLE = 8


@dataclass(frozen=True)
class FieldSpec:
    """dtype, dimension names and meaning of one batch field; ``transfer_dtype``: a narrower
    dtype it may travel to the device in (None: ``dtype``). Dimensions: B utterances, L text
    tokens (the bucket's cap, a multiple of PAD_MULTIPLE), T mel frames (the bucket's edge, a
    multiple of frames_per_step x PAD_MULTIPLE), R reference frames (data.ref_frames), M mel
    bands; raw batches: S wav samples, C reference samples (the longest clip / crop)."""

    dtype: torch.dtype
    dims: tuple[str, ...]
    doc: str
    transfer_dtype: torch.dtype | None = None

    @property
    def numpy_dtype(self) -> np.dtype:
        return _NUMPY_DTYPES[self.dtype]

    def host_dtype(self, transfer: bool) -> torch.dtype:
        """The dtype a host-side producer writes: the transfer dtype when batches go to a GPU."""
        return (self.transfer_dtype or self.dtype) if transfer else self.dtype


_NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
                 torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
                 torch.uint8: np.dtype(np.uint8), torch.bool: np.dtype(np.bool_)}


FIELDS: dict[str, FieldSpec] = {
    "tokens": FieldSpec(torch.int64, ("B", "L"),
                        "token ids [BOS, <lang>, characters..., EOS], PAD_ID after token_lengths"),
    "token_lengths": FieldSpec(torch.int64, ("B",), "real tokens per utterance"),
    "mel": FieldSpec(torch.float32, ("B", "T", "M"), "raw log-mel target, 0.0 after mel_lengths",
                     transfer_dtype=torch.float16),
    "mel_lengths": FieldSpec(torch.int64, ("B",), "real mel frames per utterance"),
    "stop_target": FieldSpec(torch.float32, ("B", "T"),
                             "1.0 from frame mel_lengths - 1 on (last real frame and padding)"),
    "ref_mel": FieldSpec(torch.float32, ("B", "R", "M"),
                         "raw log-mel crop of a reference clip of the same speaker, 0.0 after "
                         "ref_lengths", transfer_dtype=torch.float16),
    "ref_lengths": FieldSpec(torch.int64, ("B",), "real reference frames per utterance"),
    "speaker_ids": FieldSpec(torch.int64, ("B",), "index into the store's speaker list"),
    "language_ids": FieldSpec(torch.int64, ("B",), "index into the tokenizer's languages"),
    "indices": FieldSpec(torch.int64, ("B",), "utterance index within its split"),
}


class Batch(TypedDict):
    """A padded training batch (``FIELDS`` documents each entry)."""

    tokens: Tensor
    token_lengths: Tensor
    mel: Tensor
    mel_lengths: Tensor
    stop_target: Tensor
    ref_mel: Tensor
    ref_lengths: Tensor
    speaker_ids: Tensor
    language_ids: Tensor
    indices: Tensor


# The on-the-fly loader's raw batch (``onthefly.WavCollator``): padded waveforms and the
# text fields, before ``features.Featurizer`` turns it into a ``Batch``. Extra dimensions:
# S wav samples (the longest clip), C reference-crop samples (the longest crop).
RAW_FIELDS: dict[str, FieldSpec] = {
    "wav": FieldSpec(torch.float32, ("B", "S"), "trimmed waveform, 0.0 after wav_lengths"),
    "wav_lengths": FieldSpec(torch.int64, ("B",), "real samples per clip"),
    "ref_wav": FieldSpec(torch.float32, ("B", "C"),
                         "reference crop with an STFT margin (audio.frames.crop_window), 0.0 after "
                         "ref_wav_lengths"),
    "ref_wav_lengths": FieldSpec(torch.int64, ("B",), "real samples per reference crop"),
    "ref_first": FieldSpec(torch.int64, ("B",), "the crop's first wanted STFT frame"),
    "ref_frames": FieldSpec(torch.int64, ("B",), "wanted reference frames from ref_first (<= R)"),
    "tokens": FIELDS["tokens"],
    "token_lengths": FIELDS["token_lengths"],
    "speaker_ids": FIELDS["speaker_ids"],
    "language_ids": FIELDS["language_ids"],
    "indices": FIELDS["indices"],
    "n_frames": FieldSpec(torch.int64, (), "the bucket's mel-frame edge T (a 0-d tensor)"),
}


class RawBatch(TypedDict):
    """A padded wav batch of the on-the-fly loader (``RAW_FIELDS`` documents each entry)."""

    wav: Tensor
    wav_lengths: Tensor
    ref_wav: Tensor
    ref_wav_lengths: Tensor
    ref_first: Tensor
    ref_frames: Tensor
    tokens: Tensor
    token_lengths: Tensor
    speaker_ids: Tensor
    language_ids: Tensor
    indices: Tensor
    n_frames: Tensor


@dataclass(frozen=True)
class BatchShape:
    """Sizes of every dimension of one batch: what a bucket pads to."""

    batch: int  # B
    text: int  # L
    frames: int  # T
    ref_frames: int  # R
    n_mels: int  # M

    def sizes(self) -> dict[str, int]:
        return {"B": self.batch, "L": self.text, "T": self.frames, "R": self.ref_frames,
                "M": self.n_mels}

    def of(self, name: str, sizes: dict[str, int] | None = None) -> tuple[int, ...]:
        """Shape of field ``name`` (``sizes``: this shape's ``sizes()``, if already at hand)."""
        sizes = sizes or self.sizes()
        return tuple(sizes[d] for d in FIELDS[name].dims)

    def nbytes(self, align: int = 1, transfer: bool = False) -> int:
        """Bytes of the whole batch, each field rounded up to ``align`` bytes (``transfer``:
        in the dtypes it travels to a GPU in)."""
        return sum(round_up(int(np.prod(self.of(name))) * spec.host_dtype(transfer).itemsize, align)
                   for name, spec in FIELDS.items())


def round_up(x: int | np.ndarray, multiple: int) -> int | np.ndarray:
    """Smallest multiple of ``multiple`` that is >= ``x`` (elementwise for arrays)."""
    return -(-x // multiple) * multiple


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a batch field's torch dtype."""
    return _NUMPY_DTYPES[dtype]


def allocate(shape: BatchShape, transfer: bool = False) -> dict[str, np.ndarray]:
    """Zeroed numpy arrays for every field (``np.zeros`` is a lazily zeroed calloc, so the
    padding costs nothing until written); a producer fills the real parts. ``transfer``: in
    the dtypes a batch travels to a GPU in (float16 mels)."""
    sizes = shape.sizes()
    return {name: np.zeros(shape.of(name, sizes), numpy_dtype(spec.host_dtype(transfer)))
            for name, spec in FIELDS.items()}


def allocate_pinned(shape: BatchShape) -> dict[str, Tensor]:
    """Zeroed tensors for every field in page-locked host memory, in the dtypes a batch
    travels to a GPU in: filled through their ``.numpy()`` views, they are copied to the GPU
    asynchronously as they are (no second copy into pinned memory). The tensors themselves
    must be handed on: torch's caching host allocator keeps a block from reuse until the
    copies queued from it are done only for tensors it allocated. Needs CUDA."""
    sizes = shape.sizes()
    return {name: torch.zeros(shape.of(name, sizes), dtype=spec.host_dtype(True),
                              pin_memory=True) for name, spec in FIELDS.items()}


def to_model_dtypes(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The batch with every field in its ``FIELDS`` dtype: casts what travelled narrower
    (float16 mels; exact) on whatever device the batch is on; other fields pass as they are."""
    out = {}
    for name, t in batch.items():
        spec = FIELDS.get(name)
        cast = spec is not None and isinstance(t, Tensor) and t.dtype != spec.dtype
        out[name] = t.to(spec.dtype) if cast else t
    return out


def stop_targets(mel_lengths: Tensor | np.ndarray, n_frames: int) -> Tensor | np.ndarray:
    """float32 [B, n_frames]: 1.0 from frame ``mel_lengths - 1`` on, 0.0 before.

    The last real frame is the one where the decoder should stop; the padding after it
    is "stopped" too, which keeps the target monotone (the loss masks padding anyway).
    Takes a torch tensor (any device; the result lives there too) or, for the host-side
    collator, a numpy array (the result is numpy: no torch op per batch on the hot path).
    """
    if isinstance(mel_lengths, np.ndarray):
        last = np.maximum(mel_lengths - 1, 0)
        return (np.arange(n_frames)[None, :] >= last[:, None]).astype(np.float32)
    frame = torch.arange(n_frames, device=mel_lengths.device)
    return (frame[None, :] >= (mel_lengths - 1).clamp(min=0)[:, None]).float()


def crop(batch: Batch, index: int, sizes: dict[str, int] | None = None) -> Batch:
    """Utterance ``index`` as a batch of one, its padded axes cut to ``sizes`` (dimension
    name -> length, e.g. ``{"L": 12}``); axes not named are cut to the utterance's own
    length (``L``: token_lengths, ``T``: mel_lengths, ``R``: ref_lengths)."""
    own = {"L": int(batch["token_lengths"][index]), "T": int(batch["mel_lengths"][index]),
           "R": int(batch["ref_lengths"][index])}
    own.update(sizes or {})
    out = {}
    for name, spec in FIELDS.items():
        t = batch[name][index:index + 1]
        for axis, dim in enumerate(spec.dims):
            if dim in own:
                t = t.narrow(axis, 0, own[dim])
        out[name] = t
    return out  # type: ignore[return-value]


def check_fields(batch: dict[str, Tensor], fields: dict[str, FieldSpec],
                 transfer: bool = False) -> dict[str, int]:
    """The size of every dimension of ``batch``, after checking it against a field table
    (``FIELDS``, ``RAW_FIELDS``): every field present, nothing else, dtypes and shapes
    consistent, one device (``transfer``: the dtypes a batch travels to a GPU in). Raises
    ValueError naming the field."""
    missing, extra = sorted(set(fields) - set(batch)), sorted(set(batch) - set(fields))
    if missing or extra:
        table = "FIELDS" if fields is FIELDS else "RAW_FIELDS" if fields is RAW_FIELDS else "its table"
        raise ValueError(f"batch fields differ from data.batch.{table}: missing {missing}, "
                         f"unexpected {extra}")
    sizes: dict[str, int] = {}
    for name, spec in fields.items():
        t = batch[name]
        if not isinstance(t, Tensor):
            raise ValueError(f"batch field {name!r} is a {type(t).__name__}, expected a tensor")
        if t.dtype != spec.host_dtype(transfer):
            raise ValueError(f"batch field {name!r} is {t.dtype}, expected "
                             f"{spec.host_dtype(transfer)}")
        if t.dim() != len(spec.dims):
            raise ValueError(f"batch field {name!r} has shape {tuple(t.shape)}, expected "
                             f"[{', '.join(spec.dims)}]")
        for dim, n in zip(spec.dims, t.shape):
            if sizes.setdefault(dim, int(n)) != n:
                raise ValueError(f"batch field {name!r}: dimension {dim} is {n}, other fields "
                                 f"have {sizes[dim]}")
    devices = {t.device for t in batch.values()}
    if len(devices) > 1:
        raise ValueError(f"batch fields live on several devices: {sorted(map(str, devices))}")
    return sizes


def check_batch(batch: dict[str, Tensor], transfer: bool = False) -> BatchShape:
    """The batch's :class:`BatchShape`, after checking it against ``FIELDS``
    (:func:`check_fields`)."""
    sizes = check_fields(batch, FIELDS, transfer)
    return BatchShape(sizes["B"], sizes["L"], sizes["T"], sizes["R"], sizes["M"])
