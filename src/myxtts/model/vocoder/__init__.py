"""The neural vocoder: log-mel -> waveform, and what it is trained against.

Map::

    generator.py       VocosGenerator (ConvNeXt blocks at the frame rate, iSTFT head)
    discriminators.py  multi-period + multi-resolution GAN discriminators
    losses.py          least-squares GAN, feature matching, mel L1, multi-resolution STFT
"""
