"""A selective parser for the Prometheus text exposition format.

The exporter reads a few families out of payloads of hundreds of samples, so a line
whose name is not one of theirs is skipped by its first characters, before any other
work. It reads what Prometheus reads (the exposition format,
https://prometheus.io/docs/instrumenting/exposition_formats/, and Prometheus's parser,
model/textparse/promparse.go): HELP/TYPE lines with no samples, escaped label values
(`\\\\`, `\\"`, `\\n`), `NaN` and `+Inf`, timestamps (integer milliseconds, returned as
seconds), `_created` series, and quoted UTF-8 metric and label names, both
`{"name.with.dots",a="v"} 1` and `metric{"my.label"="v"} 1` (a family whose name needs
quotes is asked for by its name, unquoted). Sample names are returned unquoted.

It refuses, with the line number and the reason (ParseError), what Prometheus refuses
and what would corrupt a signal: a negative `_count` or `_bucket` of a histogram, an `le`
(histogram) or `quantile` (summary) label that is not a number, a label name given twice,
a `__name__` label, a second HELP or TYPE line for one name, a TYPE line after samples of
its family, an unknown type, a label value escape other than `\\\\`, `\\"` and `\\n`,
and a timestamp that is not a whole number of milliseconds. In a selective parse these
rules hold for the wanted families; other lines are skipped unchecked.

Deliberately more lenient than Prometheus: a payload need not end with a newline, and
a comment that starts with `#` but is not HELP or TYPE is skipped whatever it holds.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import NamedTuple

# Suffixes a family's samples may carry on the wire (histograms, summaries, counters).
FAMILY_SUFFIXES = ("", "_bucket", "_sum", "_count", "_total", "_created", "_info")
# The sample names a family covers, by the type its TYPE line declares.
TYPE_SUFFIXES = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "untyped": ("",),
}
# Counts a histogram cannot have below zero (the format's cumulative bucket counts).
_COUNTS = ("_bucket", "_count")

# A label (plain or quoted name, `=`, quoted value), or a quoted metric name alone.
_LABEL_RE = re.compile(
    r'\s*(?:([a-zA-Z_][a-zA-Z0-9_]*)|"((?:[^"\\]|\\.)*)")'
    r'\s*(?:=\s*"((?:[^"\\]|\\.)*)"\s*)?(,|$)'
)
_ESCAPE_RE = re.compile(r"\\(.?)")
_ESCAPES = {"\\": "\\", "n": "\n", '"': '"'}
# `# HELP name text` or `# TYPE name type`, the name plain or quoted.
_METADATA_RE = re.compile(
    r'#[ \t]+(HELP|TYPE)(?:[ \t]+(?:"((?:[^"\\]|\\.)*)"|([^\s"]+)))?(?:[ \t]+(.*))?$'
)


class Sample(NamedTuple):
    """One sample line. `labels` is shared between the lines of equal heads: do not mutate it."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None


# A payload's samples by their name (`by_name`), as adapters read them.
SamplesByName = Mapping[str, list[Sample]]


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
    `_created` samples. Raises ParseError on a malformed line of a wanted family, or
    one that breaks a rule of the format (see the module's docstring); lines of other
    families are skipped without being checked.
    """
    if families is None:
        names = None
        lines = text.split("\n")
        number_of = _one_based
    else:
        family_tuple = tuple(families)
        if not family_tuple:
            return []
        names, finder = _selection(family_tuple)
        lines = finder.findall("\n" + text)
        number_of = functools.partial(_line_number, text, finder)
    rules = _Rules(names)
    samples: list[Sample] = []
    for index, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            if line[0] == "#":
                rules.metadata(line)
                continue
            head, _, value = line.rpartition(" ")
            read = _head(head)
            if read is None:  # a timestamp, a tab, or a line to refuse: read it in full
                sample = _parse_line(line)
            else:
                sample = Sample(read[0], read[1], _parse_number(value), None)
            rules.sample(sample)
        except (ValueError, IndexError) as err:
            raise ParseError(number_of(index), line, str(err)) from None
        if names is None or sample.name in names:
            samples.append(sample)
            if limit is not None and len(samples) > limit:
                raise SampleLimitExceeded(limit)
    return samples


def by_name(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    """Samples by their name, in order: adapters then read each name without a rescan."""
    grouped: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        grouped[sample.name].append(sample)
    return dict(grouped)


def _one_based(index: int) -> int:
    return index + 1


@functools.cache
def _selection(families: tuple[str, ...]) -> tuple[frozenset[str], re.Pattern[str]]:
    """The families' sample names, and a regex over "\\n" + text whose matches are the lines
    a selective parse reads: those that start (after blanks) with a family's name or `{`
    (a quoted name), and the HELP and TYPE lines of a family's name. The other lines of a
    payload, most of them, are skipped by the regex engine, without a step of Python each."""
    names = _prefix_tree(families)
    return wanted_names(families), re.compile(
        rf'\n([^\S\n]*(?:{names}|\{{|#[^\S\n]+(?:HELP|TYPE)[^\S\n]+"?(?:{names}))[^\n]*)'
    )


def _prefix_tree(names: Iterable[str]) -> str:
    """A regex matching any of `names`, their shared prefixes factored out (`vllm:(?:a|b)`):
    the regex engine tries branches one by one, so a line of another family fails after a
    comparison or two, not one a name."""
    tree: dict = {}
    for name in names:
        node = tree
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}
    return _branches(tree)


def _branches(node: dict) -> str:
    branches = [re.escape(char) + _branches(rest) for char, rest in node.items() if char]
    if not branches:
        return ""
    if len(branches) == 1 and "" not in node:
        return branches[0]
    return "(?:" + "|".join(branches) + ")" + ("?" if "" in node else "")


def _line_number(text: str, finder: re.Pattern[str], index: int) -> int:
    """The line number of the `index`th line `finder` finds (only for an error message)."""
    match = next(itertools.islice(finder.finditer("\n" + text), index, None))
    return text.count("\n", 0, match.start()) + 1


def _parse_line(line: str) -> Sample:
    """One sample line, stripped; ValueError when it is malformed."""
    brace = line.find("{")
    if brace == -1:
        name, _, rest = line.replace("\t", " ").partition(" ")
        labels: dict[str, str] = {}
    else:
        close = line.rfind("}")
        if close < brace:
            raise ValueError("unclosed label set")
        name = line[:brace].rstrip()
        quoted, labels = _braces(line[brace + 1 : close])
        if quoted is not None:
            if name:
                raise ValueError("a metric name both before and inside the braces")
            name = quoted
        rest = line[close + 1 :]
    if not name:
        raise ValueError("missing metric name")
    if name[0] == '"':  # the format quotes a name only inside the braces
        raise ValueError(f"a quoted metric name outside the braces: {name!r}")
    parts = rest.split()
    if len(parts) == 1:
        return Sample(name, labels, _parse_number(parts[0]), None)
    if len(parts) == 2:
        return Sample(name, labels, _parse_number(parts[0]), _parse_timestamp(parts[1]))
    raise ValueError("expected a value and an optional timestamp")


# A server repeats its sample lines' heads (name and labels) at every scrape, only the
# values move: each distinct head is read once while it stays among the most recent (its
# labels dict is then shared between samples). A vLLM target has about 100: this holds
# those of 2,500 targets whose labels all differ, and a target whose heads churn cannot
# grow it.
@functools.lru_cache(maxsize=262_144)
def _head(head: str) -> tuple[str, dict[str, str]] | None:
    """(name, labels) of a sample line's head: the line before its value, read as
    `_parse_line` reads a line; None unless the head is a name and its labels alone."""
    try:
        sample = _parse_line(head + " 0")
    except (ValueError, IndexError):
        return None
    return None if sample.timestamp is not None else (sample.name, sample.labels)


def _braces(section: str) -> tuple[str | None, dict[str, str]]:
    """(the quoted metric name between the braces or None, the labels); ValueError when
    the section is malformed."""
    name = None
    labels: dict[str, str] = {}
    pos = 0
    end = len(section)
    while pos < end:
        m = _LABEL_RE.match(section, pos)
        if m is None:
            if section[pos:].strip() == "":
                break
            raise ValueError(f"malformed label at offset {pos}")
        plain, quoted, value, comma = m.groups()
        key = plain if quoted is None else _unescape(quoted)
        if value is None:  # a quoted string alone is the metric name (promparse.go)
            if quoted is None:
                raise ValueError(f"malformed label at offset {pos}")
            if name is not None:
                raise ValueError("a second metric name among the labels")
            name = key
        elif key in labels:
            raise ValueError(f"label {key!r} given twice")
        else:
            labels[key] = _unescape(value)
        pos = m.end()
        if comma == "" and pos < end:
            raise ValueError(f"missing comma at offset {pos}")
    if "__name__" in labels:
        raise ValueError("a __name__ label (the metric name is not a label)")
    return name, labels


def _unescape(value: str) -> str:
    """`value` with its escapes read; ValueError on any but `\\\\`, `\\"` and `\\n`."""
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(_escaped, value)


def _escaped(match: re.Match[str]) -> str:
    text = _ESCAPES.get(match.group(1))
    if text is None:
        raise ValueError(f'invalid escape {match.group(0)!r} (only \\\\, \\" and \\n)')
    return text


def _parse_number(text: str) -> float:
    if "_" in text:  # float() accepts 1_000; the exposition format does not
        raise ValueError(f"invalid number {text!r}")
    return float(text)


def _parse_timestamp(text: str) -> float:
    """Seconds of a timestamp in whole milliseconds, as Prometheus reads it (an int64:
    promparse.go's ParseInt); a fractional or exponent form is refused."""
    digits = text[1:] if text[0] in "+-" else text
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(f"timestamp {text!r} is not a whole number of milliseconds")
    return int(text) / 1000


class _Rules:
    """What the lines read so far declare (TYPE, HELP) and hold (sample names), to hold
    each line to the rules that depend on others.

    `names`: the sample names the rules are checked for (all when None). `seen`: each
    sample name read, with the rule its values follow (`_name_rule`): a TYPE line cannot come after
    a name's samples, so the rule found at its first sample holds for the rest.
    """

    def __init__(self, names: frozenset[str] | None) -> None:
        self.names = names
        self.types: dict[str, str] = {}
        self.helps: set[str] = set()
        self.seen: dict[str, tuple[bool, str | None]] = {}

    def metadata(self, line: str) -> None:
        """Record a comment line; ValueError when it breaks a rule."""
        read = _metadata(line)
        if read is None:
            return  # another comment, skipped whatever it says
        keyword, name, kind = read
        if self.names is not None and name not in self.names:
            return
        if keyword == "HELP":
            if name in self.helps:
                raise ValueError(f"a second HELP line for {name!r}")
            self.helps.add(name)
            return
        if name in self.types:
            raise ValueError(f"a second TYPE line for {name!r}")
        if kind not in TYPE_SUFFIXES:
            raise ValueError(f"unknown type {kind!r} (one of {', '.join(TYPE_SUFFIXES)})")
        early = [name + s for s in TYPE_SUFFIXES[kind] if name + s in self.seen]
        if early:
            raise ValueError(f"TYPE line for {name!r} after its sample {early[0]!r}")
        self.types[name] = kind

    def sample(self, sample: Sample) -> None:
        """Record a sample; ValueError when it breaks a rule of its family's type."""
        rule = self.seen.get(sample.name)
        if rule is None:
            rule = self.seen[sample.name] = _name_rule(sample.name, self.types)
        counted, label = rule
        if counted and sample.value < 0:
            raise ValueError(f"a histogram's {sample.name} cannot be negative")
        if label is not None and label in sample.labels:
            try:
                _parse_number(sample.labels[label])
            except ValueError:
                raise ValueError(f"{label}={sample.labels[label]!r} is not a number") from None


@functools.lru_cache(maxsize=65_536)
def _metadata(line: str) -> tuple[str, str, str] | None:
    """(HELP or TYPE, the name, the type word) of a comment line, None for another comment;
    ValueError for HELP or TYPE without a name. A server repeats them at every scrape."""
    m = _METADATA_RE.match(line)
    if m is None:
        return None
    keyword, quoted, plain, kind = m.groups()
    name = plain if quoted is None else _unescape(quoted)
    if name is None:
        raise ValueError(f"{keyword} without a metric name")
    return keyword, name, (kind or "").strip()


def _name_rule(name: str, types: dict[str, str]) -> tuple[bool, str | None]:
    """(whether a sample's value cannot be negative, the label that must be a number) of
    a sample name, by its family's declared type."""
    for suffix in _COUNTS:
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
            return True, "le" if suffix == "_bucket" else None
    if types.get(name) == "summary":
        return False, "quantile"
    return False, None
