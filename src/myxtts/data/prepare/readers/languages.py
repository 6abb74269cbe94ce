"""The ``text.languages`` setting under which a dataset's language problems go away.

Why: a Persian corpus read under the default ``text.languages=[en]`` reports every row
("unknown language" where the rows name ``fa``, "characters outside the language" where
they name none), and neither problem says which key makes the rows Persian. This finds
the setting by reading the dataset again (readers open no audio, so a read is cheap), only
when language problems were reported:

1. Read under a wide ``text.languages``: the config's, the languages rows named but the
   config lacks, and one language per script the others do not cover (``en`` for Latin,
   ``fa`` for Arabic letters, ``ru`` for Cyrillic, ...: the first of each script in
   ``text.scripts.LANGUAGE_SCRIPTS``). Rows naming no language take the one their script
   fits (``common.row_language``).
2. Keep the languages the rows of that read use (the config's first, in its order); the
   default stays unless no row uses it.
3. Read again under that setting: only when it reports no language problem is it offered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from myxtts.config import Config
from myxtts.data.prepare.records import LANGUAGE_REASONS, DataReport, DatasetError, LanguageFix
from myxtts.text.scripts import LANGUAGE_SCRIPTS

# read(config) -> (splits, path named when nothing was usable, else None)
Reader = Callable[[Config], tuple[Any, "Path | None"]]


def _language_problems(report: DataReport) -> int:
    return sum(1 for p in report if p.reason in LANGUAGE_REASONS)


def _with_languages(cfg: Config, languages: list[str], default: str) -> Config:
    text = dataclasses.replace(cfg.text, languages=list(languages), default_language=default)
    return dataclasses.replace(cfg, text=text)


def apply_language_fix(cfg: Config, fix: LanguageFix) -> Config:
    """``cfg`` with the fix's ``text.languages`` and ``text.default_language``."""
    return _with_languages(cfg, list(fix.languages), fix.default_language)


def _wide_languages(cfg: Config, named: set[str]) -> list[str]:
    wide = list(cfg.text.languages) + sorted(named - set(cfg.text.languages))
    covered: set[str] = set()
    for lang in wide:
        covered |= LANGUAGE_SCRIPTS.get(lang, frozenset())
    for code, scripts in LANGUAGE_SCRIPTS.items():
        if not scripts & covered:
            wide.append(code)
            covered |= scripts
    return wide


def _clean_read(read: Reader, cfg: Config) -> Any | None:
    """The splits when ``cfg`` reads usable rows with no language problem, else None."""
    try:
        splits, empty_at = read(cfg)
    except DatasetError:
        return None
    if empty_at is not None or _language_problems(splits.report):
        return None
    return splits


def find_language_fix(cfg: Config, report: DataReport, read: Reader) -> LanguageFix | None:
    """The setting that removes every language problem of ``report``, or None (also when
    there is none to remove, or the problems do not come from the setting)."""
    n = _language_problems(report)
    if not n:
        return None
    wide = _clean_read(read, _with_languages(cfg, _wide_languages(cfg, report.unknown_languages),
                                             cfg.text.default_language))
    if wide is None:
        return None
    used = {u.language for u in wide.all}
    order = _wide_languages(cfg, report.unknown_languages)
    languages = [lang for lang in order if lang in used]
    default = cfg.text.default_language if cfg.text.default_language in used else languages[0]
    if _clean_read(read, _with_languages(cfg, languages, default)) is None:
        return None
    return LanguageFix(tuple(languages), default, n, default != cfg.text.default_language)
