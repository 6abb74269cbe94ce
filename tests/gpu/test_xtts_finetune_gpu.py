"""XTTS-v2 fine-tuning's step on a real CUDA device (``pytest -m gpu``; skipped without one):
the graphed and the compiled-and-graphed step against the eager one over several steps of
batches with padding in every part (text, codes, voice segment), and no host sync in the
eager or the graphed step (bf16, a moving average kept). The reduced GPT (2 layers x 256) is
built directly: no folder, no tokenizer."""

from __future__ import annotations

import pytest
import torch

from myxtts.cli.common import config_file
from myxtts.config import load_config
from myxtts.data.batch import BatchShape
from myxtts.model.xtts_v2.config import XttsV2Args, XttsV2Config
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.trainee import XttsGptTrainee
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.graphs import CudaCapture
from myxtts.train.xtts.task import XttsTask
from tests.gpu.replay import assert_steps_never_sync, step_side_by_side

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda", 0)
N_TEXT, N_CODES, STRIDE = 300, 1026, 1024
SEGMENT = 33075  # the voice segment's samples (1.5 s at 22050 Hz)
SHAPES = [BatchShape(3, 24, 40, SEGMENT, 80), BatchShape(2, 40, 72, SEGMENT, 80)]
LOSSES = ("loss", "text_ce", "code_ce")


def _engines(tmp_path, n: int, *overrides: str, compiled: bool = False) -> list[TrainEngine]:
    cfg = load_config(config_file("xtts-finetune"), None, [
        f"train.output_dir={tmp_path / 'run'}", "train.device=cuda", "train.precision=fp32",
        "train.lr=1e-4", *overrides])
    config = XttsV2Config(args=XttsV2Args(gpt_layers=2, gpt_n_model_channels=256, gpt_n_heads=4,
                                          decoder_input_dim=256),
                          number_text_tokens=N_TEXT, start_text_token=N_TEXT - 2,
                          stop_text_token=0)
    out = []
    for _ in range(n):
        torch.manual_seed(0)
        model = XttsGptTrainee(XttsGpt(config, dropout=0.0), torch.full((80,), 2.5)).to(CUDA)
        out.append(TrainEngine(cfg, model, CUDA, DistInfo(), compile_model=compiled,
                               task=XttsTask(N_TEXT, N_CODES, STRIDE)))
    return out


def _batch(i: int) -> dict[str, torch.Tensor]:
    """A batch of ``SHAPES[i % 2]`` as the loader pads one: the first row fills the shape,
    the others are shorter in text, codes and voice segment."""
    s = SHAPES[i % 2]
    g = torch.Generator().manual_seed(i)
    b, cols = s.batch, torch.arange(max(s.text, s.frames))
    text_lengths = torch.randint(s.text // 2, s.text + 1, (b,), generator=g)
    code_lengths = torch.randint((s.frames - 3) // 2, s.frames - 2, (b,), generator=g)
    segments = torch.randint(SEGMENT // 2, SEGMENT + 1, (b,), generator=g)
    text_lengths[0], code_lengths[0], segments[0] = s.text, s.frames - 3, SEGMENT
    text = torch.randint(4, N_TEXT - 2, (b, s.text), generator=g)
    text = text * (cols[None, :s.text] < text_lengths[:, None])
    codes = torch.randint(0, 1024, (b, s.frames), generator=g)
    codes = codes * (cols[None, :s.frames] < code_lengths[:, None])
    audio = 0.1 * torch.randn(b, SEGMENT, generator=g)
    audio = audio * (torch.arange(SEGMENT)[None] < segments[:, None])
    batch = {"text": text, "text_lengths": text_lengths, "codes": codes,
             "code_lengths": code_lengths, "wav_lengths": code_lengths * STRIDE - 300,
             "cond_audio": audio, "cond_lengths": segments,
             "cond_idxs": torch.stack([torch.zeros_like(segments), segments], dim=1),
             "indices": torch.arange(b)}
    return {k: v.to(CUDA) for k, v in batch.items()}


def _close(a: TrainEngine, b: TrainEngine, rtol: float, atol: float) -> None:
    ra, rb = a.read(), b.read()
    for k in LOSSES:
        assert rb[k] == pytest.approx(ra[k], rel=rtol, abs=atol), k
    for (name, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        torch.testing.assert_close(pb, pa, rtol=rtol, atol=atol, msg=f"{name} differs")


def test_graphed_step_equals_eager_over_several_steps(tmp_path):
    eager, graphed = _engines(tmp_path, 2)
    report = graphed.warm_up(SHAPES, graphed.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and report.shapes_captured == len(SHAPES)
    step_side_by_side(eager, graphed, (_batch(i) for i in range(6)))
    _close(eager, graphed, rtol=1e-4, atol=1e-5)


def test_compiled_and_graphed_step_equals_eager(tmp_path):
    """Fine-tuning's mode on a GPU: compiled GPT blocks inside each shape's captured graph."""
    (eager,) = _engines(tmp_path, 1)
    (engine,) = _engines(tmp_path, 1, compiled=True)
    report = engine.warm_up(SHAPES, engine.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and report.shapes_captured == len(SHAPES)
    assert engine.mode == "graphed" and engine.compiled
    step_side_by_side(eager, engine, (_batch(i) for i in range(6)))
    _close(eager, engine, rtol=2e-3, atol=2e-4)  # fused kernels reassociate sums


@pytest.mark.parametrize("graphed", [False, True])
def test_the_step_never_syncs_with_the_host(tmp_path, graphed):
    (engine,) = _engines(tmp_path, 1, "train.precision=bf16", "train.ema_decay=0.999")
    batches = [_batch(i) for i in range(4)]  # made (copied to the GPU) before the check
    assert_steps_never_sync(engine, SHAPES, batches, graphed)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in engine.read().items() if k in LOSSES)
