#!/usr/bin/env bash
# The audio packages coqui-tts (the test oracle of the XTTS-v2 family) imports at start-up,
# in their pure-Python mode: PyPI has no torchaudio built for every torch, so the wheels are
# taken without their dependencies and their compiled extensions removed; the oracle is only
# ever given tensors (no torchaudio.load), which pure Python serves.
set -euo pipefail
python -m pip install -q --no-deps "torchaudio==2.11.0" "torchcodec==0.17.0"
# found without importing torchaudio, which fails while its extensions are there
site=$(python -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torchaudio').origin))")
rm -f "$site"/lib/*.so
python -c "import TTS.tts.models.xtts" 2>/dev/null && echo "coqui-tts oracle: importable" \
  || echo "coqui-tts oracle: not importable (its tests will be skipped)"
