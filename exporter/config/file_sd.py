"""Prometheus file_sd discovery: which files the patterns name, and the target groups in them.

A file_sd file (JSON, or YAML by extension) is a list of
`{"targets": ["host:port", ...], "labels": {...}}` groups. This module reads them as
they are written, each address and label with where it was written; what the labels
mean for a target (`__scheme__`, `engine`, `cap`...) is the configuration's business,
as Prometheus' discovery hands label sets to its scrape configuration.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from batchscope.exporter.config.line_numbered import (
    DocumentError,
    Node,
    Sourced,
    child_path,
    location,
    mapping,
    read_document,
    sequence,
    wrong_type,
)

_GLOB_CHARS = re.compile(r"[*?[]")
# Prometheus' rule for label names.
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Address:
    """One `host:port` of a group, as written, with its line and key path."""

    text: object
    line: int
    path: str


@dataclass(frozen=True)
class TargetGroup:
    """One group of a file_sd file: its addresses and the labels they share."""

    addresses: tuple[Address, ...]
    labels: dict[str, Sourced]


def expand_file_sd(patterns: Iterable[str]) -> list[Path]:
    """The files the file_sd entries name now: globs expanded (sorted), plain paths as is.

    A glob matching nothing yields nothing (files may appear later); a plain path is
    returned even if missing, so that loading it reports the problem.
    """
    paths: list[Path] = []
    for pattern in patterns:
        if _GLOB_CHARS.search(pattern):
            paths.extend(Path(p) for p in sorted(glob.glob(pattern)))
        else:
            paths.append(Path(pattern))
    return paths


def read_target_groups(path: Path) -> Iterator[TargetGroup]:
    """The groups of one file_sd file, in order; DocumentError names file, line and key."""
    source = str(path)
    root = read_document(path)
    if root is None:
        raise DocumentError(f"{source}:1: the file is empty; expected a list of target groups")
    for i, group in enumerate(sequence(root, source, "", "a list of target groups")):
        entries = mapping(group, source, f"[{i}]", ("targets", "labels"))
        if "targets" not in entries:
            raise DocumentError(
                f"{location(source, group.line, f'[{i}]')}: missing required key 'targets'"
            )
        labels = (
            read_labels(entries["labels"], source, f"[{i}].labels") if "labels" in entries else {}
        )
        hosts = sequence(entries["targets"], source, f"[{i}].targets", "a list of host:port")
        addresses = tuple(
            Address(host.value, host.line, f"[{i}].targets[{j}]") for j, host in enumerate(hosts)
        )
        yield TargetGroup(addresses, labels)


def read_labels(node: Node, source: str, path: str) -> dict[str, Sourced]:
    """Label name -> (value, origin); names as Prometheus allows them, values strings."""
    labels: dict[str, Sourced] = {}
    for name, value in mapping(node, source, path, node.key_lines).items():
        origin = location(source, value.line, child_path(path, name))
        if not _LABEL_NAME.fullmatch(name):
            raise DocumentError(
                f"{origin}: label names are letters, digits and _, not a digit first"
            )
        if not isinstance(value.value, str):
            raise DocumentError(f"{origin}: {wrong_type(value.value, 'a string')}")
        labels[name] = (value.value, origin)
    return labels
