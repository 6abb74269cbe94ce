"""Data: a dataset on disk -> padded batches on the device, and the store in between.

Map (by what each module owns)::

    records.py      Utterance, Problem, DataReport, DatasetError; the rejection reasons
    readers/        one module per dataset layout (ljspeech, manifest, speakers) + detection
    inspect.py      `myxtts inspect-data`: headers, durations, problems
    plan.py         texts cleaned and tokenized, reference choice, mel statistics' floor
    chunks.py       prepare's unit of work: chunk planning, extraction workers, chunk files
    prepare.py      `myxtts prepare`: plan -> chunks -> store, resumable
    store/          the feature store: format, writer, reader (FeatureStore), verify
    batch.py        the batch contract: fields (and the on-the-fly wav batch's), shapes, dtypes,
                    padding, stop targets
    buckets.py      bucket edges (exact DP) and the shape each bucket pads to
    sampler.py      BucketBatchSampler: epochs, ranks, exact resume
    dataset.py      StoreDataset: utterance index -> item (memmap slices, reference crop)
    collate.py      Collator: items -> one padded Batch
    loader.py       build_loader: store -> batches (workers, shared-memory slots, pinning)
    onthefly.py     the same batches from raw audio, features on data.data_device
    features.py     Featurizer: a padded wav batch -> log-mels (loader workers or a data GPU)
    feed.py         DeviceFeed: the trainer's view of either path (device batch, real frames)
    ring.py         SlotRing: the data role's batches handed to the training device in slots
    prefetch.py     DevicePrefetcher: batches copied to the GPU on a side stream (PrefetchFeed)
"""
