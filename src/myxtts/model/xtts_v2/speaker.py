"""XTTS-v2's speaker encoder: 16 kHz audio -> 512-d speaker embedding, the HiFi-GAN's
conditioning (``hifigan_decoder.speaker_encoder`` in the released ``model.pth``).

An H/ASP speaker-verification network (Heo et al. 2020): a squeeze-and-excitation ResNet
(3-4-6-3 basic blocks of 32-64-128-256 channels) over a log mel spectrogram, attentive
statistics pooling over time (a per-channel softmax weighting, then weighted mean and
standard deviation), and a linear projection. Its features are its own: pre-emphasis
0.97, a 25 ms Hamming window every 10 ms, 64 HTK mel bands of power without area
normalisation, ``log(x + 1e-6)``, then per-band normalisation over time (instance norm).

The reference stores its feature buffers in the checkpoint (``torch_spec.*``); here
``PowerMel`` makes them (non-persistent), and the released file's are checked on reading
and recreated on writing by ``artifacts.xtts_v2`` (``layout.speaker_features``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from myxtts.audio.power_mel import PowerMel

SAMPLE_RATE = 16000
PREEMPHASIS = 0.97
N_FFT, WIN_LENGTH, HOP_LENGTH, N_MELS = 512, 400, 160, 64
LOG_FLOOR = 1e-6
BLOCKS = (3, 4, 6, 3)
CHANNELS = (32, 64, 128, 256)
SE_REDUCTION = 8
STD_FLOOR = 1e-5  # variance floor of the pooling: a constant channel's std is ~0.003, not 0



def _feature_bank() -> PowerMel:
    return PowerMel(SAMPLE_RATE, n_fft=N_FFT, win_length=WIN_LENGTH, hop_length=HOP_LENGTH,
                    n_mels=N_MELS, power=2.0, slaney_norm=False, window="hamming")


class XttsSqueezeExcite(nn.Module):
    """Channel gating: the time-frequency mean of each channel, through a bottleneck MLP and
    a sigmoid, scales that channel. ``[B, C, F, T] -> [B, C, F, T]``."""

    def __init__(self, channels: int, reduction: int = SE_REDUCTION):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(channels, channels // reduction), nn.ReLU(),
                                nn.Linear(channels // reduction, channels), nn.Sigmoid())

    def forward(self, x: Tensor) -> Tensor:
        gate = self.fc(x.mean(dim=(2, 3)))
        return x * gate[:, :, None, None]


class XttsSEBlock(nn.Module):
    """Basic ResNet block with squeeze-excitation. Note the order the network was trained
    with: ReLU *before* the first batch norm."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.se = XttsSqueezeExcite(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn1(F.relu(self.conv1(x)))
        out = self.se(self.bn2(self.conv2(out)))
        skip = x if self.downsample is None else self.downsample(x)
        return F.relu(out + skip)


class XttsSpeakerResNet(nn.Module):
    """``[B, S]`` 16 kHz audio -> ``[B, proj_dim]`` speaker embedding (unit norm with
    ``l2_norm``). One embedding per clip whatever its length (~1 s or more is meaningful);
    cost is linear in length, ~2.3 G multiply-adds per second of audio."""

    def __init__(self, proj_dim: int = 512):
        super().__init__()
        self.features = _feature_bank()  # non-persistent buffers: no state-dict keys
        self.conv1 = nn.Conv2d(1, CHANNELS[0], 3, padding=1)
        self.bn1 = nn.BatchNorm2d(CHANNELS[0])
        inplanes = CHANNELS[0]
        for i, (planes, blocks) in enumerate(zip(CHANNELS, BLOCKS, strict=True)):
            stride = 1 if i == 0 else 2
            layer = [XttsSEBlock(inplanes, planes, stride)]
            layer += [XttsSEBlock(planes, planes) for _ in range(blocks - 1)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*layer))
            inplanes = planes
        pooled = CHANNELS[-1] * (N_MELS // 8)  # three stride-2 stages over the mel axis
        self.attention = nn.Sequential(
            nn.Conv1d(pooled, 128, 1), nn.ReLU(), nn.BatchNorm1d(128), nn.Conv1d(128, pooled, 1),
            nn.Softmax(dim=2))
        self.fc = nn.Linear(2 * pooled, proj_dim)

    def log_mel(self, audio: Tensor) -> Tensor:
        """``[B, S]`` -> the network's input: instance-normalised log mel ``[B, 64, frames]``."""
        # pre-emphasis with the first sample's predecessor taken by reflection (x[1])
        padded = torch.cat([audio[:, 1:2], audio], dim=1)
        emphasised = padded[:, 1:] - PREEMPHASIS * padded[:, :-1]
        mel = (self.features(emphasised) + LOG_FLOOR).log()
        return F.instance_norm(mel, eps=1e-5)

    def forward(self, audio: Tensor, l2_norm: bool = True) -> Tensor:
        if audio.ndim == 3:  # [B, 1, S]
            audio = audio.squeeze(1)
        x = self.log_mel(audio).unsqueeze(1)  # [B, 1, 64, T]
        x = self.bn1(F.relu(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # [B, 256, 8, T / 8]
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        w = self.attention(x)
        mean = (x * w).sum(dim=2)
        std = ((x * x * w).sum(dim=2) - mean * mean).clamp(min=STD_FLOOR).sqrt()
        emb = self.fc(torch.cat([mean, std], dim=1))
        return F.normalize(emb, p=2, dim=1) if l2_norm else emb
