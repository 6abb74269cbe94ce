"""The training engine: the step and everything it updates, owned by one object.

    engine.py    TrainEngine: the step itself, start_up, read, state_dict / load_state_dict,
                 evaluating; it owns everything below
    task.py      StepTask: what the engine needs of a model family (losses, compiled
                 blocks, worst-case batches, names); TTSTask: the TTS model's
    startup.py   before step 1: room beside the graphs, auto batch sizes, warm-up, shrink
    totals.py    the step's device-side accumulators: loss sums, non-finite counts, read-back
    mode.py      precision, compiled blocks and CUDA graphs decided once (StepPlan)
    budget.py    data.batch_frames=auto: the largest batch per bucket that fits
    warmup.py    every bucket shape before step 1: compile, capture, prove it fits
    graphs.py    CUDA graphs of the step: capture and replay
    snapshot.py  trial steps: the training state saved on the host and put back in place
    compile.py   regional torch.compile of the transformer blocks, and the fall-back to eager
    optim.py     AdamW, the warm-up + cosine schedule, the self-feed ramp
    ema.py       the weights' moving average, updated inside the step
    lead.py      how far the host may run ahead of the GPU

Code outside the engine imports this package's names below, never its modules.
"""

from myxtts.train.engine.compile import compiled_graphs, reset_compiled
from myxtts.train.engine.engine import TrainEngine
from myxtts.train.engine.mode import StepMode, native_bf16, resolve_compile, resolve_precision
from myxtts.train.engine.optim import lr_factor
from myxtts.train.engine.startup import Startup, Workload
from myxtts.train.engine.task import StepTask, TTSTask, WorstCase

__all__ = ["StepMode", "StepTask", "Startup", "TTSTask", "TrainEngine", "Workload", "WorstCase",
           "compiled_graphs", "lr_factor", "native_bf16", "reset_compiled", "resolve_compile",
           "resolve_precision"]
