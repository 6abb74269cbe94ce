"""myxtts: train XTTS-style voice-cloning TTS models whose GPU never waits for data."""

__version__ = "0.1.0"
