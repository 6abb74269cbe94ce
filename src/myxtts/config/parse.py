"""Config in and out: YAML files, presets and ``section.key=value`` overrides -> a checked
``Config``; a ``Config`` -> commented YAML that loads back to it.

Every value is checked against its field's annotation (int -> float is the only
conversion; YAML's on/off booleans read as the "on"/"off" choices), and an unknown key
is an error naming the closest valid one.

A renamed key (``RENAMED_KEYS``) in a YAML file or an override is refused with a one-line
error that names the key to write instead; a stored config (a checkpoint's, read by
``config_from_dict``) that carries such a key is read under the key's present name, since
nobody can edit it.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import yaml

from myxtts.config.bounds import MAX_CONFIG_BYTES, BoundedLoader, TooLarge, excerpt
from myxtts.config.checks import check_config
from myxtts.config.sections import MODEL_PRESETS, SECTIONS, VOCODER_PRESETS, Config, ConfigError
from myxtts.system import atomic_write, path_kind

# Refused key names -> the key to write instead (the names say which GPU and role a share caps).
RENAMED_KEYS = {
    "data.auto_memory_fraction": "data.auto_batch_memory_share",
    "data.memory_fraction": "data.data_device_memory_cap",
    "train.memory_fraction": "train.device_memory_cap",
}

# ---------------------------------------------------------------- type checking

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list,):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; allow int->float only."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and {"on", "off"} <= set(choices):
            value = "on" if value else "off"  # YAML 1.1 reads bare on/off as booleans
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{key}: {excerpt(value)} is not {_type_name(tp)}{hint}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for a in options:
            try:
                return _coerce(key, value, a)
            except ConfigError:
                pass
        expected = " or ".join(_type_name(a) for a in options)
        raise ConfigError(f"{key}: expected {expected}, got {type(value).__name__} "
                          f"{excerpt(value)}")
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} "
                              f"{excerpt(value)}")
        (inner,) = typing.get_args(tp)
        return [_coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {excerpt(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} "
                              f"{excerpt(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__} "
                              f"{excerpt(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} "
                              f"{excerpt(value)}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - schema bug


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=False)


def _unknown(key: str, valid: list[str], where: str) -> ConfigError:
    key = str(key)
    close = difflib.get_close_matches(key[:200], valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{where}{close[0]}'?" if close else f"; valid keys: {', '.join(valid)}"
    return ConfigError(f"unknown config key {excerpt(where + key)}{hint}")


def _renamed(dotted: str, where: str = "") -> ConfigError:
    return ConfigError(f"{where}config key '{dotted}' is renamed '{RENAMED_KEYS[dotted]}'; write "
                       f"{RENAMED_KEYS[dotted]} instead")


def _refuse_renamed(d: dict[str, Any], where: str) -> None:
    for section, values in d.items():
        for key in values if isinstance(values, dict) else ():
            if f"{section}.{key}" in RENAMED_KEYS:
                raise _renamed(f"{section}.{key}", where)


def _present_names(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """A stored section's values with any renamed key under its present name."""
    out = {}
    for k, v in values.items():
        new = RENAMED_KEYS.get(f"{name}.{k}", f"{name}.{k}").split(".", 1)[1]
        if new in out or (new != k and new in values):
            raise ConfigError(f"{name}: both '{name}.{k}' and its present name '{name}.{new}' "
                              f"are set")
        out[new] = v
    return out


def _build_section(name: str, values: dict[str, Any]) -> Any:
    cls = SECTIONS[name]
    if not isinstance(values, dict):
        raise ConfigError(f"{name}: expected a mapping of keys, got {type(values).__name__}")
    values = _present_names(name, values)
    hints = _hints(cls)
    valid = [f.name for f in fields(cls)]
    kwargs: dict[str, Any] = {}
    if name == "model":
        preset = values.get("preset", "tiny")
        preset = _coerce("model.preset", preset, hints["preset"])
        kwargs.update(MODEL_PRESETS[preset])
    if name == "vocoder":
        preset = _coerce("vocoder.preset", values.get("preset", "tiny"), hints["preset"])
        kwargs.update(VOCODER_PRESETS[preset])
    for k, v in values.items():
        if k not in valid:
            raise _unknown(k, valid, f"{name}.")
        kwargs[k] = _coerce(f"{name}.{k}", v, hints[k])
    return cls(**kwargs)


def config_from_dict(d: dict[str, Any] | None) -> Config:
    d = d or {}
    if not isinstance(d, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(d).__name__}")
    for k in d:
        if k not in SECTIONS:
            raise _unknown(k, list(SECTIONS), "")
    cfg = Config(**{name: _build_section(name, d.get(name) or {}) for name in SECTIONS})
    check_config(cfg)
    return cfg


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names one key twice (YAML keeps only the last: the first would be lost)."""


class TooLargeYAML(yaml.YAMLError):
    """A document that would grow past ``config.bounds``' limits once read (aliases)."""


class _UniqueKeyLoader(BoundedLoader):
    """``yaml.SafeLoader``, bounded (``config.bounds.BoundedLoader``), that refuses a key
    repeated in one mapping, naming it and its line."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first != line:
                raise DuplicateKeyError(f"key {excerpt(key)} on line {line} repeats the key of line "
                                        f"{first} (YAML would keep only the last); remove one")
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (:class:`DuplicateKeyError`) and a
    document past ``config.bounds``' limits (:class:`TooLargeYAML`), before building it."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except TooLarge as e:
        raise TooLargeYAML(str(e)) from None


def load_config(path: str | Path | None = None, preset: str | None = None,
                overrides: list[str] | None = None,
                inherit: tuple[str, dict[str, dict[str, Any]]] | None = None) -> Config:
    """YAML file (optional) -> preset (optional) -> ``section.key=value`` overrides.

    ``inherit``: (where, sections) settings that come with the data (a store's audio and
    text sections, a run's config): they fill every key the file, preset and overrides
    leave unset; a key those set to another value is a ConfigError naming both values."""
    d: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        kind = path_kind(p)
        if kind == "nothing":
            raise ConfigError(f"config file {p} does not exist (write one with `myxtts config show > {p.name}`)")
        if kind != "a file":  # a FIFO would block the read; a folder is a wrong argument
            raise ConfigError(f"config file {p} is {kind}, not a file; give a YAML file "
                              f"(`myxtts config show` prints one)")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {p} is {p.stat().st_size / 2**20:.1f} MiB; a config "
                              f"is a few KB (at most {MAX_CONFIG_BYTES // 2**20} MiB): give the "
                              f"YAML file `myxtts config show` prints")
        try:
            d = load_yaml(p.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); give a YAML file saved "
                              f"as UTF-8") from None
        except OSError as e:
            raise ConfigError(f"{p}: cannot be read ({e.strerror or e})") from None
        except (DuplicateKeyError, TooLargeYAML) as e:
            raise ConfigError(f"{p}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}".replace("\n", " ")) from e
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        _refuse_renamed(d, f"{p}: ")
    if preset is not None:
        d.setdefault("model", {})
        # A preset on the command line wins over the file's: drop the file's explicit
        # architecture keys so the preset is not half-applied.
        d["model"] = {"preset": preset}
    for item in overrides or []:
        apply_override(d, item)
    if inherit is not None:
        _inherit(d, *inherit)
    return config_from_dict(d)


def _inherit(d: dict[str, Any], where: str, sections: dict[str, dict[str, Any]]) -> None:
    """Merge ``sections`` (from ``where``) into the raw config ``d`` (see ``load_config``)."""
    for name, values in sections.items():
        if name not in SECTIONS or not isinstance(values, dict):
            continue
        mine = d.setdefault(name, {})
        theirs = _present_names(name, values)
        if name == "model" and "preset" in mine and mine.get("preset") != theirs.get("preset"):
            raise ConfigError(f"model.preset: {where} has {excerpt(theirs.get('preset'))}, this "
                              f"command asks for {excerpt(mine['preset'])}; leave --model-size out to "
                              f"use {where}'s model")
        for key, value in theirs.items():
            if key in mine:
                a = getattr(_build_section(name, {key: mine[key]}), key)
                b = getattr(_build_section(name, {key: value}), key)
                if a != b:
                    raise ConfigError(f"{name}.{key}: {where} has {excerpt(b)}, this command sets "
                                      f"{excerpt(a)}; drop the setting to use {where}'s value")
            mine[key] = value


def apply_override(d: dict[str, Any], item: str) -> None:
    """Apply ``section.key=value`` (value parsed as YAML) to the raw dict ``d``."""
    if "=" not in item:
        raise ConfigError(f"override {excerpt(item)} must look like section.key=value, e.g. "
                          f"train.max_steps=100")
    dotted, raw = item.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2:
        raise ConfigError(f"override {excerpt(item)}: key must be section.key, e.g. "
                          f"data.batch_frames")
    section, key = parts
    if f"{section}.{key}" in RENAMED_KEYS:
        raise _renamed(f"{section}.{key}")
    if section not in SECTIONS:
        raise _unknown(section, list(SECTIONS), "")
    valid = [f.name for f in fields(SECTIONS[section])]
    if key not in valid:
        raise _unknown(key, valid, f"{section}.")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except TooLargeYAML as e:
        raise ConfigError(f"--set {section}.{key}: the value {e}") from None
    except yaml.YAMLError:
        value = raw
    # A text key takes the text as written: "--set data.data_device=cuda:0" parses as a YAML
    # mapping, "--output-dir -" as a list, "--set train.output_dir=2024" as a number.
    if not isinstance(value, str) and _hints(SECTIONS[section])[key] is str:
        value = raw
    sec = d.setdefault(section, {})
    if sec is None:
        sec = d[section] = {}
    sec[key] = value


# ---------------------------------------------------------------- YAML output

def _scalar(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


def to_yaml(cfg: Config, header: str | None = None) -> str:
    """A complete, commented YAML document that ``load_config`` reads back to ``cfg``."""
    lines: list[str] = []
    if header:
        lines += [f"# {h}" for h in header.splitlines()] + [""]
    for name, cls in SECTIONS.items():
        section = getattr(cfg, name)
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        lines.append(f"{name}:  # {doc}")
        for f in fields(cls):
            value = _scalar(getattr(section, f.name))
            lines.append(f"  {f.name}: {value}  # {f.metadata.get('help', '')}")
        lines.append("")
    return "\n".join(lines)


def save_config(cfg: Config, path: str | Path) -> None:
    atomic_write(Path(path), to_yaml(cfg))
