"""XTTS-v2's GPT equals coqui-tts's on the same seeded weights: the conditioning latents from
a cloning mel, the teacher-forced logits and losses of a padded batch, the latents the
HiFi-GAN decoder reads; and its state dict has the released keys and shapes."""

from __future__ import annotations

import pytest
import torch

from myxtts.model.xtts_v2.gpt import XttsGpt
from tests.xtts_v2.gpt_oracle import gpt_config, our_gpt, released_gpt_state
from tests.xtts_v2.reference import RELEASED, coqui, reference_model

TOL = 2e-5  # float32; achieved: ~1e-7 latents from a mel, ~4e-6 logits


@pytest.fixture(scope="module")
def ref():
    torch.set_num_threads(1)
    return reference_model(seed=0)


@pytest.fixture(scope="module")
def ours(ref):
    return our_gpt(ref)


def _cloning_mel(ref, seconds: float, seed: int) -> torch.Tensor:
    """The reference's own cloning mel of seeded noise (as ``get_gpt_cond_latents`` makes it)."""
    from TTS.tts.models.xtts import wav_to_mel_cloning

    g = torch.Generator().manual_seed(seed)
    wav = 0.1 * torch.randn(1, int(22050 * seconds), generator=g)
    return wav_to_mel_cloning(wav, mel_norms=ref.mel_stats, n_fft=2048, hop_length=256,
                              win_length=1024, power=2, normalized=False, sample_rate=22050,
                              f_min=0, f_max=8000, n_mels=80)


def _batch(ref, seed: int = 1):
    """A padded batch of two: texts of 12 and 7 tokens (zero-padded), codes for 20 and 13
    codes' worth of audio, cloning mels of 3 s and 2 s (the second zero-padded)."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, ref.gpt.number_text_tokens, (2, 12), generator=g)
    text[1, 7:] = 0
    text_lengths = torch.tensor([12, 7])
    codes = torch.randint(0, 1024, (2, 20), generator=g)
    wav_lengths = torch.tensor([20 * 1024, 13 * 1024 - 300])
    long, short = _cloning_mel(ref, 3.0, seed), _cloning_mel(ref, 2.0, seed + 1)
    mels = torch.cat([long, torch.nn.functional.pad(short, (0, long.shape[-1] - short.shape[-1]))])
    return text, text_lengths, codes, wav_lengths, mels


def test_state_dict_has_the_released_keys_and_shapes_at_released_size():
    """On the meta device (no memory, no time): the released architecture's keys and shapes."""
    coqui()
    from TTS.tts.layers.xtts.gpt import GPT

    from myxtts.model.xtts_v2.config import XttsV2Config

    with torch.device("meta"):
        reference = GPT(layers=30, model_dim=1024, start_text_token=261, stop_text_token=0,
                        heads=16, max_text_tokens=402, max_mel_tokens=605, max_prompt_tokens=70,
                        number_text_tokens=6681, num_audio_tokens=1026, start_audio_token=1024,
                        stop_audio_token=1025, use_perceiver_resampler=True, code_stride_len=1024)
        ours = XttsGpt(XttsV2Config())
    theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert mine == theirs
    assert ours.max_gen_mel_tokens == reference.max_gen_mel_tokens == 602


def test_conditioning_latents_equal(ref, ours):
    mel = _cloning_mel(ref, 3.0, seed=5)
    with torch.no_grad():
        expected = ref.gpt.get_style_emb(mel).transpose(1, 2)
        got = ours.conditioning_latents(mel)
    assert got.shape == (1, 32, 256)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)  # float32 over 8 attention layers


def test_teacher_forced_logits_and_losses_equal_for_a_padded_batch(ref, ours):
    text, text_lengths, codes, wav_lengths, mels = _batch(ref)
    with torch.no_grad():
        r_text, r_code, r_logits = ref.gpt(text, text_lengths, codes.clone(), wav_lengths,
                                           cond_mels=mels[:, None], cond_lens=torch.tensor([80, 50]))
        got = ours(text, text_lengths, codes, wav_lengths, cond_mels=mels)
        latents = ours.conditioning_latents(mels)
        from_latents = ours(text, text_lengths, codes, wav_lengths, cond_latents=latents)
    assert got.code_logits.shape == r_logits.shape == (2, 1026, 25)
    torch.testing.assert_close(got.code_logits, r_logits, rtol=0, atol=TOL)
    torch.testing.assert_close(got.text_loss, r_text, rtol=0, atol=TOL)
    torch.testing.assert_close(got.code_loss, r_code, rtol=0, atol=TOL)
    torch.testing.assert_close(from_latents.code_loss, r_code, rtol=0, atol=TOL)


def test_teacher_forced_loss_ignores_the_conditioning_segment_as_the_reference(ref, ours):
    text, text_lengths, codes, wav_lengths, mels = _batch(ref)
    cond_idxs = torch.tensor([[256 * 2, 256 * 9], [256 * 3, 256 * 11]])
    with torch.no_grad():
        r_text, r_code, _ = ref.gpt(text, text_lengths, codes.clone(), wav_lengths,
                                    cond_mels=mels[:, None], cond_idxs=cond_idxs.clone())
        got = ours(text, text_lengths, codes, wav_lengths, cond_mels=mels, cond_idxs=cond_idxs)
        plain = ours(text, text_lengths, codes, wav_lengths, cond_mels=mels)
    torch.testing.assert_close(got.code_loss, r_code, rtol=0, atol=TOL)
    torch.testing.assert_close(got.text_loss, r_text, rtol=0, atol=TOL)
    assert not torch.allclose(got.code_loss, plain.code_loss)
    assert cond_idxs.tolist() == [[512, 2304], [768, 2816]]  # ours leaves the caller's tensor be


def test_teacher_forced_equal_in_training_mode_without_dropout(ref):
    """Training mode differs from eval only by dropout (random, so set to 0 on both sides)
    and by the latents' trimming (the last one instead of the last five)."""
    ours = our_gpt(ref, dropout=0.0).train()
    reference = reference_model(seed=0)  # its own copy: train() and p=0 stay here
    reference.gpt.train()
    for module in reference.gpt.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    text, text_lengths, codes, wav_lengths, mels = _batch(ref, seed=2)
    with torch.no_grad():
        r_text, r_code, r_logits = reference.gpt(text, text_lengths, codes.clone(), wav_lengths,
                                                 cond_mels=mels[:, None])
        got = ours(text, text_lengths, codes, wav_lengths, cond_mels=mels)
        cond = ours.conditioning_latents(mels[:1])
        r_latents = reference.gpt(text[:1], text_lengths[:1], codes[:1].clone(), wav_lengths[:1],
                                  cond_latents=cond, return_latent=True)
        latents = ours.latents(text[:1], text_lengths[:1], codes[:1], wav_lengths[:1], cond)
    torch.testing.assert_close(got.code_logits, r_logits, rtol=0, atol=TOL)
    torch.testing.assert_close(got.text_loss, r_text, rtol=0, atol=TOL)
    torch.testing.assert_close(got.code_loss, r_code, rtol=0, atol=TOL)
    assert latents.shape == r_latents.shape == (1, 24, 256)  # 20 codes + start + 4 stops - 1
    torch.testing.assert_close(latents, r_latents, rtol=0, atol=TOL)


def test_latents_equal_and_one_per_code(ref, ours):
    g = torch.Generator().manual_seed(3)
    text = torch.randint(1, ref.gpt.number_text_tokens, (1, 9), generator=g)
    codes = torch.randint(0, 1024, (1, 17), generator=g)
    codes[0, -1] = ref.gpt.stop_audio_token  # as decoding returns them
    cond = torch.randn(1, 32, 256, generator=g)
    with torch.no_grad():
        expected = ref.gpt(text, torch.tensor([9]), codes.clone(), torch.tensor([17 * 1024]),
                           cond_latents=cond, return_latent=True)
        got = ours.latents_for_codes(cond, text, codes)
    assert got.shape == expected.shape == (1, 17, 256)
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)


def test_bad_voice_is_one_line_error(ours):
    text = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="cond_latents"):
        ours(text, torch.tensor([4]), torch.zeros(1, 3, dtype=torch.long), torch.tensor([3072]))


@pytest.mark.slow
def test_released_size_logits_and_greedy_codes_equal():
    """30 layers x 1024 on the CPU: teacher-forced logits and the first greedy codes."""
    from myxtts.inference.xtts_v2.decode import generate_codes
    from myxtts.model.xtts_v2.config import XttsV2Sampling
    from tests.xtts_v2.gpt_oracle import fix_reference_generation

    torch.set_num_threads(2)
    reference = reference_model(RELEASED, seed=0)
    fix_reference_generation(reference)
    ours = XttsGpt(gpt_config(reference)).eval()
    ours.load_state_dict(released_gpt_state(reference), strict=True)
    g = torch.Generator().manual_seed(4)
    text = torch.randint(1, reference.gpt.number_text_tokens, (1, 10), generator=g)
    codes = torch.randint(0, 1024, (1, 12), generator=g)
    cond = torch.randn(1, 32, 1024, generator=g)
    mel = torch.randn(1, 80, 60, generator=g)
    with torch.no_grad():
        _, r_code, r_logits = reference.gpt(text, torch.tensor([10]), codes.clone(),
                                            torch.tensor([12 * 1024]), cond_mels=mel[:, None])
        got = ours(text, torch.tensor([10]), codes, torch.tensor([12 * 1024]), cond_mels=mel)
        expected = reference.gpt.generate(cond, text, do_sample=False, num_beams=1,
                                          repetition_penalty=5.0, max_new_tokens=5)
    torch.testing.assert_close(got.code_logits, r_logits, rtol=0, atol=TOL)
    torch.testing.assert_close(got.code_loss, r_code, rtol=0, atol=TOL)
    codes_ours = generate_codes(ours, cond, text, XttsV2Sampling(repetition_penalty=5.0),
                                greedy=True, max_codes=5)
    assert torch.equal(codes_ours, expected)
