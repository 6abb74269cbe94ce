"""Evaluation: a trained model scored with the speech metrics, offline or during training.

An application layer above ``inference`` and ``train`` (it runs the synthesizer and the
trainer's sampling) and below the command line:

    harness   myxtts evaluate: the model, its vocoded truth and the truth, scored per
              utterance of a dataset's or store's held-out split
    speaking  what the harness needs of a model (``SpeakingModel``), whatever its family,
              and the one function that opens a model path as one
    mel_speaking  the family of ``myxtts train`` (mel model + vocoder) as a SpeakingModel
    report    what myxtts evaluate shows and writes (table, JSON, per-utterance CSV)
    training  the evaluation every ``train.eval_every`` steps, handed to the training loop
              from above (``train.hooks``)
    xtts_training  the same for an XTTS-v2 fine-tuning run (greedy decoding, its HiFi-GAN,
              against the true clip)
    record    a run's last evaluation in training (``RUN/evaluation.json``)

The metrics themselves are ``myxtts.metrics``, a leaf that knows nothing of models.
"""
