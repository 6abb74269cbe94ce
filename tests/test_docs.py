"""The README and docs/ stay usable: every page is linked, every relative link and anchor
resolves, the README's layout names every package folder (and only existing ones), the CI
runs the README's test command, and the README stays a ten-minute read."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
PACKAGE = REPO / "src" / "myxtts"
README_MAX_LINES = 260
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, flags=re.M)}


def test_every_docs_page_is_linked_from_the_readme():
    links = set(_LINK.findall(README.read_text(encoding="utf-8")))
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"docs/{p.name}" not in links]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_relative_links_and_anchors_resolve():
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_layout_names_every_package_folder():
    text = README.read_text(encoding="utf-8")
    block = text[text.index("```\nsrc/myxtts/"):]
    block = block[:block.index("\n```", 4)]
    named = set(re.findall(r"^  (\w+)/", block, flags=re.M))
    actual = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert named == actual, (f"README layout vs src/myxtts: not in the README {sorted(actual - named)}, "
                             f"not in the tree {sorted(named - actual)}")


def _module_map() -> set[str]:
    """The modules and folders docs/architecture.md's module map names, as dotted paths
    (a folder ends in "/")."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text[text.index("```\nmyxtts/\n", text.index("## Modules")) + 4:]
    block = block[:block.index("\n```")]
    named, parents = set(), []
    for line in block.splitlines()[1:]:
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        parents = parents[:depth - 1] + [name.rstrip("/")]
        named.add(".".join(parents) + ("/" if name.endswith("/") else ""))
    return named


def test_the_module_map_names_every_module_and_no_other():
    actual = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if path.name != "__init__.py":
            actual.add(".".join(rel.with_suffix("").parts))
        actual |= {".".join(rel.parts[:k]) + "/" for k in range(1, len(rel.parts))}
    named = _module_map()
    assert named == actual, (f"docs/architecture.md's module map vs src/myxtts: missing "
                             f"{sorted(actual - named)}, not in the tree {sorted(named - actual)}")


def test_ci_runs_the_readmes_test_command():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = next(i for i, line in enumerate(ci) if "--- the README's test command" in line)
    command = ci[marker + 1].strip()
    assert command in README.read_text(encoding="utf-8").splitlines()


def test_the_readme_is_a_short_read():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; deep sections go to docs/"
