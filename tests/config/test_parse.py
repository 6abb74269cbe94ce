"""Config parsing: YAML round trip, presets, overrides, and errors that name the key."""


import pytest
import yaml

from myxtts.cli.main import main
from myxtts.config import (
    MODEL_PRESETS,
    RENAMED_KEYS,
    Config,
    ConfigError,
    config_from_dict,
    load_config,
    save_config,
    to_yaml,
)
from tests.helpers import REPO


@pytest.mark.parametrize("preset", ["tiny", "small", "base"])
def test_yaml_round_trip_every_preset(preset, tmp_path):
    cfg = load_config(preset=preset, overrides=["train.lr=3e-4", "data.data_device=cuda:1"])
    assert cfg.model.d_model == MODEL_PRESETS[preset]["d_model"]
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.data.data_device == "cuda:1"
    path = tmp_path / "c.yaml"
    save_config(cfg, path)
    assert load_config(path) == cfg


def test_yaml_is_commented_and_complete():
    text = to_yaml(Config())
    data = yaml.safe_load(text)
    assert set(data) == {"audio", "text", "data", "model", "train", "vocoder", "xtts"}
    # every key line carries a comment explaining it
    key_lines = [ln for ln in text.splitlines() if ln.startswith("  ")]
    assert key_lines and all("  # " in ln for ln in key_lines)
    assert config_from_dict(data) == Config()


def test_explicit_model_key_overrides_preset():
    cfg = config_from_dict({"model": {"preset": "small", "decoder_layers": 2}})
    assert cfg.model.decoder_layers == 2
    assert cfg.model.d_model == MODEL_PRESETS["small"]["d_model"]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.max_step=1", "did you mean 'train.max_steps'"),
        ("trian.max_steps=1", "did you mean 'train'"),
        ("audio.hop_length=2048", "audio.hop_length"),
        ("audio.fmax=20000", "audio.fmax"),
        ("data.batch_frames=-5", "data.batch_frames must be > 0"),
        ("model.d_model=-1", "model.d_model"),
        ("train.lr=fast", "train.lr: expected a number"),
        ("train.max_steps=1.5", "train.max_steps: expected an integer"),
        ("train.compile=maybe", "train.compile: 'maybe' is not one of"),
        ("model.preset=tinyy", "did you mean 'tiny'"),
        ("model.n_heads=3", "divisible"),
        ("text.default_language=fa", "text.default_language"),
        ("max_steps=3", "section.key"),
    ],
)
def test_bad_values_name_the_key(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[override])
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_yaml_file_names_key(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("data:\n  batch_frame: 100\n")
    with pytest.raises(ConfigError, match=r"data\.batch_frame.*did you mean 'data\.batch_frames'"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_cli_config_show_loads_back(capsys, tmp_path):
    assert main(["config", "show", "--preset", "small", "--max-steps", "7", "--batch-size", "3"]) == 0
    out = capsys.readouterr().out
    p = tmp_path / "shown.yaml"
    p.write_text(out)
    cfg = load_config(p)
    assert cfg.model.preset == "small" and cfg.train.max_steps == 7 and cfg.data.max_batch_size == 3


def test_cli_bad_override_is_one_line_error(capsys):
    assert main(["config", "show", "--set", "train.max_step=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "train.max_steps" in err


def test_shipped_yaml_files_load():
    files = sorted((REPO / "configs").glob("*.yaml"))
    assert files, "configs/ should ship example YAML files"
    for f in files:
        load_config(f)


@pytest.mark.parametrize("value", ["on", "off", "auto"])
def test_compile_on_off_survive_yaml_booleans(value, tmp_path):
    assert load_config(overrides=[f"train.compile={value}"]).train.compile == value
    p = tmp_path / "c.yaml"
    p.write_text(f"train:\n  compile: {value}\n")
    assert load_config(p).train.compile == value


def test_train_cli_compile_flags_reach_the_config():
    import argparse

    from myxtts.cli import train as train_cmd
    from myxtts.cli.common import config_from_args

    parser = argparse.ArgumentParser()
    train_cmd.register(parser.add_subparsers())
    for flag, expected in (("--compile", "on"), ("--no-compile", "off")):
        args = parser.parse_args(["train", "STORE", flag])
        cfg = config_from_args(args, base_overrides=[f"train.compile={args.compile}"])
        assert cfg.train.compile == expected


@pytest.mark.parametrize("old, new", sorted(RENAMED_KEYS.items()))
def test_a_renamed_key_is_refused_naming_the_new_one(old, new, tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[f"{old}=0.5"])
    assert str(e.value) == f"config key '{old}' is renamed '{new}'; write {new} instead"
    section, key = old.split(".")
    p = tmp_path / "old.yaml"
    p.write_text(f"{section}:\n  {key}: 0.5\n")
    with pytest.raises(ConfigError, match=rf"^{p}: config key '{old}' is renamed '{new}'"):
        load_config(p)
    assert main(["config", "show", "--set", f"{old}=0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and old in err and new in err
    assert load_config(overrides=[f"{new}=0.5"]).to_dict()[section][new.split(".")[1]] == 0.5


def test_a_stored_config_with_a_renamed_key_reads_under_the_new_name():
    stored = Config().to_dict()
    del stored["train"]["device_memory_cap"]
    stored["train"]["memory_fraction"] = 0.5
    assert config_from_dict(stored).train.device_memory_cap == 0.5
    stored["train"]["device_memory_cap"] = 0.5
    with pytest.raises(ConfigError, match="both 'train.memory_fraction' and its present name"):
        config_from_dict(stored)


def test_settings_that_come_with_the_data_fill_what_the_command_leaves_unset():
    from myxtts.config import ConfigError, load_config

    store = ("the store S", {"text": {"languages": ["en", "fa"], "default_language": "en"},
                             "audio": {"sample_rate": 16000}})
    cfg = load_config(inherit=store)
    assert cfg.text.languages == ["en", "fa"] and cfg.audio.sample_rate == 16000
    same = load_config(overrides=["audio.sample_rate=16000", "train.lr=3e-4"], inherit=store)
    assert same.audio.sample_rate == 16000 and same.train.lr == 3e-4  # agreeing is fine
    with pytest.raises(ConfigError, match=r"^audio.sample_rate: the store S has 16000, this "
                                          r"command sets 22050; drop the setting"):
        load_config(overrides=["audio.sample_rate=22050"], inherit=store)
    run = ("the run R", {"model": {"preset": "small"}})
    assert load_config(inherit=run).model.preset == "small"
    with pytest.raises(ConfigError, match="model.preset: the run R has 'small', this command "
                                          "asks for 'tiny'"):
        load_config(preset="tiny", inherit=run)
