"""Regional ``torch.compile``: each transformer block (a task's ``block_types``) compiled
once per block type, not the whole model once per bucket shape.

Why: compiling the whole training step costs ~74 s per bucket shape cold on an H100
(LJSpeech's 16 shapes: ~20 minutes before the first fast step). With parameters traced as
inputs (``inline_inbuilt_nn_modules``, torch >= 2.5) every instance of a block type reuses
one graph, and ``dynamic=True`` makes batch and time symbolic, so one graph per type serves
every shape (``tests/train/test_compile.py`` counts them). The glue between blocks stays
eager (the CUDA graph of the step hides its launches); eval mode runs blocks eagerly
(:func:`eager_blocks`). Compiled code is cached on disk (:func:`configure_compile_cache`).
A compile failure falls back to eager blocks with one warning (:class:`CompiledBlocks`).
Measured on a 2-core CPU, torch 2.13, tiny preset: three shapes compile in 45 s cold and 9 s
from the cache; a whole-model compile takes 93 s per shape. GPU: ``benchmarks/train_step.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from myxtts.train.errors import error_summary, is_out_of_memory

log = logging.getLogger(__name__)

# Dynamo keeps this many graphs per code object: one per block type, plus the odd
# specialisation (a bucket of batch size 1 is compiled apart) fit well within.
RECOMPILE_LIMIT = 64

T = TypeVar("T")


def compile_cache_dir() -> Path:
    """Where compiled kernels persist: ``$TORCHINDUCTOR_CACHE_DIR`` if the user set it, else
    ``$XDG_CACHE_HOME/myxtts/torch-compile`` (``~/.cache/...``): stable across restarts,
    unlike torch's default under /tmp, which many containers wipe."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "myxtts" / "torch-compile"


def configure_compile_cache() -> Path:
    """Point inductor at :func:`compile_cache_dir` and turn on its persistent caches (FX
    graphs, AOTAutograd); returns the folder. Torch versions without a cache flag skip it."""
    folder = compile_cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:  # deferred: inductor (~0.8 s) reads TORCHINDUCTOR_CACHE_DIR as it loads; optional
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
    except ImportError:  # pragma: no cover - torch without inductor
        return folder
    for module, flag in ((inductor_config, "fx_graph_cache"),
                         (functorch_config, "enable_autograd_cache")):
        if hasattr(module, flag):
            setattr(module, flag, True)
    return folder


def _configure_dynamo() -> None:
    """Process-wide dynamo settings for the blocks: room for their graphs, and no "duck
    shaping" -- by default two axes that happen to have the same size share one symbol, and
    a batch of 2 next to 2 attention heads pinned the decoder's batch axis to 2 (a recompile
    for every other batch size, measured with the tiny preset)."""
    import torch._dynamo as dynamo  # deferred: ~0.8 s to load, paid by compiled runs only

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed in torch 2.6
        if hasattr(dynamo.config, name) and getattr(dynamo.config, name) < RECOMPILE_LIMIT:
            setattr(dynamo.config, name, RECOMPILE_LIMIT)
    try:  # optional: older torch has no such module
        import torch.fx.experimental._config as fx_config
    except ImportError:  # pragma: no cover - older torch
        return
    if hasattr(fx_config, "use_duck_shape"):
        fx_config.use_duck_shape = False


def compile_blocks(model: nn.Module, block_types: tuple[type[nn.Module], ...],
                   backend: Any = None) -> list[nn.Module]:
    """Compile every block of ``model`` that is one of ``block_types`` (the task's: its
    transformer blocks) in place (``nn.Module.compile``: the parameters and the state dict
    keep their names). Returns the compiled blocks, for :func:`uncompile_blocks`.
    ``backend``: torch.compile's (default inductor; tests count graphs with their own)."""
    if backend is None:
        configure_compile_cache()
    _configure_dynamo()
    blocks = [m for m in model.modules() if isinstance(m, block_types)]
    for block in blocks:
        if backend is None:
            block.compile(dynamic=True)
        else:
            block.compile(dynamic=True, backend=backend)
    return blocks


def uncompile_blocks(blocks: list[nn.Module]) -> None:
    """Back to eager for these blocks (after a compile failure)."""
    for block in blocks:
        if getattr(block, "_compiled_call_impl", None) is not None:
            block._compiled_call_impl = None


@contextlib.contextmanager
def eager_blocks(blocks: list[nn.Module]) -> Iterator[None]:
    """Run these compiled blocks eagerly inside the ``with`` (validation, in eval mode)."""
    saved = [getattr(b, "_compiled_call_impl", None) for b in blocks]
    uncompile_blocks(blocks)
    try:
        yield
    finally:
        for block, compiled in zip(blocks, saved):
            block._compiled_call_impl = compiled


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (for warm-up reports and tests)."""
    from torch._dynamo.utils import counters  # deferred: dynamo, ~0.8 s to load

    return int(counters["stats"]["unique_graphs"])


def reset_compiled() -> None:
    """Forget every compiled graph in this process (benchmarks measure cold warm-ups)."""
    torch._dynamo.reset()


class CompiledBlocks:
    """The blocks of the engine's model of ``block_types`` (the task's), compiled in place
    when ``enabled`` (``train.compile`` resolved; ``backend``: torch.compile's, tests count
    graphs with their own), and the way back to eager: for one ``with`` (:meth:`eager`) or
    for the rest of the run after a compile failure (:meth:`fall_back`). A platform without
    torch.compile trains eagerly, said in one warning."""

    def __init__(self, model: nn.Module, block_types: tuple[type[nn.Module], ...],
                 enabled: bool, device: torch.device, backend: Any = None) -> None:
        self.device = device
        self._blocks: list[nn.Module] = []
        if enabled:
            try:
                self._blocks = compile_blocks(model, block_types, backend)
            except Exception as e:  # pragma: no cover - depends on the platform
                log.warning("torch.compile unavailable (%s); training eagerly", error_summary(e))

    @property
    def active(self) -> bool:
        """Blocks run compiled (outside :meth:`eager`)."""
        return bool(self._blocks)

    def eager(self) -> contextlib.AbstractContextManager:
        """Inside the ``with``, the blocks run eagerly: validation and sample synthesis
        (eval mode, other shapes, ``generate``'s one-frame steps) would otherwise compile
        graphs of their own in the middle of the run."""
        return eager_blocks(self._blocks)  # (no blocks: nothing to switch)

    def failed(self, e: Exception) -> bool:
        """``e`` is the compiled blocks' failure, to fall back from: not out of memory (the
        caller's business), not an error inside a CUDA graph capture (the warm-up falls back
        to the uncaptured step for those)."""
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        return self.active and not capturing and not is_out_of_memory(e)

    def guarded(self, fn: Callable[[], T]) -> T:
        """``fn()``; where the compiled blocks fail in it (:meth:`failed`), they fall back to
        eager (:meth:`fall_back`) and ``fn`` runs again."""
        failed = None
        try:
            return fn()
        except Exception as e:
            if not self.failed(e):
                raise
            failed = error_summary(e)  # handled outside: the traceback holds tensors
        self.fall_back(failed)
        return fn()

    def fall_back(self, reason: str) -> None:
        """Back to eager blocks for good, with one warning naming the cause."""
        if self._blocks:
            log.warning("compiled step failed (%s); falling back to eager", reason)
            uncompile_blocks(self._blocks)
            self._blocks = []
