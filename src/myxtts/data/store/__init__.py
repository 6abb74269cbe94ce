"""The prepared feature store: packed, memory-mapped features that training reads in O(1).

``format`` defines what is on disk, ``writer`` writes it (prepare's last step),
``reader`` maps it for training, ``finite`` checks its mels for NaN where they are written
and trusts the recorded result after, ``verify`` checks everything, ``mapped`` maps its files
(and names one that shrinks under its map). Import the public names
from here.
"""

from myxtts.data.store.finite import ensure_finite
from myxtts.data.store.format import MANIFEST, StoreError, read_manifest
from myxtts.data.store.reader import FeatureStore, require_audio
from myxtts.data.store.verify import verify_store

__all__ = ["MANIFEST", "FeatureStore", "StoreError", "ensure_finite", "read_manifest",
           "require_audio", "verify_store"]
