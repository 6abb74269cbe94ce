"""Generated speech for the demo and the tests: a made-up language spoken by synthetic voices.

``voices`` makes the sounds (letters, speakers, rendering), ``corpus`` writes datasets
of them in the LJSpeech layout (``myxtts make-demo-data``, ``myxtts demo``).
"""

from myxtts.synthetic.corpus import make_demo_data
from myxtts.synthetic.voices import DEMO_ALPHABET, demo_speaker, demo_speaker_f0, synthesize_demo

__all__ = ["DEMO_ALPHABET", "demo_speaker", "demo_speaker_f0", "make_demo_data", "synthesize_demo"]
