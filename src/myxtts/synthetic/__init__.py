"""Generated speech for the demo and the tests: made-up languages spoken by synthetic voices.

``voices`` makes the sounds (letters, speakers, rendering), ``persian_demo`` defines the
second language (``fa``, in Persian letters), ``corpus`` writes datasets of them in the
LJSpeech layout (``myxtts make-demo-data``, ``myxtts demo``).
"""

from myxtts.synthetic.corpus import DEMO_LANGUAGES, demo_sentence, make_demo_data, speaker_languages
from myxtts.synthetic.voices import (
    DEMO_ALPHABET,
    DEMO_ALPHABETS,
    demo_speaker,
    demo_speaker_f0,
    synthesize_demo,
)

__all__ = ["DEMO_ALPHABET", "DEMO_ALPHABETS", "DEMO_LANGUAGES", "demo_sentence", "demo_speaker",
           "demo_speaker_f0", "make_demo_data", "speaker_languages", "synthesize_demo"]
