"""Bounds on what user text may grow into, checked before it grows, and the one way an error
message quotes a user value.

Why: a 400-byte YAML file whose aliases nest nine deep stands for hundreds of millions of
values; expanding it (checking each value, printing the bad one) takes minutes and
gigabytes. YAML and JSON are therefore bounded while they are read -- nesting depth, and for
YAML the number of values the document stands for once every alias is expanded -- and a
message quotes at most :func:`excerpt` of a value, never the whole of it.
"""

from __future__ import annotations

import json
import re
import reprlib
from typing import Any

import yaml

MAX_NESTING = 64  # a config nests 2 deep (section: key: list); generous for any value
MAX_VALUES = 100_000  # values after alias expansion; a complete config holds ~300
MAX_CONFIG_BYTES = 1 << 20  # a complete, commented config is ~12 KB
EXCERPT_CHARS = 80  # at most this much of a value is quoted in a message


class TooLarge(ValueError):
    """User text that would grow past a bound: nested too deep, too many values once
    expanded, an alias that contains itself. The message says which bound and where."""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 2, 4, 4, 4
_REPR.maxset = _REPR.maxfrozenset = 4
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = EXCERPT_CHARS


def excerpt(value: Any, limit: int = EXCERPT_CHARS, quote: bool = True) -> str:
    """``repr(value)``, at most ~``limit`` characters: nested lists and mappings shown to two
    levels and four items, long strings cut in the middle. Never walks more of ``value``
    than it shows (a value standing for millions of items costs nothing). ``quote=False``
    shows a string as it is (no quotes, no escapes), cut the same way."""
    text = str(value) if isinstance(value, str) and not quote else _REPR.repr(value)
    if len(text) <= limit:
        return text
    keep = max(limit - 5, 10)
    return f"{text[:keep * 2 // 3]} ... {text[-(keep // 3):]}"


# ---------------------------------------------------------------- YAML

class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, before constructing any value, a document nested
    more than ``MAX_NESTING`` deep or standing for more than ``MAX_VALUES`` values once
    every alias is expanded (an alias "bomb"), and an alias that contains itself."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                line = self.peek_event().start_mark.line + 1
                raise TooLarge(f"line {line}: nested more than {MAX_NESTING} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node)
        return node


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` stands for with every alias expanded (a node reached through
    several aliases counts each time); TooLarge past the bounds. Each node is visited once
    (its size and height are remembered), so the walk costs the document's size, not the
    expansion's."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height)
    open_: set[int] = set()

    def visit(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in done:
            size, height = done[key]
        else:
            if key in open_:
                raise TooLarge(f"line {node.start_mark.line + 1}: an alias refers to a value "
                               f"that contains it (a value without end)")
            if depth > MAX_NESTING:
                raise TooLarge(f"line {node.start_mark.line + 1}: nested more than "
                               f"{MAX_NESTING} levels deep once its aliases are expanded")
            open_.add(key)
            children: list[yaml.Node] = []
            if isinstance(node, yaml.SequenceNode):
                children = list(node.value)
            elif isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            size, height = 1, 0
            for child in children:
                s, h = visit(child, depth + 1)
                size, height = size + s, max(height, h + 1)
                if size > MAX_VALUES:
                    break
            open_.discard(key)
            done[key] = (size, height)
        if depth + height > MAX_NESTING:
            raise TooLarge(f"line {node.start_mark.line + 1}: nested more than {MAX_NESTING} "
                           f"levels deep once its aliases are expanded")
        if size > MAX_VALUES:
            raise TooLarge(f"line {node.start_mark.line + 1}: stands for more than "
                           f"{MAX_VALUES:,} values once its aliases are expanded (a config "
                           f"holds a few hundred); write the values out without nested aliases")
        return size, height

    return visit(root, 1)[0]


# ---------------------------------------------------------------- JSON

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_nesting(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (brackets inside strings do not
    count); linear in the text, no recursion, so it can run before ``json.loads`` would
    exhaust the interpreter's stack."""
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def loads_json(text: str | bytes, max_nesting: int = MAX_NESTING) -> Any:
    """``json.loads`` of text nested at most ``max_nesting`` deep (TooLarge otherwise);
    ``ValueError`` for text that is not JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    deepest = json_nesting(text)
    if deepest > max_nesting:
        raise TooLarge(f"nested {deepest} levels deep (at most {max_nesting})")
    return json.loads(text)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` agreeing in a message: "1 utterance", "3 utterances"."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
