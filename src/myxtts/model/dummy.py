"""Random batches in the batch contract (``myxtts.data.batch``), for tests, benchmarks and
dry runs.

Why in the package: the training loop can dry-run (and ``torch.compile``-warm) the worst-case
batch shape before real data arrives, and benchmarks can time the model without a store.
"""

from __future__ import annotations

import torch

from myxtts.data.batch import Batch, BatchShape, stop_targets


def random_batch(n_mels: int, n_tokens: int, token_lengths: list[int], mel_lengths: list[int],
                 ref_lengths: list[int], n_text: int | None = None, n_frames: int | None = None,
                 n_ref: int | None = None, n_languages: int = 1, seed: int = 0,
                 device: torch.device | str = "cpu") -> Batch:
    """A padded batch: one utterance per entry of the length lists.

    Padded sizes default to the longest length (``n_text``/``n_frames``/``n_ref`` may be larger,
    like a bucket's cap). Padding follows the contract: tokens PAD=0, mels 0.0, and
    ``stop_target`` is 1.0 from frame ``mel_length - 1`` on. Token ids avoid the specials 0..3.
    ``data.batch.crop`` takes one utterance out of it, as the collator would pad it alone.
    """
    gen = torch.Generator().manual_seed(seed)
    b = len(token_lengths)
    tl = torch.tensor(token_lengths, dtype=torch.long)
    ml = torch.tensor(mel_lengths, dtype=torch.long)
    rl = torch.tensor(ref_lengths, dtype=torch.long)
    n_text = n_text or int(tl.max())
    n_frames = n_frames or int(ml.max())
    n_ref = n_ref or int(rl.max())
    text_real = torch.arange(n_text)[None] < tl[:, None]  # [B, L]
    frame_real = torch.arange(n_frames)[None] < ml[:, None]  # [B, T]
    ref_real = torch.arange(n_ref)[None] < rl[:, None]  # [B, R]
    tokens = torch.randint(4, n_tokens, (b, n_text), generator=gen) * text_real
    mel = (torch.randn(b, n_frames, n_mels, generator=gen) * 2.0 - 5.0) * frame_real[..., None]
    ref = (torch.randn(b, n_ref, n_mels, generator=gen) * 2.0 - 5.0) * ref_real[..., None]
    batch = {
        "tokens": tokens, "token_lengths": tl, "mel": mel, "mel_lengths": ml,
        "stop_target": stop_targets(ml, n_frames), "ref_mel": ref, "ref_lengths": rl,
        "speaker_ids": torch.zeros(b, dtype=torch.long),
        "language_ids": torch.randint(0, n_languages, (b,), generator=gen),
        "indices": torch.arange(b),
    }
    return {k: v.to(device) for k, v in batch.items()}


def worst_case_batch(shape: BatchShape, n_tokens: int, n_languages: int,
                     device: torch.device | str) -> Batch:
    """A batch of ``shape`` whose every utterance fills it: text ``L`` tokens, ``T`` mel
    frames, ``R`` reference frames. Memory and compute depend on the padded shape alone, so
    no real batch of this bucket needs more (what the warm-up, the auto batch sizes and the
    FLOP count run). Random content from a fixed private generator (the global random
    streams are not touched)."""
    b = shape.batch
    return random_batch(shape.n_mels, max(n_tokens, 5), [shape.text] * b, [shape.frames] * b,
                        [shape.ref_frames] * b, n_text=shape.text, n_frames=shape.frames,
                        n_ref=shape.ref_frames, n_languages=n_languages, seed=0, device=device)


@torch.no_grad()
def randomize_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draw every parameter at unit gain (weights N(0, 1/fan_in), norm gains ~1, biases
    ~N(0, 0.1)), in place. Tests use it so every path matters: under the small training init a
    missing mask moves outputs by only ~1e-6, which tolerances would hide."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            std, mean = p[0].numel() ** -0.5, 0.0
        elif "norm" in name or p.dim() == 0:
            std, mean = 0.1, 1.0
        else:
            std, mean = 0.1, 0.0
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)
    return model
