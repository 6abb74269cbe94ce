"""Fine-tuning Coqui's XTTS-v2 GPT on a store of ``myxtts prepare --xtts``.

    prepare   the store: XTTS text tokens, DVAE codes and 22.05 kHz audio, in parallel
    base      the model a run trains (from the XTTS-v2 folder, grown; from a checkpoint)
    batches   bucketed batches of the store, the voice segment cut anew every epoch
    task      the GPT as the training engine's step (losses, worst-case batch, blocks)
    flops     a micro-batch's model FLOPs, counted on the meta device (profile's MFU)
    recipe    the run: setup, the loop's events, checkpoints
"""
