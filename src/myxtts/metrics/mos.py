"""Predicted quality: DNSMOS P.835 (Reddy et al., 2022), no listener needed.

Three scores from 1 (bad) to 5 (excellent), as a P.835 listening test would give them:
SIG (the speech itself: distortion, buzz), BAK (the background: noise) and OVRL (overall),
predicted by Microsoft's ONNX models from the ``speechmos`` wheel, run by ``onnxruntime``
on 16 kHz audio in 9 s windows (a shorter clip is repeated to fill one), through
speechmos's own scoring code. Read against the ground-truth row: clean read speech such as
LJSpeech predicts OVRL 3.4-3.5 (measured on its clips).

The ONNX models are loaded here rather than by ``speechmos.dnsmos.run``: onnxruntime's default
threads keep spinning after each run, burning the cores the speaker encoder and the
synthesis need next; these use torch's thread count and sleep when idle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soxr
import torch

from myxtts.metrics import require

MOS_RATE = 16000


@dataclass
class MOSScores:
    sig: float
    bak: float
    ovrl: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class DNSMOS:
    """``score(wav, sample_rate) -> MOSScores``."""

    def __init__(self) -> None:
        require("speechmos", "onnxruntime", "librosa", what="DNSMOS")
        # optional: the eval extra (speechmos imports librosa)
        import onnxruntime as ort
        from speechmos import dnsmos

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        models = Path(dnsmos.__file__).parent / "dnsmos_models"

        class Model(dnsmos.DNSMOS):  # speechmos's scoring, with the models loaded above
            def __init__(self) -> None:
                self.primary_model_path = str(models / "sig_bak_ovr.onnx")
                self.onnx_sess, self.p808_onnx_sess = (
                    ort.InferenceSession(str(models / name), options,
                                         providers=["CPUExecutionProvider"])
                    for name in ("sig_bak_ovr.onnx", "model_v8.onnx"))

        self.model = Model()

    def score(self, wav: np.ndarray, sample_rate: int) -> MOSScores:
        wav = np.asarray(wav, dtype=np.float32)
        if sample_rate != MOS_RATE:
            wav = soxr.resample(wav, sample_rate, MOS_RATE).astype(np.float32)
        if not wav.size:
            wav = np.zeros(MOS_RATE // 10, np.float32)
        out = self.model(np.clip(wav, -1.0, 1.0), MOS_RATE, False)  # False: not personalised
        return MOSScores(float(out["sig_mos"]), float(out["bak_mos"]), float(out["ovrl_mos"]))
