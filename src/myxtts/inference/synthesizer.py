"""Text + a few seconds of reference audio -> waveform, from a training checkpoint or bundle.

The checkpoint carries everything inference needs (config, vocabulary, mel statistics), so a
run folder, one ``.pt`` file or a bundle from ``myxtts export`` is enough (read through
``artifacts.trained``); the reference goes through the training ``MelSpectrogram``. Audio
comes from a trained neural vocoder (checked to speak this model's mel definition) or
Griffin-Lim. Long text is split into sentences decoded in windows of batches
(``inference.longform``); ``stream`` yields audio as its sentences are decoded
(``inference.streaming``). Several reference clips make one voice: each is conditioned on
its own and the latents are averaged (a clip's crop is what the encoder was trained on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from myxtts.artifacts.bundle import Trained
from myxtts.artifacts.trained import load_trained
from myxtts.artifacts.vocoder import build_vocoder, load_vocoder
from myxtts.audio.griffin_lim import GriffinLim
from myxtts.audio.io import AudioError, audio_info, load_audio, save_wav
from myxtts.audio.mel import MelSpectrogram
from myxtts.config import Config, config_from_dict, resolve_device
from myxtts.inference import longform
from myxtts.inference.errors import SynthesisError
from myxtts.inference.streaming import stream_speech
from myxtts.model.xtts import build_model
from myxtts.text import Tokenizer, clean_text
from myxtts.text.scripts import describe, languages_by_script, script_of

log = logging.getLogger(__name__)

MIN_REFERENCE_S = 0.5  # less holds too little of a voice to condition on


class Synthesizer:
    def __init__(self, model: torch.nn.Module, cfg: Config, tokenizer: Tokenizer,
                 device: torch.device, vocoder: torch.nn.Module | None = None) -> None:
        self.model, self.cfg, self.tokenizer, self.device = model.eval(), cfg, tokenizer, device
        self.mel = MelSpectrogram(cfg.audio).to(device)
        self.neural = vocoder is not None
        self.vocoder = vocoder.to(device).eval() if vocoder is not None else GriffinLim(cfg.audio).to(device)
        self.max_frames = cfg.model.max_decoder_frames
        self._reported: set[str] = set()  # unknown characters already reported

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto",
                        vocoder: str | Path | None = None, raw_weights: bool = False
                        ) -> Synthesizer:
        """A run folder, a checkpoint file or a bundle from ``myxtts export`` (read without
        pickle; a vocoder it carries is used unless ``vocoder`` names another run). A run that
        kept a moving average of its weights (``train.ema_decay``) speaks with the average,
        unless ``raw_weights``: then with the trained weights themselves."""
        return cls.from_trained(load_trained(path, raw_weights), device, vocoder)

    @classmethod
    def from_trained(cls, trained: Trained, device: str = "auto",
                     vocoder: str | Path | None = None) -> Synthesizer:
        """The synthesizer of a model already read (``artifacts.trained.load_trained``)."""
        dev = resolve_device(device, "--device")
        cfg = config_from_dict(trained.config)
        tok = Tokenizer.from_dict(trained.vocab)
        model = build_model(cfg, tok.vocab_size, len(tok.languages), trained.mel_mean,
                            trained.mel_std)
        model.load_state_dict(trained.weights)
        voc = load_vocoder(vocoder, cfg.audio, dev) if vocoder else None
        if voc is None and trained.vocoder is not None:
            voc = build_vocoder(trained.vocoder_config, trained.vocoder, cfg.audio,
                                str(trained.source)).to(dev)
        return cls(model.to(dev), cfg, tok, dev, voc)

    @property
    def sample_rate(self) -> int:
        return self.cfg.audio.sample_rate

    # ------------------------------------------------------------- inputs

    def reference(self, path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference mel [1, R, n_mels] and length [1] of one clip, cropped around its middle
        to ``data.ref_frames`` (the length the conditioning encoder was trained on)."""
        try:
            wav = load_audio(path, self.cfg.audio)
        except AudioError as e:  # the clip's own problem, with a reference's fix (the
            # loader's fix speaks of a dataset: "remove it from the dataset")
            raise SynthesisError(f"reference {str(e).rsplit('; ', 1)[0]}; use another "
                                 f"recording of the voice (WAV, FLAC or OGG, 3-10 s)") from None
        self._check_bandwidth(path)
        return self.reference_of(wav, path)

    def reference_of(self, wav: np.ndarray, name: str | Path = "the reference"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`reference` of a clip already loaded (float32 [T] at audio.sample_rate)."""
        seconds = len(wav) / self.cfg.audio.sample_rate
        if seconds < MIN_REFERENCE_S:
            raise SynthesisError(f"reference {name} has {seconds:.2f} s of speech after trimming "
                                 f"silence; give at least {MIN_REFERENCE_S} s of the voice (3-10 s "
                                 f"clone best)")
        mel, n = self.mel(torch.from_numpy(wav).to(self.device))
        n_frames, r = int(n), self.cfg.data.ref_frames
        if n_frames < r // 2:  # usable, but far shorter than what the conditioning trained on
            crop_s = r / self.cfg.audio.frames_per_second
            log.warning("reference %s has %.2f s of speech after trimming, under half the %.2f s "
                        "crops the conditioning encoder trained on (data.ref_frames=%d): the clone "
                        "may sound less like it; give a clip of at least %.1f s", name, seconds,
                        crop_s, r, crop_s / 2)
        start = max(0, (n_frames - r) // 2)
        crop = mel[start:start + r]
        return crop[None], torch.tensor([crop.shape[0]], device=self.device)

    def _check_bandwidth(self, path: str | Path) -> None:
        """Warn when a reference recorded at a low rate (8 kHz telephone audio, even if
        upsampled since) cannot fill the model's mel range: its top bands are empty and the
        conditioning hears an unvoiced, muffled voice."""
        source_rate = audio_info(path).sample_rate
        fmax = self.cfg.audio.fmax
        if source_rate / 2 < fmax:
            log.warning("reference %s is recorded at %d Hz: it holds nothing above %.0f Hz, "
                        "but the model's mel range reaches audio.fmax=%.0f Hz, so the voice "
                        "may come out unvoiced or muffled; give a reference recorded at "
                        "%.0f Hz or more", path, source_rate, source_rate / 2, fmax, 2 * fmax)

    @torch.inference_mode()
    def voice(self, audio_paths: Sequence[str | Path | np.ndarray]) -> torch.Tensor:
        """Conditioning latents [1, C, d] of a voice: the mean over the clips' latents (clip
        files, or clips already loaded as float32 arrays at audio.sample_rate)."""
        if not audio_paths:
            raise SynthesisError("no reference audio: give --reference CLIP (a few seconds of the voice)")
        latents = [self.model.condition(*(self.reference_of(p) if isinstance(p, np.ndarray)
                                          else self.reference(p))) for p in audio_paths]
        return torch.stack(latents).mean(dim=0)

    def language_for(self, text: str, language: str | None = None) -> str:
        """``language`` when given; else the language of the model whose scripts hold the
        most letters of ``text`` (the default language on a tie): Persian letters speak
        ``fa``, Latin ``en``; stray letters of another script are left out and reported as
        unknown characters. A text none of whose letters any language of the model writes
        is refused naming the languages it knows; a text without letters takes the default."""
        if language is not None:
            return language
        known, default = self.tokenizer.languages, self.cfg.text.default_language
        letters = [ch for ch in text if ch.isalpha()]
        if not letters:
            return default
        held = {lang: sum(1 for ch in letters if languages_by_script(ch, [lang]))
                for lang in known}
        best = max(held.values())
        if best > 0:
            return default if held.get(default) == best else next(
                lang for lang in known if held[lang] == best)
        scripts = sorted({script_of(ch) for ch in letters})
        raise SynthesisError(f"the text {text[:40]!r} is written in {'/'.join(scripts)} letters, "
                             f"which no language of this model uses (it knows "
                             f"{', '.join(known)}); pass --language to force one")

    def sentence_language(self, sentence: str, text_language: str) -> str:
        """The language one sentence of a text is spoken in: the one its letters say
        (:meth:`language_for`), so a Persian sentence in an English paragraph is spoken as
        Persian; the text's own for a sentence without letters (numbers are read out in the
        text's language) or in letters no language of the model uses."""
        if not any(ch.isalpha() for ch in sentence):
            return text_language
        try:
            return self.language_for(sentence)
        except SynthesisError:  # stray letters: spoken as <unk> in the text's language
            return text_language

    def _languages(self, texts: Sequence[str], language: str | Sequence[str] | None) -> list[str]:
        """One language per text: ``language`` for all, one each, or each text's own."""
        if language is None:
            return [self.language_for(t) for t in texts]
        if isinstance(language, str):
            return [language] * len(texts)
        return list(language)

    def encode(self, texts: Sequence[str], language: str | Sequence[str], check: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids [B, L] and lengths [B] of ``texts``, in ``language`` (or one language
        per text). ``check``: refuse a text with nothing to speak (off for the sentence
        pieces of a text that was checked whole: a piece such as "..." is then simply a
        short pause)."""
        languages = self._languages(texts, language)
        for lang in dict.fromkeys(languages):
            if lang not in self.tokenizer.languages:
                raise SynthesisError(f"language {lang!r} is not known to this model "
                                     f"(it knows {', '.join(self.tokenizer.languages)})")
        cleaned = [clean_text(t, lang, self.cfg.text) for t, lang in zip(texts, languages)]
        if check:
            self._check_speakable(texts, cleaned, languages)
        ids = [self.tokenizer.encode(c, lang, report=False) for c, lang in zip(cleaned, languages)]
        lengths = torch.tensor([len(i) for i in ids])
        tokens = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
        for b, i in enumerate(ids):
            tokens[b, : len(i)] = torch.tensor(i)
        return tokens.to(self.device), lengths.to(self.device)

    def _check_speakable(self, texts: Sequence[str], cleaned: Sequence[str],
                         languages: Sequence[str]) -> None:
        """A text with no letter or digit this model knows would decode into seconds of noise
        until the frame guard: an error. Characters it does not know are spoken as <unk>:
        reported once, as one list, the first time they appear."""
        new: dict[str, int] = {}
        for text, c, language in zip(texts, cleaned, languages):
            missing = [ch for ch in c if not ch.isspace() and not self.tokenizer.knows(ch)]
            if not any(ch.isalnum() and self.tokenizer.knows(ch) for ch in c):
                what = (f"; it does not know {describe(sorted(set(missing)))}" if missing else "")
                raise SynthesisError(f"text {text!r} has nothing this model can speak (no letter "
                                     f"or digit of its {language!r} vocabulary{what}); give "
                                     f"words to say")
            for ch in missing:
                if ch not in self._reported:
                    new[ch] = new.get(ch, 0) + 1
        if new:
            self._reported.update(new)
            log.warning("characters this model did not train on are spoken as <unk>: %s",
                        describe(sorted(new)))

    # ------------------------------------------------------------- synthesis

    @torch.inference_mode()
    def synthesize_mel(self, texts: Sequence[str], reference: Sequence[str | Path] | torch.Tensor,
                       language: str | Sequence[str] | None = None, seed: int | None = 0,
                       check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Each text decoded as ONE utterance (no splitting), batched, one voice (clip paths
        or latents from ``voice``); each in ``language``, its own from a list, or the one its
        letters say. Returns log-mels [B, F, n_mels] and lengths [B]."""
        latents = reference if isinstance(reference, torch.Tensor) else self.voice(reference)
        languages = self._languages(texts, language)
        tokens, token_lengths = self.encode(texts, languages, check)
        if seed is not None:
            torch.manual_seed(seed)  # prenet dropout stays on at inference: fix it for repeatability
        b = tokens.shape[0]
        lang = torch.tensor([self.tokenizer.language_id(x) for x in languages], device=self.device)
        return self.model.generate(tokens, token_lengths, lang, None, None,
                                   max_frames=self.max_frames, latents=latents.expand(b, -1, -1))

    def vocode(self, mels: torch.Tensor, lengths: torch.Tensor) -> list[np.ndarray]:
        """Log-mels [B, F, n_mels] -> float32 clips cut to ``lengths[b] * hop`` samples."""
        return self.vocoder.waveforms(mels, lengths)

    def synthesize(self, texts: Sequence[str], reference: Sequence[str | Path],
                   language: str | None = None, seed: int | None = 0) -> list[np.ndarray]:
        """One clip per text; a text of several sentences is split, decoded in batches with
        the others and joined with short pauses (``inference.longform``). Without
        ``language`` each sentence is spoken in the language its letters say
        (:meth:`sentence_language`)."""
        out: list[list[np.ndarray]] = [[] for _ in texts]
        for k, audio in self.speak(texts, reference, language, seed):
            out[k].append(audio)
        return [np.concatenate(parts) if parts else np.zeros(0, np.float32) for parts in out]

    def speak(self, texts: Sequence[str], reference: Sequence[str | Path] | torch.Tensor,
              language: str | None = None, seed: int | None = 0,
              progress: Callable[[int, int], None] | None = None
              ) -> Iterator[tuple[int, np.ndarray]]:
        """``(text index, audio)`` in text order, one piece (with its pause) at a time, decoded
        window by window (``inference.longform.windows``) and vocoded ``MAX_BATCH`` pieces at
        a time: memory holds one window, not the text. Without ``language`` each sentence
        is spoken in its own (:meth:`sentence_language`). ``progress(done, total)`` once the
        text is planned (done 0) and after each window, in sentences."""
        latents = reference if isinstance(reference, torch.Tensor) else self.voice(reference)
        languages = self._languages(texts, language)
        self.encode(texts, languages)  # user errors (language, nothing to say) before decoding
        if language is None:
            pieces = longform.plan_pieces(texts, languages, self.sentence_language,
                                          self.tokenizer.languages)
        else:
            pieces = longform.plan_pieces(texts, languages)
        if progress is not None:  # planned: a long text's first line before its first window
            progress(0, len(pieces))
        guard = longform.StopGuard(self.max_frames, self.cfg.audio.frames_per_second)
        sr, done = self.cfg.audio.sample_rate, 0
        for window in longform.windows(pieces):
            decoded = longform.decode_window(
                window, lambda batch: self.synthesize_mel(
                    [p.text for p in batch], latents, [p.language for p in batch], seed,
                    check=False), guard)
            # However many pieces the window became (a sentence split down to its words),
            # the vocoder holds at most MAX_BATCH of them at once.
            for start in range(0, len(decoded), longform.MAX_BATCH):
                part = decoded[start:start + longform.MAX_BATCH]
                mels = [m for _, m in part]
                lengths = torch.tensor([m.shape[0] for m in mels], device=self.device)
                padded = torch.nn.utils.rnn.pad_sequence(mels, batch_first=True)  # [P, F, n_mels]
                for wav, (piece, _) in zip(self.vocode(padded, lengths), part):
                    yield piece.source, longform.join([wav], [piece.pause_s], sr)
            done += len(window)
            if progress is not None:
                progress(done, len(pieces))

    def stream(self, text: str, reference: Sequence[str | Path], language: str | None = None,
               seed: int | None = 0, first_frames: int = 8, chunk_frames: int = 32
               ) -> Iterator[np.ndarray]:
        """float32 audio chunks of ``text`` as its sentences are decoded (see
        ``inference.streaming``); their concatenation is ``synthesize([text], ...)[0]``."""
        return stream_speech(self, text, reference, language, seed, first_frames, chunk_frames)

    def synthesize_to_files(self, texts: Sequence[str], reference: Sequence[str | Path],
                            outputs: Sequence[str | Path], language: str | None = None,
                            seed: int | None = 0) -> list[Path]:
        paths = []
        for wav, out in zip(self.synthesize(texts, reference, language, seed), outputs):
            save_wav(Path(out), wav, self.cfg.audio.sample_rate)
            paths.append(Path(out))
        return paths

