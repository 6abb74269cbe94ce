"""Config sections: defaults equal the tiny preset; the feature hash covers features only."""

import dataclasses

import pytest

from myxtts.config import MODEL_PRESETS, SECTIONS, Config, ModelConfig, load_config


def test_model_defaults_are_the_tiny_preset():
    """Config() builds the model the CLI builds by default (--preset tiny)."""
    assert Config().model == load_config(preset="tiny").model == load_config().model
    defaults = ModelConfig()
    for key, value in MODEL_PRESETS["tiny"].items():
        assert getattr(defaults, key) == value, key


@pytest.mark.parametrize("name", list(SECTIONS))
def test_every_field_has_a_help_line(name):
    for f in dataclasses.fields(SECTIONS[name]):
        assert f.metadata.get("help"), f"{name}.{f.name} has no help text"


def test_feature_hash_tracks_audio_and_text_only():
    a = Config()
    assert a.feature_hash() == load_config(overrides=["train.lr=0.5"]).feature_hash()
    assert a.feature_hash() != load_config(overrides=["audio.n_mels=64"]).feature_hash()
    assert a.feature_hash() != load_config(overrides=["text.lowercase=false"]).feature_hash()
