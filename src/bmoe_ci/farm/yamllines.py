"""Line-aware YAML, and the helpers that turn a validation error into ``FILE:LINE: KEY.PATH: message``
(the farm file's loader and the release's YAML files use them)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml


class LineDict(dict):
    """A mapping from YAML that remembers the line of itself and of each key (1-based)."""

    line: int = 0

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.key_lines: dict[Any, int] = {}
        self.duplicates: list[tuple[Any, int, int]] = []  # (key, line, first line)
        self.inherited: dict[Any, int | None] = {}  # key -> line in 'defaults' it was inherited from


class LineList(list):
    """A sequence from YAML that remembers the line of itself and of each item (1-based)."""

    line: int = 0

    def __init__(self, *a: Any):
        super().__init__(*a)
        self.item_lines: list[int] = []


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    out = LineDict()
    out.line = node.start_mark.line + 1
    first: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "unhashable key", key_node.start_mark) from None
        if key in first:
            out.duplicates.append((key, line, first[key]))
        else:
            first[key] = line
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out[key] = loader.construct_object(value_node, deep=True)
        # merged keys come first in node.value; an explicit key later overrides them, line included
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList()
    out.line = node.start_mark.line + 1
    for child in node.value:
        out.append(loader.construct_object(child, deep=True))
        out.item_lines.append(child.start_mark.line + 1)
    return out


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


#: Bounds on a farm file: its size, and the number of nodes it expands to once every alias is
#: followed (a 1 KB "billion laughs" file of nested aliases expands to billions).
MAX_FARM_BYTES = 1 << 20
MAX_EXPANDED_NODES = 100_000


class YamlTooLarge(yaml.YAMLError):
    def __init__(self, problem: str, problem_mark: yaml.Mark | None):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = problem_mark


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes ``node`` stands for with every alias expanded (aliases are shared nodes: memoised)."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a recursive alias counts once (the constructor rejects or shares it)
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(_expanded_size(c, memo) for c in node.value)
        else:
            n = 1
        memo[key] = min(n, MAX_EXPANDED_NODES + 1)
    return memo[key]


def load_yaml_with_lines(text: str) -> Any:
    """Parse YAML text into :class:`LineDict` / :class:`LineList` trees (``yaml.YAMLError`` on bad YAML,
    on a text over :data:`MAX_FARM_BYTES`, or on aliases expanding past :data:`MAX_EXPANDED_NODES`)."""
    if len(text.encode("utf-8", "replace")) > MAX_FARM_BYTES:
        raise YamlTooLarge(f"farm file larger than {MAX_FARM_BYTES} bytes", None)
    loader = _LineLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_EXPANDED_NODES:
            raise YamlTooLarge(
                f"aliases expand to more than {MAX_EXPANDED_NODES} nodes (anchor/alias bomb?)", node.start_mark
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def closest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    hits = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{hits[0]}'?)" if hits else ""


def locate(raw: Any, loc: tuple[Any, ...]) -> tuple[int | None, tuple[Any, ...]]:
    """Line of the deepest node of ``loc`` present in ``raw``, and the path to report (may be rerouted
    to ``defaults.KEY`` when the value was inherited from the defaults block)."""
    line = getattr(raw, "line", None) or None
    node = raw
    for i, part in enumerate(loc):
        if isinstance(node, LineDict) and part in node:
            if part in node.inherited:
                return node.inherited[part], ("defaults", part)
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, LineList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.item_lines[part]
            node = node[part]
        else:
            # the key is missing (e.g. a required key): report at the enclosing mapping
            return line, loc[: i + 1]
    return line, loc
