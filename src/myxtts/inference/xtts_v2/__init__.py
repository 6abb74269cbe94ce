"""Inference with XTTS-v2: decoding the GPT's audio codes (KV cache, sampling)."""
