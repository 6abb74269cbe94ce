"""Console progress bar: step, loss, utterances/s, audio-seconds/s, data-wait %, the batches
the device feed had ready (on the fly: filled slots; a store on a GPU: finished copies), and
on a GPU its NVML utilisation and the run's MFU.

Updated only at log intervals (the values come from the one sync per interval), so
drawing it costs nothing on the hot path. Falls back to plain log lines when stdout
is not a terminal (CI logs, nohup), so the numbers are never lost.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True, unit: str = "utt"):
        self.enabled, self.unit = enabled, unit
        self.tty = sys.stderr.isatty()
        self._bar = (tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                          smoothing=0.1, file=sys.stderr)
                     if enabled and self.tty else None)
        self.total = total
        self._last = initial

    def format(self, values: dict[str, float]) -> str:
        """``unit``: what utterances_per_s counts (utterances; segments for the vocoder)."""
        text = (f"loss {values.get('loss', float('nan')):.4f} | "
                f"{values.get('utterances_per_s', 0):.1f} {self.unit}/s | "
                f"{values.get('audio_s_per_s', 0):.1f} audio-s/s | "
                f"data-wait {100 * values.get('data_wait_share', 0):.1f}%")
        if "data_ready_slots" in values:  # batches the device feed had ready
            text += f" | ready {values['data_ready_slots']:.1f}"
        if "uncaptured_steps" in values:  # graphed runs: steps that found no graph (0 is healthy)
            text += f" | uncaptured {values['uncaptured_steps']:.0f}"
        if "gpu_util" in values:
            text += f" | GPU {values['gpu_util']:.0f}%"
        if "mfu" in values:
            text += f" | MFU {100 * values['mfu']:.1f}%"
        return text

    def update_to(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        text = self.format(values)
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(step - self._last)
        else:
            print(f"step {step}/{self.total} | {text}", file=sys.stderr, flush=True)
        self._last = step

    def note(self, message: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
