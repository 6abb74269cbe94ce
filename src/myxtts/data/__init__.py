"""Data: a dataset on disk -> padded batches on the device, and the store in between.

Preparing: ``readers/`` (one module per dataset layout) -> ``records`` (Utterance, the
report) -> ``plan`` -> ``chunks`` -> ``prepare`` -> ``store/`` (format, writer, reader,
verify); ``inspect`` reports on a dataset. Training from the store: ``buckets`` and
``sampler`` (few shapes, exact resume), ``dataset``, ``collate`` and ``loader`` (workers,
shared-memory slots) produce ``batch``-contract batches; ``prefetch`` copies them to the GPU.
From raw audio: ``onthefly`` with ``features`` on ``data.data_device`` and ``ring``'s slots.
``feed`` is the trainer's view of either path.
"""
