"""Text front end: ``clean_text`` (normalisation), ``Tokenizer`` (characters -> ids) and
``split_sentences`` / ``split_long`` (cutting long text into speakable pieces)."""

from myxtts.text.cleaners import clean_text
from myxtts.text.sentences import split_long, split_sentences
from myxtts.text.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, TokenizerError

__all__ = ["clean_text", "split_sentences", "split_long", "Tokenizer", "TokenizerError", "PAD", "BOS",
           "EOS", "UNK"]
