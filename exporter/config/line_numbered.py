"""Documents read with line numbers: YAML or JSON files whose every value knows its line.

The reader behind the configuration and file_sd files. Each parsed value is a `Node`
holding the line it starts on, so that a problem found later can be reported as
`fleet.yaml:7: targets[1].cap: ...`. Structure checks (a mapping with known keys, a
list) raise `DocumentError`, whose text is the whole message.
"""

from __future__ import annotations

import bisect
import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

# A value with where it was written: (0, "fleet.yaml:7: targets[1].cap") or (8, "--cap").
Sourced = tuple[object, str]


class DocumentError(ValueError):
    """A file that cannot be read, or whose structure is wrong; `str()` says where."""


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def as_written(value: object) -> str:
    """The value as a YAML or JSON file writes it: null, true, 4, 'text'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def wrong_type(value: object, expected: str) -> str:
    """`must be EXPECTED, not TYPE (got VALUE)`; lists and mappings are not echoed."""
    got = "" if isinstance(value, list | dict) else f" (got {as_written(value)})"
    return f"must be {expected}, not {_type_name(value)}{got}"


@dataclass(frozen=True)
class Node:
    """A parsed value and the line it starts on; lists and mappings hold Nodes."""

    value: Any
    line: int
    key_lines: dict[str, int] = field(default_factory=dict)


def location(source: str, line: int, path: str) -> str:
    """`fleet.yaml:7: targets[1].cap`, the prefix of every message about a value."""
    return f"{source}:{line}: {path or '(top level)'}"


def child_path(path: str, key: str) -> str:
    """The key path of `key` inside the mapping at `path`."""
    return f"{path}.{key}" if path else key


def _read_text(path: Path) -> str:
    try:
        # utf-8-sig: editors on Windows save a byte order mark.
        return path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise DocumentError(f"{path}: cannot read the file: {err.strerror}") from None
    except UnicodeDecodeError:
        raise DocumentError(f"{path}: not UTF-8 text") from None


def read_document(path: Path) -> Node | None:
    """The file's document with line numbers; None when it holds none."""
    text = _read_text(path)
    if path.suffix.lower() == ".json":
        return _json_tree(text, str(path))
    return _yaml_tree(text, str(path))


def _yaml_tree(text: str, source: str) -> Node | None:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        return None if root is None else _from_yaml(root, SafeConstructor(), source, "")
    except yaml.MarkedYAMLError as err:
        # Only the short description: the YAML snippet could show a secret's line.
        mark = err.problem_mark or err.context_mark
        line = f":{mark.line + 1}" if mark else ""
        what = ", ".join(part for part in (err.context, err.problem) if part)
        raise DocumentError(f"{source}{line}: invalid YAML: {what}") from None
    except yaml.YAMLError as err:
        raise DocumentError(f"{source}: invalid YAML: {err}") from None


def _from_yaml(node: yaml.Node, constructor: SafeConstructor, source: str, path: str) -> Node:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode):
        items = [
            _from_yaml(item, constructor, source, f"{path}[{i}]")
            for i, item in enumerate(node.value)
        ]
        return Node(items, line)
    if not isinstance(node, yaml.MappingNode):
        return Node(constructor.construct_object(node), line)
    first_lines: dict[str, int] = {}
    for key_node, _ in node.value:
        key_line = key_node.start_mark.line + 1
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
            raise DocumentError(f"{location(source, key_line, path)}: keys must be strings")
        key = key_node.value
        if key in first_lines:
            raise DocumentError(
                f"{location(source, key_line, child_path(path, key))}: "
                f"duplicate key (first at line {first_lines[key]})"
            )
        first_lines[key] = key_line
    # `<<: *anchor` merges: keys written in this mapping win over merged ones.
    constructor.flatten_mapping(node)
    entries: dict[str, Node] = {}
    key_lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        entries[key] = _from_yaml(value_node, constructor, source, child_path(path, key))
        key_lines[key] = key_node.start_mark.line + 1
    return Node(entries, line, key_lines)


def _json_tree(text: str, source: str) -> Node:
    """JSON with line numbers; YAML parsers reject tab-indented or long-keyed JSON."""
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        raise DocumentError(f"{source}:{err.lineno}: invalid JSON: {err.msg}") from None
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    decoder = json.JSONDecoder()

    def line_at(index: int) -> int:
        return bisect.bisect_left(newlines, index) + 1

    def skip(index: int) -> int:
        while text[index] in " \t\r\n":
            index += 1
        return index

    # The text is valid JSON (checked above), so this walk needs no error handling.
    def parse(index: int, path: str) -> tuple[Node, int]:
        index = skip(index)
        line = line_at(index)
        opener = text[index]
        if opener not in "[{":
            value, end = decoder.raw_decode(text, index)
            return Node(value, line), end
        closer = "]" if opener == "[" else "}"
        items: list[Node] = []
        entries: dict[str, Node] = {}
        key_lines: dict[str, int] = {}
        index = skip(index + 1)
        while text[index] != closer:
            if opener == "[":
                item, index = parse(index, f"{path}[{len(items)}]")
                items.append(item)
            else:
                key_line = line_at(index)
                key, index = json.decoder.scanstring(text, index + 1)
                if key in entries:
                    raise DocumentError(
                        f"{location(source, key_line, child_path(path, key))}: "
                        f"duplicate key (first at line {key_lines[key]})"
                    )
                entries[key], index = parse(skip(index) + 1, child_path(path, key))
                key_lines[key] = key_line
            index = skip(index)
            if text[index] == ",":
                index = skip(index + 1)
        if opener == "[":
            return Node(items, line), index + 1
        return Node(entries, line, key_lines), index + 1

    return parse(0, "")[0]


def mapping(
    node: Node,
    source: str,
    path: str,
    allowed: Iterable[str],
    refused: Mapping[str, str] | None = None,
) -> dict[str, Node]:
    """The node's entries; raises on a non-mapping or a key outside `allowed`.

    An unknown key is answered with the reason `refused` gives for it, or else with
    the allowed key it most resembles.
    """
    if not isinstance(node.value, dict):
        raise DocumentError(
            f"{location(source, node.line, path)}: {wrong_type(node.value, 'a mapping')}"
        )
    allowed = tuple(allowed)
    for key, line in node.key_lines.items():
        if key in allowed:
            continue
        where = location(source, line, child_path(path, key))
        if refused and key in refused:
            raise DocumentError(f"{where}: {refused[key]}")
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; expected {', '.join(allowed)}"
        raise DocumentError(f"{where}: unknown key{hint}")
    return node.value


def sequence(node: Node, source: str, path: str, expected: str) -> list[Node]:
    """The node's items; raises when it is not a list."""
    if not isinstance(node.value, list):
        raise DocumentError(
            f"{location(source, node.line, path)}: {wrong_type(node.value, expected)}"
        )
    return node.value
