"""``myxtts train-vocoder``: GAN training of the neural vocoder (``model.vocoder``), with the
same roles and names as the TTS trainer.

Map::

    recipe.py      VocoderRecipe, train_vocoder: the run (train.recipe's lifecycle and loop)
                   and its events: log / validate / samples / checkpoint
    setup.py       build_vocoder_setup: store and engine (for the checkpoint resumed)
    engine.py      VocoderEngine: generator, discriminators, optimizers; one GAN step, no sync
    data.py        SegmentBatches and their DeviceFeed: fixed-length (mel, waveform)
                   segments, batch k from (seed, k)
    eval.py        re-synthesis quality of whole utterances (against Griffin-Lim's)
    finetune.py    teacher-forced mels of a TTS model to fine-tune on

Vocoder checkpoints and loading a generator for synthesis are ``artifacts.vocoder``'s.
"""
