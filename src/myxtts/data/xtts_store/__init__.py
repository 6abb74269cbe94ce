"""The XTTS store: what XTTS-v2's GPT fine-tunes on (text ids, DVAE codes, 22050 Hz audio),
prepared once by ``myxtts prepare --xtts``. ``format`` defines it (and ``check_model``),
``plan`` makes the vocabulary and tokens, ``extract`` a chunk's codes and audio, ``build``
runs the prepare, ``reader`` maps it for training. The DVAE itself is injected (the data
layer does not import the model): ``myxtts.train.xtts.prepare`` builds it."""

from myxtts.data.xtts_store.format import check_model, is_xtts_store
from myxtts.data.xtts_store.reader import XttsStore

__all__ = ["XttsStore", "check_model", "is_xtts_store"]
