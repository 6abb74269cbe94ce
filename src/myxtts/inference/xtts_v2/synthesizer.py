"""XTTS-v2 speaking: text + a voice (reference clips or a stored speaker) -> 24 kHz audio,
whole or streamed as its codes come.

Per sentence, as the reference's ``inference``: the text stripped and lower-cased, encoded
(``text.xtts_v2``), its audio codes decoded by the GPT over a KV cache
(``inference.xtts_v2.decode``), the latents of those codes computed again in one
teacher-forced pass, stretched by ``1 / speed`` and decoded by the HiFi-GAN. A long text is
cut into pieces within the language's character limit (``XttsTokenizer.split``) whose audio
is joined end to end, as the reference's text splitting does. Where the reference decodes
the pieces one after another, :meth:`XttsV2Synthesizer.speak` decodes up to
``Decoding.max_batch`` of them together, one batch (``decode.decode_pieces``: on a CPU a
step of B pieces costs about what a step of one does), then runs the HiFi-GAN per piece;
greedy audio is the same as one after another (to float rounding), sampled audio is
another draw. Streaming decodes one piece after another: its first chunk comes soonest so.
``Decoding`` holds how codes are drawn: the config's sampling, each value overridable, or
``greedy`` (deterministic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from myxtts.artifacts.xtts_v2 import XttsV2Files, read_xtts_v2_any
from myxtts.audio.io import AudioError, save_wav
from myxtts.config import resolve_device
from myxtts.inference.errors import SynthesisError
from myxtts.inference.xtts_v2.chunks import CONTEXT_FRAMES, CrossfadeJoiner
from myxtts.inference.xtts_v2.decode import decode_pieces, stream_codes
from myxtts.inference.xtts_v2.voice import XttsVoice, clips_of, pick_speaker, speakers_voices
from myxtts.model.xtts_v2.config import XttsV2Sampling
from myxtts.model.xtts_v2.model import XttsV2Model, stretch
from myxtts.text.tokenizer import TokenizerError
from myxtts.text.xtts_v2 import XttsTokenizer

STREAM_CODES = 20  # codes per streamed chunk (the reference's stream_chunk_size)
STREAM_OVERLAP = 1024  # samples cross-faded between chunks (its overlap_wav_len)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the GPT's precision


@dataclass(frozen=True)
class Decoding:
    """How codes are chosen: ``sampling`` (the config's unless overridden); ``greedy``:
    the most likely code each step after the repetition penalty, so the same text, voice
    and model always give the same audio; ``max_codes``: at most this many codes per
    sentence (None: the model's own limit); ``speed``: above 1 faster speech;
    ``max_batch``: pieces of a text decoded together (1: one after another; more costs a
    KV cache per piece and, while sampling, gives other draws than one after another)."""

    sampling: XttsV2Sampling
    greedy: bool = False
    max_codes: int | None = None
    speed: float = 1.0
    max_batch: int = 8


class XttsV2Synthesizer:
    def __init__(self, model: XttsV2Model, tokenizer: XttsTokenizer, device: torch.device,
                 speakers: dict[str, dict[str, torch.Tensor]] | None = None,
                 source: str = "the model", decoding: Decoding | None = None) -> None:
        self.model, self.tokenizer, self.device = model.to(device).eval(), tokenizer, device
        self.config = model.config
        self.voices = speakers_voices(speakers or {})
        self.source = source
        self.decoding = decoding or Decoding(self.config.sampling)

    @classmethod
    def from_path(cls, path: str | Path, device: str = "auto", dtype: str = "float32"
                  ) -> XttsV2Synthesizer:
        """An XTTS-v2 folder as downloaded or a bundle of one (``myxtts export``)."""
        return cls.from_files(read_xtts_v2_any(path), device, dtype)

    @classmethod
    def from_files(cls, files: XttsV2Files, device: str = "auto", dtype: str = "float32"
                   ) -> XttsV2Synthesizer:
        """The synthesizer of a model already read (``artifacts.xtts_v2``); ``dtype``: the
        GPT's precision, ``float32`` (equal to the reference) or ``bfloat16``
        (``XttsV2Model.set_gpt_dtype``)."""
        if dtype not in DTYPES:
            raise SynthesisError(f"--dtype {dtype}: give one of {', '.join(DTYPES)}")
        dev = resolve_device(device, "--device")
        model = XttsV2Model(files.config)
        model.load_state_dict(files.weights, strict=True)
        model.set_gpt_dtype(DTYPES[dtype])
        name = str(files.source) if files.source is not None else "the model"
        tokenizer = XttsTokenizer(Path(name) / "vocab.json", text=files.vocab)
        return cls(model, tokenizer, dev, files.speakers, name)

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(self.config.languages)

    def with_decoding(self, greedy: bool | None = None, max_codes: int | None = None,
                      speed: float | None = None, max_batch: int | None = None,
                      **sampling: float | int | None) -> None:
        """Override how codes are chosen; a None leaves that value as it is."""
        if max_batch is not None and max_batch < 1:
            raise SynthesisError(f"--batch-pieces {max_batch}: give 1 (one piece after "
                                 f"another) or more")
        chosen = {k: v for k, v in sampling.items() if v is not None}
        d = self.decoding
        self.decoding = Decoding(dataclasses.replace(d.sampling, **chosen),
                                 d.greedy if greedy is None else greedy,
                                 d.max_codes if max_codes is None else max_codes,
                                 d.speed if speed is None else speed,
                                 d.max_batch if max_batch is None else max_batch)

    # ------------------------------------------------------------- voices

    @torch.inference_mode()
    def voice(self, references: Sequence[str | Path | np.ndarray], rate: int | None = None
              ) -> XttsVoice:
        """The voice of reference clips (files, or samples at ``rate``): speaker embeddings
        averaged, conditioning latents from the clips joined (module ``voice``)."""
        clips = clips_of(references, rate, self.config.voice)
        speaker = torch.stack([self.model.speaker_embedding(c.to(self.device))
                               for c in clips]).mean(dim=0)
        joined = torch.cat(clips, dim=-1).to(self.device)
        try:
            latents = self.model.conditioning_latents(joined)
        except AudioError as e:
            raise SynthesisError(f"{e}; give a longer --reference clip (3-30 s)") from None
        return XttsVoice(latents, speaker)

    def speaker(self, name: str) -> XttsVoice:
        """A voice of the released ``speakers_xtts.pth`` by name."""
        return pick_speaker(self.voices, name, self.source).to(self.device)

    # ------------------------------------------------------------- text

    def language(self, language: str | None) -> str:
        known = self.languages
        if language is None:
            raise SynthesisError(f"XTTS-v2 needs the text's language: pass --language (one of "
                                 f"{', '.join(known)})")
        base = language.split("-")[0].lower()
        if base not in {k.split("-")[0] for k in known}:
            raise SynthesisError(f"language {language!r} is not one XTTS-v2 speaks here; "
                                 f"supported: {', '.join(known)}")
        return base

    def pieces(self, text: str, language: str) -> list[str]:
        """``text`` cut within the language's character limit, each piece stripped."""
        cut = [p.strip() for p in self.tokenizer.split(text, language)]
        return [p for p in cut if p]

    def tokens(self, piece: str, language: str) -> torch.Tensor:
        try:
            ids = self.tokenizer.encode(piece.strip().lower(), language)
        except (TokenizerError, ImportError) as e:
            raise SynthesisError(str(e)) from None
        room = self.config.args.gpt_max_text_tokens
        if len(ids) >= room:
            raise SynthesisError(f"a piece of the text is {len(ids)} tokens, the model reads "
                                 f"fewer than {room}: {piece[:40]!r}...; add sentence ends")
        return torch.tensor([ids], device=self.device)

    # ------------------------------------------------------------- speech

    def _generator(self, seed: int | None) -> torch.Generator | None:
        if seed is None or self.decoding.greedy:
            return None
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def say(self, piece: str, voice: XttsVoice, language: str, seed: int | None = 0
            ) -> tuple[np.ndarray, bool]:
        """One piece of text, whole: float32 audio and whether decoding reached the code
        cap without the stop token. The latents decoded are the GPT's states as it chose
        each code (the reference computes the same states again in a second, teacher-forced
        pass; they agree to float rounding, and the pass costs a prefill of every code)."""
        d, lang = self.decoding, self.language(language)
        tokens = self.tokens(piece, lang)
        try:
            steps = list(stream_codes(self.model.gpt, voice.latents, tokens, d.sampling,
                                      greedy=d.greedy, max_codes=d.max_codes,
                                      generator=self._generator(seed)))
        except ValueError as e:  # a setting of config.json or a flag the decoder refuses
            raise SynthesisError(f"{self.source}: {e}") from None
        stopped = int(steps[-1][0][0]) == self.model.gpt.stop_audio_token
        latents = stretch(torch.stack([h for _, h in steps], dim=1).float(), d.speed)
        wav = self.model.waveform(latents, voice.speaker)[0]
        return wav.float().cpu().numpy(), not stopped

    @torch.inference_mode()
    def say_pieces(self, pieces: Sequence[str], voice: XttsVoice, language: str,
                   seed: int | None = 0) -> list[tuple[np.ndarray, bool]]:
        """Pieces of a text decoded together as one batch (see the module docstring), each
        as :meth:`say` gives it: its audio and whether it reached the code cap. Sampling
        draws every piece's codes from one generator seeded with ``seed``, so the audio is
        another draw than :meth:`say`'s piece by piece (greedy audio is the same)."""
        d, lang = self.decoding, self.language(language)
        rows = [self.tokens(p, lang)[0] for p in pieces]
        try:
            decoded = decode_pieces(self.model.gpt, voice.latents, rows, d.sampling,
                                    greedy=d.greedy, max_codes=d.max_codes,
                                    generator=self._generator(seed))
        except ValueError as e:  # a setting of config.json or a flag the decoder refuses
            raise SynthesisError(f"{self.source}: {e}") from None
        out = []
        for codes, states in decoded:
            wav = self.model.waveform(stretch(states[None].float(), d.speed), voice.speaker)[0]
            stopped = int(codes[-1]) == self.model.gpt.stop_audio_token
            out.append((wav.float().cpu().numpy(), not stopped))
        return out

    def speak(self, texts: Sequence[str], voice: XttsVoice, language: str | None = None,
              seed: int | None = 0, progress: Callable[[int, int], None] | None = None
              ) -> Iterator[tuple[int, np.ndarray]]:
        """``(text index, audio)`` per piece, in order; ``progress(done, total)`` in pieces.
        Up to ``decoding.max_batch`` pieces (of any of the texts) are decoded together."""
        lang = self.language(language)
        planned = [(k, p) for k, t in enumerate(texts) for p in self.pieces(t, lang)]
        if not planned:
            raise SynthesisError("nothing to say: the text is empty")
        if progress is not None:
            progress(0, len(planned))
        size = self.decoding.max_batch
        for first in range(0, len(planned), size):
            batch = planned[first:first + size]
            if len(batch) == 1:
                spoken = [self.say(batch[0][1], voice, lang, seed)]
            else:
                spoken = self.say_pieces([p for _, p in batch], voice, lang, seed)
            for done, ((k, _), (audio, _)) in enumerate(zip(batch, spoken), start=first + 1):
                yield k, audio
                if progress is not None:
                    progress(done, len(planned))

    def synthesize(self, texts: Sequence[str], voice: XttsVoice, language: str | None = None,
                   seed: int | None = 0) -> list[np.ndarray]:
        out: list[list[np.ndarray]] = [[] for _ in texts]
        for k, audio in self.speak(texts, voice, language, seed):
            out[k].append(audio)
        return [np.concatenate(parts) if parts else np.zeros(0, np.float32) for parts in out]

    def synthesize_to_files(self, texts: Sequence[str], voice: XttsVoice,
                            outputs: Sequence[str | Path], language: str | None = None,
                            seed: int | None = 0) -> list[Path]:
        paths = []
        for wav, out in zip(self.synthesize(texts, voice, language, seed), outputs):
            save_wav(Path(out), wav, self.sample_rate)
            paths.append(Path(out))
        return paths

    @torch.inference_mode()
    def stream(self, text: str, voice: XttsVoice, language: str | None = None,
               seed: int | None = 0, codes_per_chunk: int = STREAM_CODES,
               overlap: int = STREAM_OVERLAP) -> Iterator[np.ndarray]:
        """float32 audio chunks of ``text`` while its codes are decoded: every
        ``codes_per_chunk`` codes the new audio, cross-faded as the reference streams
        (``inference.xtts_v2.chunks``)."""
        lang = self.language(language)
        for piece in self.pieces(text, lang):
            yield from self._stream_piece(piece, voice, lang, seed, codes_per_chunk, overlap)

    def _stream_piece(self, piece: str, voice: XttsVoice, lang: str, seed: int | None,
                      codes_per_chunk: int, overlap: int) -> Iterator[np.ndarray]:
        d = self.decoding
        tokens = self.tokens(piece, lang)
        joiner, latents, fresh = CrossfadeJoiner(overlap), [], 0
        decoder = self.model.hifigan_decoder
        codes = stream_codes(self.model.gpt, voice.latents, tokens, d.sampling, greedy=d.greedy,
                             max_codes=d.max_codes, generator=self._generator(seed))
        done = False
        while not done:
            try:
                _, latent = next(codes)
                latents.append(latent)
                fresh += 1
            except StopIteration:
                done = True
            if not latents or not (done or fresh >= codes_per_chunk):
                continue
            frames = decoder.frames(stretch(torch.stack(latents, dim=1).float(), d.speed))
            hop = decoder.samples_per_frame
            total, first = frames.shape[-1] * hop, joiner.start() // hop
            begin = max(0, first - CONTEXT_FRAMES)
            tail = decoder.waveform_decoder(frames[..., begin:], voice.speaker)[0, 0]
            chunk = joiner.push(tail[joiner.start() - begin * hop:], total, done)
            fresh = 0
            yield chunk.float().cpu().numpy()
