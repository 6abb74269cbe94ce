"""The package's shape: layers import only downward, modules stay readable in size; and the
benchmarks' (no circles, no private names across files).

Layers, top to bottom (a module may import its own concern and anything below it):

    cli -> synthetic -> evaluate -> inference / diagnose -> train -> artifacts
        -> data / model / observe / metrics -> audio / text -> config -> outputs -> system

Inference reads what training wrote through ``artifacts`` alone: it never imports ``train``.
The training engine (``train.engine``) is one object with a small surface: code outside it
imports the package's names, never its modules, and no code outside it writes another
object's private attribute (torch's included).
Inside ``data`` the rooms import only those before them: ``store`` neither ``prepare`` nor
``feed``, ``prepare`` not ``feed``.

Within the data/model/observe/metrics layer the concerns stay apart, with one exception: the
model reads the batch contract (``myxtts.data.batch``), which is a leaf of its own.
Lazy (function-level) imports count: they are dependencies all the same. Each one says
why it is not at the top, in a comment on its line or the line above (an import right
after another shares that one's): ``deferred`` (start-up time: ``myxtts --help`` starts
without torch), ``optional`` (a package that may be missing) or ``circle`` (the modules
it would tie together).

No import circles between modules. The graph's nodes are the package's modules (a package
is its ``__init__``), its edges every import at any depth, ``if TYPE_CHECKING:`` blocks
included: a circle that only type hints close still ties the two modules together.
``from myxtts.pkg import sub`` is an edge to the submodule ``pkg.sub``, not to
``pkg/__init__``; importing ``pkg.sub`` is not counted as an edge to ``pkg/__init__``
either, although Python runs that first. So a package whose ``__init__`` re-exports its
submodules' names is no circle; it is one when a submodule takes names that the
``__init__`` itself provides (``from myxtts.pkg import name``) while the ``__init__``
imports that submodule, because then the order of imports decides what is defined.
"""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import tokenize
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "src" / "myxtts"
LAYERS = [{"system"}, {"outputs"}, {"config"}, {"audio", "text"},
          {"data", "model", "observe", "metrics"},
          {"artifacts"}, {"train"}, {"inference", "diagnose"}, {"evaluate"}, {"synthetic"}, {"cli"}]
ALLOWED_ACROSS = {("model", "data.batch")}  # (importer concern, imported module below myxtts.)
MAX_MODULE_LINES = 420  # "modules under ~400 lines"


def _concern(module: str) -> str:
    return module.split(".")[0]


def _layer(concern: str) -> int:
    for i, layer in enumerate(LAYERS):
        if concern in layer:
            return i
    raise AssertionError(f"myxtts.{concern} is in no layer of tests/test_architecture.py")


def _modules(package: Path = PACKAGE) -> list[tuple[str, Path]]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if parts:  # myxtts/__init__.py itself imports nothing of the package
            out.append((".".join(parts), path))
    return out


def _imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """``myxtts.``-relative names of the modules ``path`` imports, at any depth
    (``from myxtts.a import b`` names ``a.b`` where that is a module of ``package``)."""
    modules = {name for name, _ in _modules(package)}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}".removeprefix(
                "myxtts.") in modules else node.module for a in node.names]
        else:
            continue
        found |= {n.removeprefix("myxtts.") for n in names if n.startswith("myxtts.")}
    return found


def _circles(package: Path = PACKAGE) -> list[list[str]]:
    """Every set of modules that import each other round a circle, each as a path that
    closes it."""
    return _graph_circles({name: _imports(path, package) - {name}
                           for name, path in _modules(package)})


def _graph_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node, each as a path that
    closes it."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph[node] & graph.keys()):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(group) > 1:
                circles.append(_closing_path(graph, set(group), node))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return circles


def _closing_path(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest path ``start -> ... -> start`` inside ``group`` (breadth first)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no circle through {start}")  # pragma: no cover - Tarjan's group


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


NOT_IMPORTED = [("inference", "train"),  # readers of a run reach it through artifacts
                ("data.store", "data.prepare"), ("data.store", "data.feed"),
                ("data.prepare", "data.feed")]


def test_inference_never_imports_train_and_data_rooms_import_only_earlier_ones():
    wrong = [f"myxtts.{module} imports myxtts.{target}"
             for module, path in _modules() for target in _imports(path)
             for importer, imported in NOT_IMPORTED
             if (module == importer or module.startswith(importer + "."))
             and (target == imported or target.startswith(imported + "."))]
    assert not wrong, "imports across a wall:\n" + "\n".join(wrong)


ENGINE = "train.engine"


def test_outside_the_engine_only_its_package_is_imported():
    wrong = [f"myxtts.{module} imports myxtts.{target}"
             for module, path in _modules() if not module.startswith(ENGINE)
             for target in _imports(path) if target.startswith(ENGINE + ".")]
    assert not wrong, "reaching into the engine:\n" + "\n".join(wrong)


def _private_writes(path: Path) -> list[str]:
    """``x._name = ...`` (also augmented) where ``x`` is not ``self`` / ``cls``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            for attr in ast.walk(target):
                if (isinstance(attr, ast.Attribute) and attr.attr.startswith("_")
                        and not attr.attr.startswith("__")
                        and not (isinstance(attr.value, ast.Name)
                                 and attr.value.id in ("self", "cls"))):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_nothing_outside_the_engine_writes_private_attributes(tmp_path):
    wrong = [w for module, path in _modules() if not module.startswith(ENGINE)
             for w in _private_writes(path)]
    assert not wrong, "private attributes written from outside:\n" + "\n".join(wrong)
    probe = tmp_path / "probe.py"
    probe.write_text("def f(sched, opt):\n    sched._last_lr = [1.0]\n    opt.x += 1\n")
    assert _private_writes(probe) == ["probe.py:2: sched._last_lr"]


def _defined_attributes(path: Path) -> set[str]:
    """Attribute names the classes of ``path`` define: assigned on ``self`` in their methods,
    or declared in their bodies (dataclass fields, class attributes)."""
    names = set()
    for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(cls, ast.ClassDef):
            continue
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                names.add(stmt.target.id)
            elif isinstance(stmt, ast.Assign):
                names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        for node in ast.walk(cls):
            for target in _written(node):
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    names.add(target.attr)
    return names


def _written(node: ast.AST) -> list[ast.Attribute]:
    """The attributes ``node`` assigns, augments or deletes (``x.a = ...``, ``x.a, y.b =
    ...``, ``del x.a``; an item written, ``x.a[k] = ...``, is no attribute write)."""
    targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else \
        [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
    out, todo = [], list(targets)
    while todo:
        target = todo.pop()
        if isinstance(target, ast.Tuple | ast.List):
            todo.extend(target.elts)
        elif isinstance(target, ast.Starred):
            todo.append(target.value)
        elif isinstance(target, ast.Attribute):
            out.append(target)
    return out


def _writes_across(paths: dict[str, Path]) -> list[str]:
    """Writes, in one of ``paths``' modules, of an attribute that a class of ANOTHER of them
    defines (and none of its own: a name both define is taken for the module's own
    record's), on an object other than ``self`` / ``cls``: state changed from outside the
    object that owns it."""
    defined = {name: _defined_attributes(path) for name, path in paths.items()}
    found = []
    for name, path in paths.items():
        others = set().union(*(d for n, d in defined.items() if n != name)) - defined[name]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _written(node):
                if (target.attr in others and not (isinstance(target.value, ast.Name)
                                                   and target.value.id in ("self", "cls"))):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_no_engine_module_writes_what_another_engine_module_owns(tmp_path):
    """Inside the engine the same holds for public attributes: a collaborator (the warm-up,
    the batch-size probe, the graphs) changes the engine's state through its methods, never
    by assigning an attribute some other engine module's class defines (no ``use_graphs``
    setter, runner swap or marker written from outside). The writes left on other objects
    are torch's hooks (fused AdamW's ``found_inf``, the schedule's ``base_lrs``, a compiled
    block's ``_compiled_call_impl``) and a module's own records."""
    engine = {name: path for name, path in _modules() if name.startswith(ENGINE + ".")}
    assert len(engine) > 10
    wrong = _writes_across(engine)
    assert not wrong, "engine state written from another module:\n" + "\n".join(wrong)
    (tmp_path / "a.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass Report:\n    seconds: float = 0\n"
        "class Step:\n    def __init__(self):\n        self.marker = None\n")
    (tmp_path / "b.py").write_text(
        "class Own:\n    other: int = 0\n"
        "def f(step, report, opt, own):\n    step.marker = print\n    report.seconds += 1\n"
        "    opt.found_inf, own.other = 1, 2\n    del step.marker\n    step.marker_log[0] = 1\n")
    assert sorted(_writes_across({"a": tmp_path / "a.py", "b": tmp_path / "b.py"})) == [
        "b.py:4: step.marker", "b.py:5: report.seconds", "b.py:7: step.marker"]


def test_the_layering_check_sees_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from myxtts.inference.synthesizer import Synthesizer\n")
    assert _imports(probe) == {"inference.synthesizer"}


def test_no_import_circles():
    circles = _circles()
    assert not circles, "modules importing each other:\n" + "\n".join(
        " -> ".join(f"myxtts.{m}" for m in c) for c in circles)


def test_the_circle_check_sees_a_circle(tmp_path):
    package = tmp_path / "myxtts"
    (package / "pkg").mkdir(parents=True)
    (package / "pkg" / "__init__.py").write_text("from myxtts.pkg.leaf import LEAF\n")
    (package / "pkg" / "leaf.py").write_text("LEAF = 1\n")
    (package / "pkg" / "down.py").write_text("from myxtts.pkg import leaf\n")
    (package / "a.py").write_text("import myxtts.b\n")
    (package / "b.py").write_text("def f():\n    from myxtts.c import g\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from myxtts.a import A\n")
    assert _circles(package) == [["a", "b", "c", "a"]]
    (package / "pkg" / "leaf.py").write_text("from myxtts.pkg import LEAF as OTHER\nLEAF = 1\n")
    assert _circles(package) == [["a", "b", "c", "a"], ["pkg", "pkg.leaf", "pkg"]]


def test_modules_stay_readable():
    sizes = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in _modules()}
    long = [f"myxtts.{m}: {n} lines" for m, n in sizes.items() if n > MAX_MODULE_LINES]
    assert len(sizes) > 50 and not long, "split these by what they hold:\n" + "\n".join(long)


LOCAL_IMPORT_REASONS = ("deferred", "optional", "circle")


def _unexplained_local_imports(path: Path) -> list[str]:
    """Imports inside a function without a comment naming a reason (``LOCAL_IMPORT_REASONS``)
    on their lines or the line just above; an import that follows another in the same block
    (blank lines aside) shares its comment."""
    source = path.read_text(encoding="utf-8")
    reasons = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
               if tok.type == tokenize.COMMENT
               and any(word in tok.string for word in LOCAL_IMPORT_REASONS)}
    found = {}
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for block in ast.walk(fn):
            for stmts in (getattr(block, f, None) for f in ("body", "orelse", "finalbody")):
                explained = False
                for stmt in stmts if isinstance(stmts, list) else []:
                    if not isinstance(stmt, ast.Import | ast.ImportFrom):
                        explained = False
                        continue
                    lines = range(stmt.lineno - 1, stmt.end_lineno + 1)
                    explained = explained or any(n in reasons for n in lines)
                    if not explained:
                        found[stmt.lineno] = f"{path.name}:{stmt.lineno}: {ast.unparse(stmt)}"
    return [found[n] for n in sorted(found)]


def test_every_local_import_says_why_it_is_not_at_the_top():
    wrong = [w for _, path in _modules() for w in _unexplained_local_imports(path)]
    assert not wrong, ("function-level imports without a reason (move them to the top, or say "
                       f"{' / '.join(LOCAL_IMPORT_REASONS)} in a comment):\n" + "\n".join(wrong))


def test_the_local_import_check_sees_one_without_a_reason(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n"
                     "    import json\n"  # no comment: found
                     "    # deferred: torch\n"
                     "    import torch\n\n"
                     "    from myxtts import x\n"  # the group's comment above
                     "    y = 1\n"
                     "    from myxtts import z  # noqa: F401\n"  # a comment, but no reason
                     "    try:  # optional: the eval extra\n"
                     "        import whisper\n"
                     "    except ImportError:\n"
                     "        def g():\n"
                     "            import os\n")  # nested: found once
    assert _unexplained_local_imports(probe) == [
        "probe.py:2: import json", "probe.py:8: from myxtts import z", "probe.py:13: import os"]


def test_the_command_line_starts_without_torch(tmp_path):
    """``myxtts --help`` builds every subcommand's parser; torch (about a second to import),
    numpy and soundfile (~80 ms: as long as the rest of ``--help``) load only for a command
    that runs them."""
    code = ("import sys; from myxtts.cli.main import build_parser; build_parser(); "
            "print(any(m in sys.modules for m in ('torch', 'numpy', 'soundfile')))")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


BENCHMARKS = REPO / "benchmarks"


def _bench_modules(folder: Path = BENCHMARKS) -> dict[str, Path]:
    return {path.stem: path for path in sorted(folder.glob("*.py"))}


def _bench_uses(path: Path, siblings: set[str]) -> tuple[set[str], list[str]]:
    """The sibling modules ``path`` imports (at any depth), and its uses of another file's
    private names: ``from sibling import _x``, ``sibling._x``, or a private name of the
    package (``from myxtts.a import _x``, a module ``myxtts.a._b``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported, aliases, private = set(), {}, []

    def is_private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in siblings:
                    imported.add(a.name)
                    aliases[a.asname or a.name] = a.name
                elif a.name.startswith("myxtts.") and any(map(is_private, a.name.split("."))):
                    private.append(f"{path.name}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            ours = node.module in siblings
            if ours:
                imported.add(node.module)
            if ours or node.module.startswith("myxtts"):
                names = [node.module, *(a.name for a in node.names)] if not ours else \
                    [a.name for a in node.names]
                if any(is_private(part) for name in names for part in name.split(".")):
                    private.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and is_private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            private.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return imported - {path.stem}, private


def _bench_problems(folder: Path = BENCHMARKS) -> list[str]:
    modules = _bench_modules(folder)
    graph, problems = {}, []
    for name, path in modules.items():
        graph[name], private = _bench_uses(path, set(modules))
        problems += [f"private name of another file: {p}" for p in private]
        problems += [f"private attribute written: {w}" for w in _private_writes(path)]
    problems += ["circle: " + " -> ".join(c) for c in _graph_circles(graph)]
    return problems


def test_benchmarks_have_no_circles_and_use_no_private_names_across_files():
    problems = _bench_problems()
    assert len(_bench_modules()) > 10 and not problems, "\n".join(problems)


def test_the_benchmark_check_sees_circles_and_private_names(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from b import g\n")
    (tmp_path / "b.py").write_text("import a\nfrom c import _hidden\n")
    (tmp_path / "c.py").write_text("import a as first\nfrom myxtts.train.engine import _x\n"
                                   "first._cache = 1\nprint(first._name)\n"
                                   "from myxtts.text import _shared\n")
    assert sorted(_bench_problems(tmp_path)) == sorted([
        "circle: a -> b -> a",
        "private name of another file: b.py:2: from c import _hidden",
        "private name of another file: c.py:2: from myxtts.train.engine import _x",
        "private name of another file: c.py:5: from myxtts.text import _shared",
        "private name of another file: c.py:3: first._cache",
        "private name of another file: c.py:4: first._name",
        "private attribute written: c.py:3: first._cache"])
