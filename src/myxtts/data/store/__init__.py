"""The prepared feature store: packed, memory-mapped features that training reads in O(1).

``format`` defines what is on disk, ``writer`` writes it (prepare's last step),
``reader`` maps it for training, ``verify`` checks it. Import the public names from here.
"""

from myxtts.data.store.format import MANIFEST, StoreError, read_manifest
from myxtts.data.store.reader import FeatureStore, require_audio
from myxtts.data.store.verify import verify_store

__all__ = ["MANIFEST", "FeatureStore", "StoreError", "read_manifest", "require_audio", "verify_store"]
