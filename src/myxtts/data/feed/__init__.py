"""The feed: batches from a store or from raw audio to the training device.

From a store: ``dataset`` (an utterance is a zero-copy slice), ``buckets`` and ``sampler``
(few padded shapes, exact resume), ``collate``, ``loader`` (workers), ``slots`` (how a
worker's batch reaches the training process) and ``prefetch`` (side-stream copies to the
GPU). From raw audio: ``raw`` (clips -> padded wav batches), ``features`` (the log-mels, on
``data.data_device``), ``onthefly`` (the loader) and ``ring`` (the data role's slots). ``protocol`` holds what the trainer sees of
either path: ``TrainLoader`` and its ``DeviceFeed``.
"""
