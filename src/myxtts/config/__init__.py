"""Typed configuration: dataclasses that map 1:1 to YAML sections.

Why dataclasses and not free dicts: every knob has one default and one comment,
a misspelt key fails loudly (naming the closest valid key) instead of being
silently ignored, and the resolved config saved next to a checkpoint is exactly
what the run used.

Sections: ``audio`` (the one feature definition), ``text``, ``data``, ``model``
(architecture, filled from a size preset), ``train``, ``vocoder``, ``xtts`` (fine-tuning
XTTS-v2). ``sections`` defines them,
``parse`` reads and writes them (YAML, presets, overrides), ``checks`` refuses
impossible values and resolves devices. Import everything from here.
"""

from myxtts.config.checks import check_config, resolve_device
from myxtts.config.parse import (
    RENAMED_KEYS,
    apply_override,
    config_from_dict,
    load_config,
    save_config,
    to_yaml,
)
from myxtts.config.sections import (
    GUIDED_SIGMA_RANGE,
    MODEL_PRESETS,
    SECTIONS,
    VOCODER_PRESETS,
    AudioConfig,
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    TextConfig,
    TrainConfig,
    VocoderConfig,
    XttsConfig,
)

__all__ = [
    "GUIDED_SIGMA_RANGE", "MODEL_PRESETS", "RENAMED_KEYS", "SECTIONS", "AudioConfig", "Config", "ConfigError",
    "DataConfig", "ModelConfig", "TextConfig", "TrainConfig", "VOCODER_PRESETS", "VocoderConfig", "XttsConfig",
    "apply_override",
    "check_config", "config_from_dict", "load_config", "resolve_device", "save_config", "to_yaml",
]
