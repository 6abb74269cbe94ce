"""The config's sections: one dataclass per YAML section, every field with its default and
a one-line help (``myxtts config show`` prints them), and the model size presets."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal


class ConfigError(ValueError):
    """A config key is unknown, has the wrong type or an impossible value."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class AudioConfig:
    """The single feature definition, shared by prepare, training, inference and vocoder."""

    sample_rate: int = _f(22050, "Hz; every clip is resampled (soxr) to this rate")
    n_fft: int = _f(1024, "FFT size of the STFT")
    hop_length: int = _f(256, "samples between frames (frame rate = sample_rate / hop_length)")
    win_length: int = _f(1024, "Hann window length in samples (<= n_fft)")
    n_mels: int = _f(80, "mel bands (Slaney scale and norm)")
    fmin: float = _f(0.0, "lowest mel band edge in Hz")
    fmax: float = _f(8000.0, "highest mel band edge in Hz (<= sample_rate / 2)")
    log_floor: float = _f(1e-5, "magnitudes are clamped to this before the log")
    trim_silence: bool = _f(True, "trim leading/trailing silence when loading a clip")
    resample: bool = _f(True, "resample clips at another rate; false makes such a clip an error")
    trim_db: float = _f(40.0, "a frame quieter than peak - trim_db counts as silence")
    normalize_loudness: bool = _f(False, "scale each clip to target_dbfs RMS (peak-limited)")
    target_dbfs: float = _f(-24.0, "target RMS level in dBFS when normalize_loudness is on")

    @property
    def frames_per_second(self) -> float:
        return self.sample_rate / self.hop_length


@dataclass
class TextConfig:
    """Text normalisation and tokenisation settings (part of the store's feature hash)."""

    languages: list[str] = _f(["en"], "language codes the model knows; each gets its own token")
    default_language: str = _f("en", "language of utterances whose dataset names none")
    lowercase: bool = _f(True, "lowercase text after cleaning (halves the Latin vocabulary)")
    expand_numbers: bool = _f(True, "spell out numbers, ordinals and currency (English)")
    unknown_chars: Literal["reject", "drop", "keep"] = _f(
        "reject", "a transcript with characters outside its language's scripts (Persian or "
        "emoji in an 'en' row): reject the row, drop the characters, or keep them (they "
        "become vocabulary); reported by file and line either way")


@dataclass
class DataConfig:
    """Dataset reading, the prepared store, batching and loading."""

    format: Literal["auto", "ljspeech", "speakers", "manifest", "common_voice", "libritts"] = _f(
        "auto", "dataset layout; auto detects from the files present"
    )
    val_fraction: float = _f(0.05, "share of utterances held out for validation when no val split exists")
    min_val_utterances: int = _f(2, "at least this many validation utterances in a seeded split")
    max_val_utterances: int = _f(1000, "validate on a fixed split_seed subset of this many (0 = all)")
    split_seed: int = _f(1234, "seed of the train/val split (fixed so a re-prepare gives the same split)")
    min_duration_s: float = _f(0.3, "clips shorter than this are rejected by prepare")
    max_duration_s: float = _f(20.0, "clips longer than this are rejected (never truncated)")
    max_text_tokens: int = _f(600, "utterances with more text tokens are rejected")
    refs_per_utterance: int = _f(4, "reference clips of the same speaker recorded per utterance")
    ref_frames: int = _f(256, "frames of the reference mel crop fed to the conditioning encoder")
    batch_frames: int | Literal["auto"] = _f(
        "auto", "frame budget of a batch: batch_size x padded mel length <= this; auto = on a GPU "
        "the largest batch per bucket that fits in auto_batch_memory_share of its memory (probed "
        "before step 1, cached in the run folder), on a CPU 12000")
    auto_batch_memory_share: float = _f(0.85, "batch_frames=auto: share of the training GPU's "
                                        "memory a bucket's worst-case step may use (the rest is "
                                        "headroom)")
    max_batch_size: int = _f(64, "upper bound on utterances per batch (0 = only batch_frames "
                             "or, with auto, the GPU's memory)")
    num_buckets: int = _f(16, "length buckets; each pads to its upper edge, bounding distinct shapes")
    num_workers: int = _f(-1, "loader worker processes; -1 picks from the CPU count")
    prefetch_batches: int = _f(2, "batches copied ahead to the training device on a side stream")
    data_device: str = _f("cpu", "on-the-fly mode only: device that computes mels: 'cpu' (in the "
                          "loader workers, clip by clip) or 'cuda:N' (a thread and "
                          "CUDA stream of its own; may be the training GPU)")
    ring_slots: int = _f(3, "on-the-fly mode: pre-allocated batch slots between the data role and "
                         "the training device (one filled, one in transfer, one trained on); >= 2")
    data_device_memory_cap: float = _f(0.0, "cap on data.data_device's GPU memory, as a share "
                                       "of it (torch.cuda.set_per_process_memory_fraction); "
                                       "0 = no cap")
    shuffle_seed: int = _f(0, "seed of the batch order; each epoch reshuffles from (seed, epoch)")
    store_audio: bool = _f(False, "prepare also keeps each clip's trimmed, resampled waveform "
                           "(int16) in the store: needed by `myxtts train-vocoder`")


@dataclass
class ModelConfig:
    """Architecture. ``preset`` fills every other field; keys set explicitly override it."""

    preset: Literal["tiny", "small", "base"] = _f("tiny", "size preset: tiny (CPU), small, base (~100M)")
    d_model: int = _f(128, "width of every transformer")
    n_heads: int = _f(2, "attention heads (d_model must divide by it)")
    ff_mult: int = _f(4, "feed-forward width = ff_mult x d_model")
    text_layers: int = _f(2, "text encoder layers")
    decoder_layers: int = _f(3, "autoregressive decoder layers")
    cond_layers: int = _f(2, "conditioning (reference) encoder layers")
    cond_latents: int = _f(16, "conditioning latents produced from the reference (Perceiver queries)")
    prenet_dim: int = _f(128, "prenet width; its dropout stays on at inference (Tacotron trick)")
    prenet_dropout: float = _f(0.5, "prenet dropout, also at inference")
    frame_dropout: float = _f(0.0, "share of decoder input frame groups set to the mean (training)")
    dropout: float = _f(0.1, "dropout inside transformers")
    postnet_channels: int = _f(128, "postnet conv channels")
    postnet_layers: int = _f(5, "postnet conv layers")
    postnet_kernel: int = _f(5, "postnet conv kernel size")
    frames_per_step: int = _f(3, "mel frames predicted per decoder step (reduction factor r)")
    max_decoder_frames: int = _f(1500, "inference stops after this many frames (guard)")
    stop_threshold: float = _f(0.5, "inference stops when the stop probability exceeds this")


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # ~2.5 M parameters: trains on a laptop CPU (the demo). ModelConfig's defaults ARE this
    # preset (tests/config/test_sections.py checks it), so Config() builds what `--preset tiny` does.
    "tiny": dict(d_model=128, n_heads=2, ff_mult=4, text_layers=2, decoder_layers=3,
                 cond_layers=2, cond_latents=16, prenet_dim=128, postnet_channels=128,
                 postnet_layers=5, frames_per_step=3),  # r=3: measured to align and clone
                                                        # faster than r=2 in short CPU runs
    # ~35 M parameters: one consumer GPU
    "small": dict(d_model=384, n_heads=6, ff_mult=4, text_layers=4, decoder_layers=6,
                  cond_layers=3, cond_latents=32, prenet_dim=256, postnet_channels=512,
                  postnet_layers=5, frames_per_step=2),
    # ~105 M parameters: depth goes to the autoregressive decoder, 64-dim heads
    "base": dict(d_model=640, n_heads=10, ff_mult=4, text_layers=4, decoder_layers=9,
                 cond_layers=2, cond_latents=32, prenet_dim=256, postnet_channels=512,
                 postnet_layers=5, frames_per_step=2),
}


# The model's parts ``train.freeze`` names (model.xtts.part_of says which weights each holds).
FreezePart = Literal["conditioning", "text_embeddings", "text_encoder", "decoder", "postnet"]


@dataclass
class TrainConfig:
    """Optimisation, precision, checkpointing and logging."""

    output_dir: str = _f("runs/myxtts", "config, vocabulary, checkpoints and logs go here")
    max_steps: int = _f(20000, "optimizer steps to train")
    lr: float = _f(1e-3, "peak learning rate (AdamW)")
    min_lr_ratio: float = _f(0.1, "cosine schedule ends at lr x this")
    warmup_steps: int = _f(500, "linear warmup steps (up to train.lr, then the cosine "
                           "schedule)")
    weight_decay: float = _f(0.01, "AdamW weight decay (not on norms, biases, embeddings)")
    beta1: float = _f(0.9, "AdamW beta1 (momentum of the gradient's moving average)")
    beta2: float = _f(0.98, "AdamW beta2 (of the squared gradient's moving average; below the "
                      "usual 0.999: faster to adapt)")
    grad_clip: float = _f(1.0, "max global gradient norm (0 disables)")
    ema_decay: float = _f(0.99, "keep an exponential moving average of the weights with this "
                          "decay (0 = off; one more copy of the weights on the training device; "
                          "the decay ramps up as min(decay, (1+n)/(10+n)) over the first "
                          "steps n): validation, samples and `myxtts synthesize` use it "
                          "(`synthesize --raw-weights` the trained weights). On the demo (tiny "
                          "preset, its 2100 steps on a CPU) 0.99 validates at 0.736 after the "
                          "last step vs 0.740 without an average and 4-10 % lower from step 300 "
                          "to 1200; 0.995, 0.999 and 0.9995 end within 0.2 % of no average")
    grad_accum_steps: int = _f(1, "batches whose gradients are summed before one optimizer step")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = _f(
        "auto", "auto = bf16 where the GPU supports it, fp16 + grad scaler on older GPUs, fp32 on CPU"
    )
    compile: Literal["auto", "on", "off"] = _f(
        "auto", "torch.compile each transformer block (once per block type, time axis dynamic, "
        "cached on disk): auto = on for CUDA, off on CPU (measured on CPU: tiny compiled 0.79x "
        "eager); eager fallback if it fails"
    )
    cuda_graphs: Literal["auto", "on", "off"] = _f(
        "auto", "replay each bucket shape's whole step (forward, backward, clip, AdamW) as one "
        "CUDA graph: no kernel-launch overhead. auto = on for single-process CUDA training in "
        "bf16/fp32; a capture failure falls back to the plain step with one warning"
    )
    seed: int = _f(1234, "seed of weights, dropout and data order")
    device: str = _f("auto", "training device: auto, cpu, cuda, cuda:N")
    mel_l2_weight: float = _f(0.0, "weight of an extra masked L2 mel loss (0 = L1 only)")
    guided_attn_weight: float = _f(1.0, "weight of the guided (near-diagonal) attention loss")
    guided_attn_sigma: float = _f(0.2, "width of the diagonal band the guided loss favours "
                                  "(0.1-0.6, where its Fourier form is exact)")
    self_feed: float = _f(0.0, "scheduled sampling: max probability that a decoder step is fed "
                          "the model's own previous prediction instead of the ground truth")
    self_feed_after: int = _f(0, "steps of pure teacher forcing before self_feed ramps up "
                              "(linearly, over as many steps again)")
    stop_pos_weight: float = _f(4.0, "BCE positive weight of the stop target (stop frames are rare)")
    log_every: int = _f(25, "steps between console/TensorBoard logs (the only host syncs)")
    val_every: int = _f(500, "steps between teacher-forced validation passes")
    synth_every: int = _f(1000, "steps between free-running validation syntheses (0 disables)")
    synth_sentences: int = _f(2, "validation utterances synthesised each synth_every")
    eval_every: int = _f(0, "steps between evaluations of eval_utterances validation utterances, "
                         "free-running, against their vocoded truth (MCD, F0, voicing, "
                         "duration, speaker similarity with resemblyzer installed), logged as "
                         "eval/ and kept in RUN/evaluation.json (XTTS-v2 fine-tuning: "
                         "greedy, against the true clip); 0 = off (e.g. 2000 on a GPU; on a "
                         "CPU generation takes seconds per utterance)")
    eval_utterances: int = _f(8, "validation utterances scored each eval_every")
    ckpt_every: int = _f(500, "steps between checkpoints")
    keep_last: int = _f(3, "checkpoints kept besides the best-by-validation one")
    max_nonfinite_in_row: int = _f(20, "stop the run after this many consecutive non-finite losses")
    tensorboard: bool = _f(True, "write TensorBoard logs when tensorboard is installed")
    vocoder: str = _f("", "a `myxtts train-vocoder` run (folder or .pt) that voices the validation "
                      "samples; '' = Griffin-Lim")
    device_memory_cap: float = _f(0.0, "cap on train.device's GPU memory, as a share of it "
                                  "(torch.cuda.set_per_process_memory_fraction; "
                                  "batch_frames=auto plans within it); 0 = no cap")
    activation_checkpointing: bool = _f(False, "recompute each transformer block's activations in "
                                        "the backward pass instead of keeping them: less memory "
                                        "(bigger batches or presets) for more compute")
    freeze: list[FreezePart] = _f([], "parts of the model left as they are (no gradient, not "
                                  "in the optimizer), e.g. [conditioning, decoder] when "
                                  "fine-tuning: conditioning (reference encoder), "
                                  "text_embeddings (token and language rows), text_encoder "
                                  "(its layers), decoder, postnet")
    peak_tflops: float = _f(0.0, "the device's dense peak TFLOP/s at the training precision, for "
                            "MFU in logs and `myxtts profile`; 0 = from the built-in table of "
                            "NVIDIA GPUs (MFU is left out on a device it does not know)")


@dataclass
class VocoderConfig:
    """The neural vocoder (``myxtts train-vocoder``): a Vocos-style generator (ConvNeXt blocks
    + an iSTFT head) trained as a GAN on fixed-length segments. ``preset`` fills the size keys;
    keys set explicitly override it. Run-level keys (output_dir, max_steps, precision,
    compile, device, seed, log/val/ckpt intervals) come from the ``train`` section."""

    preset: Literal["tiny", "base"] = _f("tiny", "size preset: tiny (CPU, tests), base (GPU, ~13 M)")
    dim: int = _f(128, "ConvNeXt channels of the generator")
    ff_mult: int = _f(3, "ConvNeXt pointwise width = ff_mult x dim")
    layers: int = _f(4, "ConvNeXt blocks of the generator")
    kernel: int = _f(7, "depthwise kernel (frames) of every ConvNeXt block")
    disc_channels: int = _f(8, "width of the first discriminator layers (doubles with depth)")
    projections: int = _f(1, "consistency projections after the iSTFT head (Griffin-Lim steps "
                          "with the predicted magnitude, trained through); 0 = the plain head")
    periods: list[int] = _f([2, 3, 5, 7, 11], "periods of the multi-period discriminator")
    segment_frames: int = _f(32, "mel frames per training segment (one fixed shape: no recompiles)")
    batch_size: int = _f(8, "segments per batch")
    lr: float = _f(3e-3, "peak learning rate of generator and discriminators (AdamW)")
    beta1: float = _f(0.8, "AdamW beta1 (GAN setting)")
    beta2: float = _f(0.9, "AdamW beta2 (GAN setting)")
    mel_weight: float = _f(45.0, "weight of the mel L1 loss")
    stft_weight: float = _f(1.0, "weight of the multi-resolution STFT loss (spectral convergence "
                            "+ log magnitude): fast early learning; 0 disables")
    fm_weight: float = _f(2.0, "weight of the discriminator feature-matching loss")
    adv_weight: float = _f(1.0, "weight of the adversarial (least-squares) loss")
    disc_start: int = _f(1000, "steps of reconstruction-only training before the discriminators join")
    tts_checkpoint: str = _f("", "fine-tune on this TTS run's teacher-forced mels instead of "
                             "ground-truth mels (a run folder or .pt; '' = ground truth)")


VOCODER_PRESETS: dict[str, dict[str, Any]] = {
    # 0.6 M generator parameters (2.7 M in the discriminators, whose cost dominates a CPU
    # step: at 16 channels they are 10 M and 97 % of it). VocoderConfig's defaults ARE this.
    # lr 3e-3 and 1000 reconstruction-only steps: measured on the demo voices to learn the
    # fastest (mel L1 at 1500 steps: lr 3e-3 0.148, 6e-3 0.164).
    "tiny": dict(dim=128, ff_mult=3, layers=4, kernel=7, disc_channels=8,
                 segment_frames=32, batch_size=8, lr=3e-3, disc_start=1000),
    # Vocos' published size (512 channels, 8 blocks, 1536-wide pointwise): ~13 M parameters,
    # 64-frame (~0.75 s) segments, 16 per batch.
    "base": dict(dim=512, ff_mult=3, layers=8, kernel=7, disc_channels=32,
                 segment_frames=64, batch_size=16, lr=5e-4, disc_start=0),
}


@dataclass
class XttsConfig:
    """Fine-tuning Coqui's XTTS-v2 (``myxtts train STORE --init-from XTTS_DIR`` on a store of
    ``myxtts prepare --xtts``): the GPT's losses and how its voice input is cut. The
    defaults are the reference trainer's. Run-level keys come from the ``train`` section;
    ``data.batch_frames`` counts the GPT's code positions there (about 21.5 per second)."""

    text_loss_weight: float = _f(0.01, "weight of the text tokens' cross-entropy")
    code_loss_weight: float = _f(1.0, "weight of the audio codes' cross-entropy")
    cond_min_s: float = _f(3.0, "shortest voice segment (seconds), cut from the same clip anew "
                           "every epoch")
    cond_max_s: float = _f(6.0, "longest voice segment (seconds); every segment is padded to it")


@dataclass
class Config:
    audio: AudioConfig = field(default_factory=AudioConfig)
    text: TextConfig = field(default_factory=TextConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    vocoder: VocoderConfig = field(default_factory=VocoderConfig)
    xtts: XttsConfig = field(default_factory=XttsConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def feature_hash(self) -> str:
        """Hash of everything that changes prepared features (audio + text sections)."""
        text = dataclasses.asdict(self.text)
        if text.get("unknown_chars") == "reject":  # the default is left out, so a store
            del text["unknown_chars"]  # whose sections lack the key hashes the same
        blob = json.dumps({"audio": dataclasses.asdict(self.audio), "text": text}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Range of train.guided_attn_sigma in which the guided loss's Fourier series is exact to
# ~1e-4 (see myxtts.model.losses.gaussian_cosine_coefficients).
GUIDED_SIGMA_RANGE = (0.1, 0.6)

SECTIONS: dict[str, type] = {"audio": AudioConfig, "text": TextConfig, "data": DataConfig,
            "model": ModelConfig, "train": TrainConfig, "vocoder": VocoderConfig,
            "xtts": XttsConfig}
