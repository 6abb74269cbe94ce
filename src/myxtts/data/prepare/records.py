"""Plain records shared by every dataset reader: one utterance, one problem, one report.

Why a report instead of exceptions: a real dataset has a handful of broken rows among
thousands. Stopping at the first one turns cleaning into a slow edit-run loop; collecting
every problem (file, line, reason, fix) lets the user repair them all in one pass, while
the usable rest still trains. Only a dataset that cannot be read at all raises
``DatasetError``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Audio reasons are set by the audio loader itself (AudioError.reason).
from myxtts.audio.io import SILENT_AUDIO as SILENT_AUDIO
from myxtts.audio.io import UNREADABLE_AUDIO as UNREADABLE_AUDIO
from myxtts.audio.io import WRONG_SAMPLE_RATE as WRONG_SAMPLE_RATE
from myxtts.data.store.format import SPLITS as SPLITS

# Reasons are short, stable categories (problems are grouped and counted by them);
# the specifics of one occurrence go into ``Problem.detail``.
MALFORMED_ROW = "malformed row"
MISSING_AUDIO = "missing audio"
MISSING_TRANSCRIPT = "missing transcript"
EMPTY_TEXT = "empty text"
NOTHING_TO_SAY = "nothing to say"  # only punctuation (or characters dropped) after cleaning
OUTSIDE_LANGUAGE = "characters outside the language"
DUPLICATE_ID = "duplicate id"
NOT_UTF8 = "not UTF-8"
UNKNOWN_LANGUAGE = "unknown language"
OUTSIDE_DATASET = "outside the dataset"  # a row's clip path leads out of its folder
MISPLACED_AUDIO = "clips outside the layout"  # audio where the layout never reads it
TOO_SHORT = "too short"
TOO_LONG = "too long"
BAD_ID = "id is not a name"  # a path separator, "..", a control character, or too long
NONFINITE_FEATURES = "non-finite features"  # a clip whose mels came out NaN or infinite


SPEAKER_LABEL_CHARS = 24  # a longer speaker name (Common Voice's 64-hex client_id) is shortened


def speaker_label(name: str) -> str:
    """``name`` as a summary lists it: a name longer than ``SPEAKER_LABEL_CHARS`` (a Common
    Voice client_id is 64 hex digits) as its first 8 characters and an ellipsis; the
    manifest and the report keep the whole name."""
    return name if len(name) <= SPEAKER_LABEL_CHARS else name[:8] + "\u2026"


class DatasetError(ValueError):
    """The dataset cannot be read at all (one line naming the path, the cause and the fix).

    ``report`` carries the problems collected before giving up (e.g. when every row was
    broken), so a command can still show them.
    """

    def __init__(self, message: str, report: DataReport | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Utterance:
    """One clip and its transcript. ``duration_s`` is None until a header was read."""

    id: str
    audio_path: Path
    text: str
    speaker: str
    language: str
    duration_s: float | None = None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the dataset, located precisely enough to fix it.

    ``source`` is the file to edit (metadata file, transcript or clip), ``line`` its
    1-based line number when the problem is a row of a text file.
    """

    source: str
    line: int | None
    utterance_id: str | None
    reason: str
    fix: str
    detail: str = ""

    @property
    def location(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else self.source

    def format(self) -> str:
        uid = f" [{self.utterance_id}]" if self.utterance_id else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.location}{uid} {self.reason}{detail}; fix: {self.fix}"


LANGUAGE_REASONS = (UNKNOWN_LANGUAGE, OUTSIDE_LANGUAGE)  # what another text.languages can fix


@dataclass(frozen=True)
class LanguageFix:
    """A ``text.languages`` / ``text.default_language`` under which every language problem
    of a dataset goes away (found by reading it again under that setting)."""

    languages: tuple[str, ...]
    default_language: str
    n_problems: int  # language problems under the config that was read
    default_changed: bool = False  # default_language differs from the config's

    @property
    def set_args(self) -> str:
        """The exact ``--set`` to pass (no spaces in the list, so it needs no quoting)."""
        args = f"--set text.languages=[{','.join(self.languages)}]"
        return f"{args} --set text.default_language={self.default_language}" if self.default_changed else args

    def line(self) -> str:
        return (f"all {self.n_problems} language problem(s) go away with {self.set_args} "
                f"(the languages the rows name or are written in)")


@dataclass
class DataReport:
    """Problems found while reading or inspecting a dataset, in the order found.

    ``unknown_languages``: languages named by rows that ``text.languages`` lacks (the
    rows are reported too); ``language_fix``: the setting that would fix every language
    problem, when one exists.
    """

    problems: list[Problem] = field(default_factory=list)
    unknown_languages: set[str] = field(default_factory=set)
    language_fix: LanguageFix | None = None

    def add(self, source: str | Path, line: int | None, utterance_id: str | None, reason: str,
            fix: str, detail: str = "") -> Problem:
        p = Problem(str(source), line, utterance_id, reason, fix, detail)
        self.problems.append(p)
        return p

    def extend(self, other: DataReport) -> None:
        self.problems.extend(other.problems)

    def __len__(self) -> int:
        return len(self.problems)

    def __iter__(self):
        return iter(self.problems)

    def counts_by_reason(self) -> dict[str, int]:
        """``{reason: count}``, most frequent first (ties alphabetical)."""
        c = Counter(p.reason for p in self.problems)
        return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    def by_reason(self, reason: str) -> list[Problem]:
        return [p for p in self.problems if p.reason == reason]

    def format(self, max_per_reason: int = 5, indent: str = "  ") -> str:
        """Human-readable summary grouped by reason, at most ``max_per_reason`` lines each."""
        if not self.problems:
            return "no problems found"
        lines = [f"{len(self.problems)} problem(s):"]
        for reason, n in self.counts_by_reason().items():
            lines.append(f"{indent}{reason} ({n}):")
            group = self.by_reason(reason)
            for p in group[:max_per_reason]:
                lines.append(f"{indent}{indent}{p.format()}")
            if n > max_per_reason:
                lines.append(f"{indent}{indent}... and {n - max_per_reason} more")
        if self.language_fix is not None:
            lines.append(f"{indent}{self.language_fix.line()}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"counts": self.counts_by_reason(),
                           "problems": [asdict(p) for p in self.problems]},
                          indent=1, ensure_ascii=False)


def first_per_reason(items: list, n: int = 3) -> list:
    """The first ``n`` rejections (dicts) or problems of each reason: the summary names
    files and lines; report.json has them all."""
    seen: dict[str, int] = {}
    out = []
    for it in items:
        reason = it["reason"] if isinstance(it, dict) else it.reason
        seen[reason] = seen.get(reason, 0) + 1
        if seen[reason] <= n:
            out.append(it)
    return out
