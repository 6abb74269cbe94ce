"""The feed: batches from a store or from raw audio to the training device.

From a store: ``buckets`` (the batch plan, made from the lengths before any loader),
``sampler`` (``(epoch, indices)``: few padded shapes, exact resume), ``dataset`` (the padded
batch, straight from the memory map), ``buffers`` (the host arrays it is built in), ``loader``
(workers), ``slots`` (how a worker's batch reaches the training process), ``stream`` (one
stream of batches across epochs for workers) and ``prefetch`` (counted, copied to the GPU on a
side stream, cast). From raw audio: ``raw`` (clips -> padded wav batches), ``features`` (the
log-mels, on ``data.data_device``), ``onthefly`` (the loader) and ``ring`` (the data role's
slots). ``protocol`` holds what the trainer sees of either path: ``TrainLoader`` and its
``DeviceFeed``.
"""
