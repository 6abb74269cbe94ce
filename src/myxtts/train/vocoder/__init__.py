"""``myxtts train-vocoder``: GAN training of the neural vocoder (``model.vocoder``).

Map::

    setup.py       build_vocoder_setup: store, generator, discriminators, step, resume
    loop.py        train_vocoder: step / log / validate / samples / checkpoint
    step.py        VocoderStep: discriminators, then generator, no host sync
    data.py        SegmentBatches: fixed-length (mel, waveform) segments, batch k from (seed, k)
    eval.py        re-synthesis quality of whole utterances (against Griffin-Lim's)
    checkpoint.py  vocoder checkpoints and loading a generator for synthesis
    finetune.py    teacher-forced mels of a TTS model to fine-tune on
"""
