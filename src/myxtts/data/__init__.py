"""Data: a dataset on disk -> padded batches on the training device.

``batch`` is the contract every room speaks (the fields of a batch, their dtypes and shapes).
Then three rooms, each importing only the rooms before it:

    prepare/  a dataset folder -> a store: readers (one per layout), records (utterances
              and the problem report), plan, chunks (parallel feature extraction), build
              (the ``prepare`` command's work), report, inspect
    store/    the packed, memory-mapped features: format, writer, reader, verify
    feed/     from a store (or raw audio, on the fly) to batches on the device: buckets,
              sampler, dataset, buffers, loader, slots, stream, prefetch, raw, features,
              onthefly, ring; ``protocol`` is the trainer's view of either path
"""
