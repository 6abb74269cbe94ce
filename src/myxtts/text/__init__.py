"""Text front end: ``clean_text`` (normalisation) and ``Tokenizer`` (characters -> ids)."""

from myxtts.text.cleaners import clean_text
from myxtts.text.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, TokenizerError

__all__ = ["clean_text", "Tokenizer", "TokenizerError", "PAD", "BOS", "EOS", "UNK"]
