"""What a run writes and its readers load back: below ``train`` (which writes) and
``inference`` / ``diagnose`` (which read), so neither reader depends on the trainer.

    checkpoint  the checkpoint format: keys, the progress record, random streams, atomic
                save with a checksum inside, safe load (``weights_only``)
    runs        a run folder's checkpoints: retention, latest/best pointers, auto-resume
    averaged    the moving average of the weights as readers use it
    vocoder     vocoder checkpoints, their mel definition (hash) and loading a generator
    bundle      the portable model of ``myxtts export`` (safetensors, checksummed)
    trained     a trained TTS model from a run folder, a checkpoint or a bundle
    readback    every field of a file read back, checked before use; what a file is
    errors      ArtifactError: a file that cannot be used, named with the fix
    xtts_v2     coqui's downloaded XTTS-v2 folder: read safely, checked, written back out
"""
