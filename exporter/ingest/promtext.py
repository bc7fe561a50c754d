"""A fast, selective parser for the Prometheus text exposition format.

The exporter reads a few families out of payloads of hundreds of samples, every few
seconds, for up to thousands of targets, so it skips every line whose name it does
not want before doing any work on it. It accepts what `prometheus_client.parser`
accepts on real payloads: HELP/TYPE lines with no samples, escaped label values
(`\\\\`, `\\"`, `\\n`), `NaN` and `+Inf`, timestamps (milliseconds, returned as
seconds), and `_created` series. Sample names are returned as they are on the wire.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

# Suffixes a family's samples may carry on the wire (histograms, summaries, counters).
FAMILY_SUFFIXES = ("", "_bucket", "_sum", "_count", "_total", "_created", "_info")

_SIMPLE_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPE_RE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", "n": "\n", '"': '"'}

# Label sets repeat across scrapes of the same server; parsing each distinct one once
# keeps the steady-state cost of a scrape low. Bounded so a churning target cannot grow it.
_LABEL_CACHE: dict[str, dict[str, str]] = {}
_LABEL_CACHE_MAX = 200_000
# Layouts kept per set of families (see `Selection`): one per server in a steady fleet;
# a target whose label sets churn adds one per scrape, so the bound keeps the worst case
# (about 15 KB a layout of the vLLM payload) near the label cache's.
_LAYOUTS_MAX = 4_096


class Sample(NamedTuple):
    """One sample line. `labels` is shared between equal label sets: do not mutate it."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None


# (position among the found lines, name, labels) of each wanted sample of a payload.
Layout = tuple[tuple[int, str, dict[str, str]], ...]

# Sample(...) runs NamedTuple's __new__, a Python function: reading a known layout builds
# its samples with tuple.__new__ directly, which makes the same object in C.
_new_sample = tuple.__new__


class SampleLimitExceeded(ValueError):
    """More wanted samples than the caller's limit: parsing stopped there."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} samples of the engine's metrics (sample_limit)")
        self.limit = limit


class ParseError(ValueError):
    """A line that is not valid exposition format, with its 1-based line number."""

    def __init__(self, line_number: int, line: str, reason: str) -> None:
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"line {line_number}: {reason}: {shown!r}")
        self.line_number = line_number


def _unescape(value: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def clear_caches() -> None:
    """Forget the label sets and layouts read so far (benchmarks time a first scrape so)."""
    _LABEL_CACHE.clear()
    for selection in _SELECTIONS.values():
        selection.layouts.clear()


def parse_labels(section: str) -> dict[str, str]:
    """Parse the text between `{` and `}`; raises ValueError when it is malformed."""
    cached = _LABEL_CACHE.get(section)
    if cached is not None:
        return cached
    labels = _parse_simple_labels(section)
    if labels is None:
        labels = _parse_labels_strictly(section)
    if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX:
        _LABEL_CACHE.clear()
    _LABEL_CACHE[section] = labels
    return labels


def _parse_simple_labels(section: str) -> dict[str, str] | None:
    """The common case, `a="x",b="y"` with no escapes or spaces, in one regex pass;
    None when the section is anything else (the pairs found must cover it exactly)."""
    if "\\" in section:
        return None
    pairs = _SIMPLE_LABEL_RE.findall(section)
    covered = sum(len(k) + len(v) + 3 for k, v in pairs) + len(pairs) - 1
    end = len(section)
    if pairs and (covered == end or (covered + 1 == end and section[-1] == ",")):
        return dict(pairs)
    return None


def _parse_labels_strictly(section: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    end = len(section)
    while pos < end:
        m = _LABEL_RE.match(section, pos)
        if m is None:
            if section[pos:].strip() == "":
                break
            raise ValueError(f"malformed label at offset {pos}")
        value = m.group(2)
        labels[m.group(1)] = _unescape(value) if "\\" in value else value
        pos = m.end()
        if m.group(3) == "" and pos < end:
            raise ValueError(f"missing comma at offset {pos}")
    return labels


def _parse_number(text: str) -> float:
    if "_" in text:  # float() accepts 1_000; the exposition format does not
        raise ValueError(f"invalid number {text!r}")
    return float(text)


def _parse_line(line: str) -> Sample:
    brace = line.find("{")
    if brace == -1:
        name, _, rest = line.replace("\t", " ").partition(" ")
        labels: dict[str, str] = {}
    else:
        close = line.rfind("}")
        if close < brace:
            raise ValueError("unclosed label set")
        name = line[:brace].rstrip()
        labels = parse_labels(line[brace + 1 : close])
        rest = line[close + 1 :]
    if not name:
        raise ValueError("missing metric name")
    parts = rest.split()
    if len(parts) == 1:
        value = parts[0]
        if "_" in value:  # inline _parse_number: this is the hot path
            raise ValueError(f"invalid number {value!r}")
        return Sample(name, labels, float(value), None)
    if len(parts) == 2:
        return Sample(name, labels, _parse_number(parts[0]), _parse_number(parts[1]) / 1000)
    raise ValueError("expected a value and an optional timestamp")


def wanted_names(families: Iterable[str]) -> frozenset[str]:
    """Every sample name that belongs to the given families."""
    return frozenset(f + suffix for f in families for suffix in FAMILY_SUFFIXES)


def parse(
    text: str, families: Iterable[str] | None = None, limit: int | None = None
) -> list[Sample]:
    """The samples of `text`, in order; only those of `families` when given.

    `limit`: raise SampleLimitExceeded as soon as more samples than this are wanted.
    A family name matches its samples with any of FAMILY_SUFFIXES, so asking for
    `vllm:e2e_request_latency_seconds` returns its `_bucket`, `_sum`, `_count` and
    `_created` samples. Raises ParseError on a malformed line of a wanted family;
    lines of other families are skipped without being checked.
    """
    if families is None:
        return _parse_lines(((n, line) for n, line in enumerate(text.split("\n"), 1)), limit)
    family_tuple = tuple(families)
    if not family_tuple:
        return []
    selection = _selection(family_tuple)
    # The wanted lines are found in C, by one regex over the text: a payload's other
    # lines (most of them) cost no Python work at all.
    # Searching from each "\n" lets the regex engine skip to line starts at C speed.
    found = selection.lines.findall("\n" + text)
    samples = _read_known_layout(selection, found, limit)
    if samples is not None:
        return samples
    lines = enumerate(found)

    def line_number(index: int) -> int:
        match = next(itertools.islice(selection.lines.finditer("\n" + text), index, None))
        return text.count("\n", 0, match.start()) + 1

    return _parse_lines(lines, limit, family_tuple, selection.names, line_number)


class Selection(NamedTuple):
    """What reading some families out of payloads needs, made once per set of families.

    `lines` finds the lines that may start (after whitespace) with one of the families'
    names. `layouts` holds what the lines of a payload say besides their values, by
    their heads, all before each line's last space (see `_layout`): the heads of a
    server's lines stay the same from scrape to
    scrape while their values move, so a scrape whose heads are known is read by
    turning its values into numbers, and nothing else.
    """

    lines: re.Pattern[str]
    names: frozenset[str]
    layouts: dict[tuple[str, ...], Layout | None]


def _selection(families: tuple[str, ...]) -> Selection:
    selection = _SELECTIONS.get(families)
    if selection is None:
        alternatives = "|".join(re.escape(f) for f in families)
        lines = re.compile(rf"\n([^\S\n]*(?:{alternatives})[^\n]*)")
        selection = _SELECTIONS[families] = Selection(lines, wanted_names(families), {})
    return selection


_SELECTIONS: dict[tuple[str, ...], Selection] = {}


def read_values(
    text: str, families: Iterable[str], limit: int | None = None
) -> tuple[Layout, list[float]] | None:
    """The layout of the wanted lines of `text` and every found line's value, when
    `parse(text, families, limit)` is exactly those values on that layout (sample i of
    the layout, `(position, name, labels)`, has value `values[position]`), and None when
    the text must be parsed as `parse` does. The same layout object comes back for every
    payload with the same line heads."""
    family_tuple = tuple(families)
    if not family_tuple:
        return None
    selection = _selection(family_tuple)
    return _known_values(selection, selection.lines.findall("\n" + text), limit)


def _read_known_layout(
    selection: Selection, lines: list[str], limit: int | None
) -> list[Sample] | None:
    """The wanted samples of the lines when `_known_values` reads them; else None."""
    known = _known_values(selection, lines, limit)
    if known is None:
        return None
    return samples_of(*known)


def samples_of(layout: Layout, values: list[float]) -> list[Sample]:
    """The samples `read_values` stands for: each of the layout's with its value."""
    return [_new_sample(Sample, (name, labels, values[i], None)) for i, name, labels in layout]


def _known_values(
    selection: Selection, lines: list[str], limit: int | None
) -> tuple[Layout, list[float]] | None:
    """The lines' layout and values when their heads make a layout (`_layout`) and
    every value is a plain number (no `_`, what float() reads, blanks around it
    allowed); None when the lines must be parsed one by one."""
    if not lines:
        return None
    # Each line split at its last space, by map and zip: in C, no Python loop.
    heads, _, values = zip(*map(str.rpartition, lines, itertools.repeat(" ")), strict=True)
    layouts = selection.layouts
    if heads in layouts:
        layout = layouts[heads]
    else:
        if len(layouts) >= _LAYOUTS_MAX:
            layouts.clear()
        layout = layouts[heads] = _layout(heads, selection.names)
    if layout is None or (limit is not None and len(layout) > limit):
        return None
    if "_" in "".join(values):  # float() reads 1_000; the exposition format does not
        return None
    try:
        return layout, list(map(float, values))
    except ValueError:
        return None


def _layout(heads: tuple[str, ...], names: frozenset[str]) -> Layout | None:
    """(position, name, labels) of each head whose sample is wanted, when every line made
    of these heads, a space and plain values parses as its head alone does: each head
    stands alone (no blank or `#` before it, no blank after it) and its labels end it,
    or it has no labels and no space or tab. None otherwise (or when a head is
    malformed): such lines are parsed one by one, as any text."""
    layout = []
    for position, head in enumerate(heads):
        if not head or head[0] == "#" or head.strip() != head:
            return None
        if "{" in head:
            if head[-1] != "}":
                return None
        elif " " in head or "\t" in head:
            return None
        try:
            name, labels, _, _ = _parse_line(head + " 0")
        except (ValueError, IndexError):
            return None
        if name in names:
            layout.append((position, name, labels))
    return tuple(layout)


def _parse_lines(
    lines: Iterable[tuple[int, str]],
    limit: int | None,
    prefixes: tuple[str, ...] | None = None,
    names: frozenset[str] | None = None,
    line_number: Callable[[int], int] | None = None,
) -> list[Sample]:
    """Parse (position, line) pairs: a line number, or with `line_number` an index it
    turns into one (counted only for an error); with `prefixes`, only lines starting
    with one of them."""
    samples: list[Sample] = []
    for position, line in lines:
        if not line or line[0] == "#":
            continue
        if line[0] in " \t\r" or line[-1] in " \t\r":
            line = line.strip()
            if not line or line[0] == "#":
                continue
        if prefixes is not None and not line.startswith(prefixes):
            continue
        try:
            sample = _parse_line(line)
        except (ValueError, IndexError) as err:
            number = position if line_number is None else line_number(position)
            raise ParseError(number, line, str(err)) from None
        if names is None or sample.name in names:
            samples.append(sample)
            if limit is not None and len(samples) > limit:
                raise SampleLimitExceeded(limit)
    return samples
