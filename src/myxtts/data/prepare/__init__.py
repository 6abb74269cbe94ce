"""Preparing a store: a dataset folder in one of the known layouts -> ``data.store``.

``readers/`` read each layout into ``records.Utterance`` rows and a problem report;
``plan`` cleans and tokenizes the texts and splits train/val; ``chunks`` extracts the
features of a chunk of utterances in a worker process; ``build`` runs it all (resumable,
locked) and writes the store; ``report`` summarises what was kept and dropped; ``inspect``
reports on a dataset before anything is written.
"""
