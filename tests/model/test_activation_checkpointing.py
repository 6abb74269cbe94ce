"""Activation checkpointing (``XTTS.set_activation_checkpointing``): the same loss and the
same gradients, bit for bit, with fewer bytes kept for the backward pass -- and nothing
changes outside training passes (evaluation, no-grad, generation).

Eager gradients are compared with ``torch.equal``, not a tolerance: a checkpointed block's
backward runs the same autograd graph on recomputed tensors, and on the CPU with one thread
the recomputation runs the same kernels on the same inputs with the random state restored,
so every saved tensor comes back bit for bit. Any difference -- a dropout mask drawn anew, a
block recomputed in eval mode -- is a bug, and a tolerance could hide a small one. The
compiled and the graph-replayed steps are compared under tolerances, each saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
from torch import Tensor

import myxtts.model.layers as layers
from myxtts.config import config_from_dict
from myxtts.model.dummy import random_batch, randomize_weights
from myxtts.model.losses import compute_losses
from myxtts.model.xtts import XTTS, build_model
from myxtts.observe.meters import SavedBytes
from myxtts.train.engine.compile import compile_blocks, compiled_graphs
from myxtts.train.engine.task import TTSTask

N_MELS, N_TOKENS = 16, 40
NEVER = 1.0  # a stop threshold no probability exceeds

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = config_from_dict({
    "audio": {"n_mels": N_MELS}, "text": {"languages": ["en", "fa"]},
    # dropout everywhere it exists: a recomputation that drew new masks would show
    "model": dict(d_model=32, n_heads=2, text_layers=1, decoder_layers=2, cond_layers=1,
                  cond_latents=4, prenet_dim=32, postnet_channels=16, postnet_layers=3,
                  frames_per_step=2, max_decoder_frames=40, dropout=0.2, frame_dropout=0.2),
})
# 1 text + 1 reference encoder layer, 2 resampler layers, 2 decoder layers
N_BLOCKS = 6
BATCH = random_batch(N_MELS, N_TOKENS, [5, 9, 7], [11, 23, 17], [6, 12, 10], n_languages=2)


def make_model(checkpointing: bool) -> XTTS:
    """The same weights every call (unit gain, so every path matters), in train mode."""
    model = build_model(CFG, N_TOKENS, 2, torch.linspace(-6, -2, N_MELS),
                        torch.linspace(1.0, 2.0, N_MELS))
    randomize_weights(model, seed=0).train()
    model.set_activation_checkpointing(checkpointing)
    return model


def train_pass(model: XTTS, seed: int = 0, self_feed: bool = True
               ) -> tuple[Tensor, dict[str, Tensor], int]:
    """Seeded forward (with ``self_feed``, also a no-grad decoder pass in train mode) + loss
    + backward -> (loss, gradients by name, bytes saved for the backward)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with SavedBytes(model) as saved:
        out = model(BATCH, self_feed=torch.tensor(0.5) if self_feed else None)
        loss = compute_losses(out, BATCH, CFG.train)["loss"]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, saved.nbytes


def count_checkpoints() -> Any:
    """Counts the blocks that go through ``torch.utils.checkpoint`` (and still runs it)."""
    return mock.patch.object(layers, "checkpoint", wraps=layers.checkpoint)


def test_every_transformer_block_is_switched():
    model = make_model(True)
    blocks = [m for m in model.modules() if isinstance(m, TTSTask.block_types)]
    assert len(blocks) == N_BLOCKS
    assert all(b.activation_checkpointing for b in blocks)
    model.set_activation_checkpointing(False)
    assert not any(b.activation_checkpointing for b in blocks)


def test_same_loss_and_gradients_with_fewer_saved_bytes():
    loss0, grads0, saved0 = train_pass(make_model(False))
    with count_checkpoints() as ck:
        loss1, grads1, saved1 = train_pass(make_model(True))
    # every block of the gradient pass, none of the no-grad self-feed pass
    assert ck.call_count == N_BLOCKS
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys() == {n for n, _ in make_model(False).named_parameters()}
    different = [n for n in grads0 if not torch.equal(grads0[n], grads1[n])]
    assert not different, f"gradients differ: {different}"
    # measured 0.26 with this model: the blocks keep their inputs only
    assert saved1 < 0.5 * saved0, (saved0, saved1)


def test_the_flag_can_be_turned_off_again():
    model = make_model(True)
    _, _, on = train_pass(model)
    model.set_activation_checkpointing(False)
    with count_checkpoints() as ck:
        _, _, off = train_pass(model)
    assert ck.call_count == 0 and off > 2 * on


def test_eval_and_no_grad_passes_are_untouched():
    plain, ckpt = make_model(False), make_model(True)
    with count_checkpoints() as ck:
        for model in (plain, ckpt):
            model.eval()  # gradients on, eval mode: no checkpointing, same bytes saved
        eval_runs = [train_pass(m) for m in (plain, ckpt)]
        for model in (plain, ckpt):
            model.train()  # train mode, no gradients (the self-feed pass, validation-like)
        with torch.no_grad():
            no_grad_outs = []
            for model in (plain, ckpt):
                torch.manual_seed(1)
                no_grad_outs.append(model(BATCH)["mel_post"])
    assert ck.call_count == 0
    (loss0, grads0, saved0), (loss1, grads1, saved1) = eval_runs
    assert torch.equal(loss0, loss1) and saved0 == saved1
    assert all(torch.equal(grads0[n], grads1[n]) for n in grads0)
    assert torch.equal(*no_grad_outs)


def test_generation_is_identical_with_the_flag_on():
    """``generate`` (KV-cache decoding under inference mode) from a model left in train
    mode, prenet dropout on (the default) with the same seed: the same frames."""
    inputs = (BATCH["tokens"], BATCH["token_lengths"], BATCH["language_ids"], BATCH["ref_mel"],
              BATCH["ref_lengths"])
    outs = []
    with count_checkpoints() as ck:
        for flag in (False, True):
            model = make_model(flag)
            torch.manual_seed(2)
            outs.append(model.generate(*inputs, max_frames=12, stop_threshold=NEVER))
            assert model.training  # generate restored it
    assert ck.call_count == 0
    (mel0, len0), (mel1, len1) = outs
    assert torch.equal(mel0, mel1) and torch.equal(len0, len1)


@pytest.mark.slow
def test_compiled_blocks_checkpoint_too():
    """The trainer's regional compile (``train.compile``: ``compile_blocks``) traces the
    checkpoint into a block's graph, and the backward graph recomputes the block with the
    forward's dropout masks. Only the decoder layers are compiled here (the richest block:
    two attentions, two outputs; each block type costs seconds of tracing on the CPU), with
    ``aot_eager``: the forward and backward graphs as inductor gets them (partitioned, the
    checkpointed region recomputed in the backward graph), without generating code.

    Compared with the eager model without checkpointing under a tolerance: the compiled
    graph runs aten decompositions (GELU, dropout, attention) whose rounding differs from
    the eager kernels by ~1e-7 relative (measured 3e-8 absolute); a recomputed dropout mask
    that differed would move gradients by their own size."""
    graphs: list[str] = []

    def recording_aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm.code)  # dynamo's graph, before AOTAutograd
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    loss0, grads0, saved0 = train_pass(make_model(False), self_feed=False)
    torch._dynamo.reset()
    try:
        model = make_model(False)
        compile_blocks(model.decoder, TTSTask.block_types, backend=recording_aot_eager)
        _, _, saved_compiled = train_pass(model, self_feed=False)
        model.set_activation_checkpointing(True)  # after compiling: the flag is a guard
        before = compiled_graphs()
        loss1, grads1, saved1 = train_pass(model, self_feed=False)
        recompiled = compiled_graphs() - before
    finally:
        torch._dynamo.reset()
    # one new graph, holding the checkpointed region (no graph break around it)
    assert recompiled == 1 and "tag_activation_checkpoint" in graphs[-1]
    torch.testing.assert_close(loss1, loss0, rtol=1e-6, atol=0.0)
    for name, grad in grads0.items():
        torch.testing.assert_close(grads1[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    # measured, in eager bytes: compiled decoder 0.90, and checkpointing everywhere 0.33
    assert saved1 < 0.6 * saved_compiled, (saved0, saved_compiled, saved1)


def test_graphed_step_with_checkpointing_equals_the_plain_eager_step(tmp_path):
    """The training step captured the way a CUDA graph captures it (``RecordingCapture``:
    no host reads allowed, fixed addresses, Python not run at replay), recomputation in the
    backward included, replays to the same losses and weights as the eager step without
    checkpointing. Dropout off: a replay draws new random numbers, as a CUDA graph does."""
    from myxtts.data.batch import BatchShape
    from myxtts.model.dummy import worst_case_batch
    from myxtts.train.distributed import DistInfo
    from myxtts.train.engine import TrainEngine
    from tests.helpers import micro_config
    from tests.train.graph_recorder import RecordingCapture

    common = (f"audio.n_mels={N_MELS}", "model.dropout=0", "model.prenet_dropout=0",
              "train.warmup_steps=4")
    shapes = [BatchShape(3, 16, 24, 12, N_MELS), BatchShape(2, 16, 48, 12, N_MELS)]
    engines = []
    for checkpointing in (False, True):
        cfg = micro_config(tmp_path, *common, f"train.activation_checkpointing={checkpointing}")
        torch.manual_seed(0)
        engines.append(TrainEngine(cfg, build_model(cfg, N_TOKENS, 1, None, None),
                                   torch.device("cpu"), DistInfo(), compile_model=False))
    eager, graphed = engines
    with count_checkpoints() as ck:
        report = graphed.warm_up(shapes, graphed.task.worst_case, capture=RecordingCapture(),
                                 echo=lambda s: None)
        assert report.shapes_captured == 2 and report.capture_error is None
        captured = ck.call_count
        for i in range(4):
            batch = [worst_case_batch(shapes[i % 2], N_TOKENS, 1, "cpu")]
            assert graphed._graphs.ready(batch)
            eager.step(batch)
            graphed.step(batch)
    assert captured > 0 and ck.call_count == captured  # replays run no Python
    # tolerances of tests/train/test_graphs.py: the replayed AdamW reads its lr from a
    # float32 tensor, the eager one a double (an ulp apart after step 1)
    a, b = eager.read(), graphed.read()
    for k in a:
        assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k
    for (name, p), q in zip(eager.model.state_dict().items(), graphed.model.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=5e-5, msg=f"{name} differs")
