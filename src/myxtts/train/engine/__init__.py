"""The training engine: the step and everything it updates, owned by one object.

    engine.py    TrainEngine: prepare, step, read, state_dict / load_state_dict, evaluating
    prepare.py   before step 1: room beside the graphs, auto batch sizes, warm-up, shrink
    step.py      TrainStep: one optimizer step's device work, no host sync, graph-safe
    mode.py      precision, compiled blocks and CUDA graphs decided once (StepPlan)
    budget.py    data.batch_frames=auto: the largest batch per bucket that fits
    warmup.py    every bucket shape before step 1: compile, capture, prove it fits
    graphs.py    CUDA graphs of the step: capture and replay
    snapshot.py  the training state saved on the host and put back in place
    compile.py   regional torch.compile of the transformer blocks
    optim.py     AdamW and the warm-up + cosine schedule
    ema.py       the weights' moving average, updated inside the step

Code outside the engine imports this package's names below, never its modules.
"""

from myxtts.train.engine.compile import compiled_graphs, reset_compiled
from myxtts.train.engine.engine import TrainEngine
from myxtts.train.engine.mode import StepMode, native_bf16, resolve_compile, resolve_precision
from myxtts.train.engine.optim import lr_factor
from myxtts.train.engine.prepare import Prepared, Workload

__all__ = ["Prepared", "StepMode", "TrainEngine", "Workload", "compiled_graphs", "lr_factor",
           "native_bf16", "reset_compiled", "resolve_compile", "resolve_precision"]
