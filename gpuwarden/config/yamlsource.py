"""Read a YAML config file into plain data, remembering where every key is and rejecting duplicate keys.

Why: a config error is only useful if it points at the line to fix, and PyYAML alone neither reports
positions after loading nor complains about a key given twice (it silently keeps the last one — a classic
way for `dry_run: true` to be overridden by a forgotten `dry_run: false` further down). This module knows
nothing about gpuwarden's models; it turns text into (data, line of every path, problems).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

Path = tuple[Hashable, ...]
"""A location in the loaded data: mapping keys and list indices from the document root."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class YamlDocument:
    """The loaded data, the 1-based line of each path, and problems found (field, message)."""

    data: Any = None
    lines: dict[Path, int] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)


def dotted(path: Path) -> str:
    """`('adapter', 'rules', 0, 'seriesQuery')` → `adapter.rules[0].seriesQuery`."""
    out = ""
    for seg in path:
        if isinstance(seg, int) and not isinstance(seg, bool) and out:
            out += f"[{seg}]"
        else:
            out += f".{seg}" if out else str(seg)
    return out


def _syntax_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        what = exc.problem or "invalid YAML"
        context = f" ({exc.context})" if exc.context else ""
        return where, (
            f"YAML syntax error: {what}{context}; check the indentation and quote values that contain "
            "': ' or start with a special character"
        )
    return "(file)", f"YAML syntax error: {exc}"


class _Walker:
    """Collects line numbers and duplicate keys from the node tree, constructing keys as YAML would."""

    def __init__(self, loader: yaml.SafeLoader, document: YamlDocument) -> None:
        self.loader = loader
        self.doc = document

    def walk(self, node: Node, path: Path) -> None:
        if isinstance(node, MappingNode):
            first_line: dict[Hashable, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.loader.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    continue  # PyYAML itself rejects unhashable keys while constructing
                line = key_node.start_mark.line + 1
                if key in first_line:
                    self.doc.problems.append(
                        (
                            dotted((*path, key)),
                            f"key given twice, on lines {first_line[key]} and {line}; YAML would silently "
                            "keep only the last value, so remove one",
                        )
                    )
                    continue
                first_line[key] = line
                self.walk(value_node, (*path, key))
                self.doc.lines[(*path, key)] = line
        elif isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                self.walk(item, (*path, index))
                self.doc.lines[(*path, index)] = item.start_mark.line + 1


def parse_yaml(text: str) -> YamlDocument:
    """Parse one YAML document. A syntax error becomes the only problem, and `data` is then None."""
    doc = YamlDocument()
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return doc
        doc.data = loader.construct_document(node)
        _Walker(loader, doc).walk(node, ())
        doc.lines[()] = node.start_mark.line + 1
    except yaml.YAMLError as exc:
        return YamlDocument(problems=[_syntax_problem(exc)])
    finally:
        loader.dispose()
    return doc
