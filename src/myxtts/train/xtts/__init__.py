"""Fine-tuning XTTS-v2's GPT on the project's pipeline.

Map::

    prepare.py     prepare_xtts: the XTTS store (data.xtts_store) of a dataset, with the
                   model's DVAE as the codec its workers build (dvae_codec)
"""
