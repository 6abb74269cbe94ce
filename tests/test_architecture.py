"""The package's shape: layers import only downward, modules stay readable in size.

Layers, top to bottom (a module may import its own concern and anything below it):

    cli -> inference / diagnose -> train -> data / model / observe -> synthetic -> audio / text
        -> config -> system

Within the data/model/observe layer the concerns stay apart, with one exception: the
model reads the batch contract (``myxtts.data.batch``), which is a leaf of its own.
Lazy (function-level) imports count: they are dependencies all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "src" / "myxtts"
LAYERS = [{"system"}, {"config"}, {"audio", "text"}, {"synthetic"}, {"data", "model", "observe"},
          {"train"}, {"inference", "diagnose"}, {"cli"}]
ALLOWED_ACROSS = {("model", "data.batch")}  # (importer concern, imported module below myxtts.)
MAX_MODULE_LINES = 420  # "modules under ~400 lines"


def _concern(module: str) -> str:
    return module.split(".")[0]


def _layer(concern: str) -> int:
    for i, layer in enumerate(LAYERS):
        if concern in layer:
            return i
    raise AssertionError(f"myxtts.{concern} is in no layer of tests/test_architecture.py")


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if parts:  # myxtts/__init__.py itself imports nothing of the package
            out.append((".".join(parts), path))
    return out


def _imports(path: Path) -> set[str]:
    """``myxtts.``-relative names of everything ``path`` imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found |= {n.removeprefix("myxtts.") for n in names if n.startswith("myxtts.")}
    return found


def test_every_import_points_down_or_stays_in_its_concern():
    wrong = []
    for module, path in _modules():
        mine = _concern(module)
        for target in _imports(path):
            theirs = _concern(target)
            if theirs == mine:
                continue
            if _layer(theirs) < _layer(mine):
                continue
            if _layer(theirs) == _layer(mine) and any(
                    mine == a and (target == b or target.startswith(b + ".")) for a, b in ALLOWED_ACROSS):
                continue
            wrong.append(f"myxtts.{module} imports myxtts.{target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_layering_check_sees_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from myxtts.inference.synthesizer import Synthesizer\n")
    assert _imports(probe) == {"inference.synthesizer"}


def test_modules_stay_readable():
    sizes = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in _modules()}
    long = [f"myxtts.{m}: {n} lines" for m, n in sizes.items() if n > MAX_MODULE_LINES]
    assert len(sizes) > 50 and not long, "split these by what they hold:\n" + "\n".join(long)
