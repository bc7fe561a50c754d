"""A fast, selective parser for the Prometheus text exposition format.

The exporter reads a few families out of payloads of hundreds of samples, every few
seconds, for up to thousands of targets, so it skips every line whose name it does
not want before doing any work on it. It reads what Prometheus reads (the exposition
format, https://prometheus.io/docs/instrumenting/exposition_formats/, and Prometheus's
parser, model/textparse/promparse.go): HELP/TYPE lines with no samples, escaped label
values (`\\\\`, `\\"`, `\\n`), `NaN` and `+Inf`, timestamps (integer milliseconds,
returned as seconds), `_created` series, and quoted UTF-8 metric and label names, both
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

import itertools
import operator
import re
import sys
from collections.abc import Callable, Iterable
from typing import NamedTuple

try:
    # Built from _known_lines.c when the package is installed (pyproject's ext-modules,
    # where a C compiler is); without it, payloads are read by the Python path alone.
    from batchscope.exporter.ingest import _known_lines
except ImportError:  # pragma: no cover - the test environment builds it
    _known_lines = None

# Suffixes a family's samples may carry on the wire (histograms, summaries, counters).
FAMILY_SUFFIXES = ("", "_bucket", "_sum", "_count", "_total", "_created", "_info")

_SIMPLE_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
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

# Label sets repeat across scrapes of the same server; parsing each distinct one once
# keeps the steady-state cost of a scrape low. Bounded so a churning target cannot grow it.
_LABEL_CACHE: dict[str, tuple[str | None, dict[str, str]]] = {}
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


# (position among the found sample lines, name, labels) of each wanted sample of a payload.
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
    """`value` with its escapes read; ValueError on any but `\\\\`, `\\"` and `\\n`."""
    return _ESCAPE_RE.sub(_escaped, value)


def _escaped(match: re.Match[str]) -> str:
    text = _ESCAPES.get(match.group(1))
    if text is None:
        raise ValueError(f'invalid escape {match.group(0)!r} (only \\\\, \\" and \\n)')
    return text


def clear_caches() -> None:
    """Forget the label sets, comment lines and layouts read so far (benchmarks time a first scrape so)."""
    _LABEL_CACHE.clear()
    _METADATA_CACHE.clear()
    for selection in _SELECTIONS.values():
        selection.layouts.clear()
        selection.templates.clear()


def _braces(section: str) -> tuple[str | None, dict[str, str]]:
    """(the quoted metric name in it or None, the labels) of the text between braces."""
    cached = _LABEL_CACHE.get(section)
    if cached is not None:
        return cached
    labels = _parse_simple_labels(section)
    braces = (None, labels) if labels is not None else _parse_labels_strictly(section)
    if "__name__" in braces[1]:
        raise ValueError("a __name__ label (the metric name is not a label)")
    if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX:
        _LABEL_CACHE.clear()
    _LABEL_CACHE[section] = braces
    return braces


def _parse_simple_labels(section: str) -> dict[str, str] | None:
    """The common case, `a="x",b="y"` with no escapes, quoted names or spaces, in one
    regex pass; None when the section is anything else (the pairs found must cover it
    exactly, each name once)."""
    if "\\" in section:
        return None
    pairs = _SIMPLE_LABEL_RE.findall(section)
    covered = sum(len(k) + len(v) + 3 for k, v in pairs) + len(pairs) - 1
    end = len(section)
    if pairs and (covered == end or (covered + 1 == end and section[-1] == ",")):
        labels = dict(pairs)
        return labels if len(labels) == len(pairs) else None
    return None


def _parse_labels_strictly(section: str) -> tuple[str | None, dict[str, str]]:
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
            labels[key] = _unescape(value) if "\\" in value else value
        pos = m.end()
        if comma == "" and pos < end:
            raise ValueError(f"missing comma at offset {pos}")
    return name, labels


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
        value = parts[0]
        if "_" in value:  # inline _parse_number: this is the hot path
            raise ValueError(f"invalid number {value!r}")
        return Sample(name, labels, float(value), None)
    if len(parts) == 2:
        return Sample(name, labels, _parse_number(parts[0]), _parse_timestamp(parts[1]))
    raise ValueError("expected a value and an optional timestamp")


class _Rules:
    """What the lines read so far declare (TYPE, HELP) and hold (sample names), to hold
    each line to the rules that depend on others. `names`: the rules are checked for
    these sample names only (all when None). `seen`: each sample name read, with the
    rule its values follow (`_name_rule`): a TYPE line cannot come after a name's
    samples, so the rule found at its first sample holds for the rest."""

    def __init__(self, names: frozenset[str] | None) -> None:
        self.names = names
        self.types: dict[str, str] = {}
        self.helps: set[str] = set()
        self.seen: dict[str, tuple[bool, str | None]] = {}

    def metadata(self, line: str) -> None:
        """Record a comment line; ValueError when it breaks a rule."""
        read = _METADATA_CACHE.get(line)
        if read is None:
            read = _read_metadata(line)
            if len(_METADATA_CACHE) >= _LABEL_CACHE_MAX:
                _METADATA_CACHE.clear()
            _METADATA_CACHE[line] = read
        if read is _COMMENT:
            return
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

    def sample(self, sample: Sample, rule: tuple[bool, str | None] | None) -> None:
        """Record a sample (`rule`: `seen`'s for its name); ValueError when it breaks a
        rule of its family's type."""
        if rule is None:
            rule = self.seen[sample.name] = _name_rule(sample.name, self.types)
        counted, label = rule
        if counted and sample.value < 0:
            raise ValueError(f"a histogram's {sample.name} cannot be negative")
        if label is not None and label in sample.labels:
            _label_number(label, sample.labels[label])


_NO_RULE = (False, None)
# A comment line that is not HELP or TYPE.
_COMMENT = ("", "", "")
# (HELP or TYPE, the name, the type) of each comment line read: they repeat every scrape.
_METADATA_CACHE: dict[str, tuple[str, str, str]] = {}


def _read_metadata(line: str) -> tuple[str, str, str]:
    """(HELP or TYPE, the name, the type word) of a comment line, or _COMMENT."""
    m = _METADATA_RE.match(line)
    if m is None:
        return _COMMENT  # skipped whatever it says
    keyword, quoted, plain, text = m.groups()
    name = plain if quoted is None else _unescape(quoted)
    if name is None:
        raise ValueError(f"{keyword} without a metric name")
    return keyword, name, (text or "").strip() if keyword == "TYPE" else ""


def _name_rule(name: str, types: dict[str, str]) -> tuple[bool, str | None]:
    """(whether a sample's value cannot be negative, the label that must be a number) of
    a sample name, by its family's declared type."""
    for suffix in _COUNTS:
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
            return True, "le" if suffix == "_bucket" else None
    if types.get(name) == "summary":
        return False, "quantile"
    return _NO_RULE


def _label_number(label: str, text: str) -> None:
    try:
        _parse_number(text)
    except ValueError:
        raise ValueError(f"{label}={text!r} is not a number") from None


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
        lines = text.split("\n")
        # Blank lines dropped in C: the rest is read as a known layout when it is one.
        samples = _read_known_layout(_EVERYTHING, list(filter(None, lines)), limit)
        if samples is not None:
            return samples
        return _parse_lines(((n, line) for n, line in enumerate(lines, 1)), limit)
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


class KnownLayout(NamedTuple):
    """What the found lines of payloads with one set of heads hold besides their values.

    `samples`: the wanted samples (positions among `sample_words`' result);
    `sample_words` and `comment_words` pick the last words of the sample lines and of
    the HELP/TYPE lines out of all the found lines' last words; `comments`: what the
    latter were when the layout was made (a payload with other ones is parsed line by
    line); `counts`: picks the values that cannot be negative (a histogram's counts);
    `heads`: the heads it was made of (the key it is kept under).
    """

    samples: Layout
    sample_words: Callable[[tuple[str, ...]], tuple[str, ...]]
    comment_words: Callable[[tuple[str, ...]], tuple[str, ...]]
    comments: tuple[str, ...]
    counts: Callable[[list[float]], tuple[float, ...]] | None
    heads: tuple[str, ...]


class Selection(NamedTuple):
    """What reading some families out of payloads needs, made once per set of families.

    `lines` finds the lines that may start (after whitespace) with one of the families'
    names, with a quoted name (`{`), or HELP/TYPE lines of them; `at_first_sight`:
    whether a layout is made the first time its heads are seen, or the second. `layouts` holds what the
    lines of a payload say besides their values, by their heads, all before each line's
    last space (see `_layout`): the heads of a server's lines stay the same from scrape to
    scrape while their values move, so a scrape whose heads are known is read by
    turning its values into numbers, and nothing else.

    `known_names` and `templates`: the same read in one pass of C (`_known_lines.c`), for a
    payload whose found lines fit a layout read before: the families' names for its copy
    of `lines` (sorted, ASCII, none a prefix of another; None where a name is not plain
    ASCII, and the C pass is not used), and the templates by the key the C pass gives the
    found lines' heads (`_remember_template`).
    """

    lines: re.Pattern[str] | None
    names: frozenset[str] | None
    layouts: dict[tuple[str, ...], KnownLayout | str | None]
    templates: dict[int, tuple]
    at_first_sight: bool = True
    known_names: tuple[bytes, ...] | None = None


def _selection(families: tuple[str, ...]) -> Selection:
    selection = _SELECTIONS.get(families)
    if selection is None:
        alternatives = _prefix_tree(families)
        lines = re.compile(
            rf'\n([^\S\n]*(?:{alternatives}|\{{|#[^\S\n]+(?:HELP|TYPE)[^\S\n]+"?'
            rf"(?:{alternatives}))[^\n]*)"
        )
        selection = _SELECTIONS[families] = Selection(
            lines, wanted_names(families), {}, {}, known_names=_known_names(families)
        )
    return selection


def _known_names(families: tuple[str, ...]) -> tuple[bytes, ...] | None:
    """The families' names as `_known_lines.read` takes them: sorted, and none that
    another starts (a line starts with some name exactly when it starts with one of
    these). None where the C pass must not be used: no C module, or a name that is not
    printable ASCII without a blank (a newline in a name makes the regex find across
    lines, which the C pass never does) or starts with what the regex reads otherwise
    (`{`, `#`, `"`)."""
    if _known_lines is None or not families:
        return None
    plain = (n.isascii() and n.isprintable() and " " not in n for n in families)
    if not all(plain) or any(name[:1] in ("", "{", "#", '"') for name in families):
        return None
    names = sorted({name.encode() for name in families})
    return tuple(n for n in names if not any(n != m and n.startswith(m) for m in names))


_SELECTIONS: dict[tuple[str, ...], Selection] = {}
# A full parse: every non-blank line, every name wanted. Its layouts are made at the
# second sight of their heads: a payload parsed once (a test, a tool) is read line by
# line, which costs less than making its layout.
_EVERYTHING = _SELECTIONS[()] = Selection(None, None, {}, {}, at_first_sight=False)
# In `layouts`: heads seen once, their layout not made yet.
_SEEN_ONCE = "seen once"


def _prefix_tree(names: Iterable[str]) -> str:
    """A regex matching any of `names` at a position, their shared prefixes factored out
    (`vllm:(?:a|b)`): the regex engine tries the branches one by one, so a line of
    another family fails after one comparison instead of one a name."""
    tree: dict = {}
    for name in names:
        node = tree
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}
    return _branches(tree)


def _branches(node: dict) -> str:
    ends = "" in node
    branches = [re.escape(char) + _branches(rest) for char, rest in node.items() if char]
    if not branches:
        return ""
    if len(branches) == 1 and not ends:
        return branches[0]
    return "(?:" + "|".join(branches) + ")" + ("?" if ends else "")


def read_values(
    text: str, families: Iterable[str], limit: int | None = None
) -> tuple[Layout, list[float]] | None:
    """The layout of the wanted lines of `text` and every found sample line's value, when
    `parse(text, families, limit)` is exactly those values on that layout (sample i of
    the layout, `(position, name, labels)`, has value `values[position]`), and None when
    the text must be parsed as `parse` does. The same layout object comes back for every
    payload with the same line heads."""
    family_tuple = tuple(families)
    if not family_tuple:
        return None
    selection = _selection(family_tuple)
    key = None
    if selection.known_names is not None:
        # The C pass returns what the lines below would: it finds the lines the regex finds
        # (its copy of `lines`, leaving to Python a payload with a non-ASCII byte where the
        # regex reads a blank or a name); a found line fits its template when it is the
        # HELP/TYPE line kept whole, or the head kept, a space, and a value without one, so
        # `str.rpartition` gives the heads of the template's layout; the value is a number
        # as `float()` reads it, with no `_`, and a histogram's count is not negative.
        known = _known_lines.read(text, selection.known_names, selection.templates)
        if known is not None:
            key, layout, values = known
            if layout is not None:
                return None if limit is not None and len(layout) > limit else (layout, values)
    found = selection.lines.findall("\n" + text)
    read = _known_values(selection, found, limit)
    if read is not None and key is not None:
        _remember_template(selection, key, found, read[0])
    return read


def _remember_template(selection: Selection, key: int, found: list[str], samples: Layout) -> None:
    """Keep, under `key`, the template `_known_lines.read` holds the next payloads with
    these found lines to: each HELP/TYPE line whole (kind 0), each sample line's head
    (kind 1, or 2 for a histogram's count), the layout and the number of sample lines.
    Only for lines that `_known_values` just read as the layout `samples`."""
    known = selection.layouts.get(tuple(line.rpartition(" ")[0] for line in found))
    if not isinstance(known, KnownLayout) or known.samples is not samples:
        return
    heads = known.heads  # the layout's own strings: a template costs a tuple and its kinds
    sample_count = len(known.sample_words(heads))
    counts = set(known.counts(range(sample_count))) if known.counts is not None else set()
    expected: list[str] = []
    kinds = bytearray()
    sample = 0
    for line, head in zip(found, heads, strict=True):
        if head[:1] == "#":
            expected.append(sys.intern(line))  # the same HELP/TYPE lines in every target's
            kinds.append(0)
        else:
            expected.append(head)
            kinds.append(2 if sample in counts else 1)
            sample += 1
    templates = selection.templates
    if key not in templates and len(templates) >= _LAYOUTS_MAX:
        templates.clear()
    templates[key] = (tuple(expected), bytes(kinds), samples, sample_count)


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


# 0.0 > value, in C: a negative count (NaN and -0.0 are not).
_NEGATIVE = (0.0).__gt__


def _known_values(
    selection: Selection, lines: list[str], limit: int | None
) -> tuple[Layout, list[float]] | None:
    """The lines' layout and values when their heads make a layout (`_layout`), their
    HELP/TYPE lines are the layout's, every value is a plain number (no `_`, what float()
    reads, blanks around it allowed) and no histogram count is negative; None when the
    lines must be parsed one by one."""
    if not lines:
        return None
    # Each line split at its last space, by map and zip: in C, no Python loop.
    heads, _, words = zip(*map(str.rpartition, lines, itertools.repeat(" ")), strict=True)
    layouts = selection.layouts
    if heads in layouts:
        known = layouts[heads]
        if known is _SEEN_ONCE:
            known = layouts[heads] = _layout(heads, words, selection)
    else:
        if len(layouts) >= _LAYOUTS_MAX:
            layouts.clear()
            # Together: a template stands for a layout in `layouts`, as the lines it was
            # made of read then (the same heads can later read another way, with other
            # HELP/TYPE words, or not at all).
            selection.templates.clear()
        if not selection.at_first_sight:
            layouts[heads] = _SEEN_ONCE
            return None
        known = layouts[heads] = _layout(heads, words, selection)
    # No wanted sample (families registered, none read yet): nothing for a plan to replay.
    if known is None or not known.samples or (limit is not None and len(known.samples) > limit):
        return None
    if known.comment_words(words) != known.comments:
        return None
    values = known.sample_words(words)
    if "_" in "".join(values):  # float() reads 1_000; the exposition format does not
        return None
    try:
        numbers = list(map(float, values))
    except ValueError:
        return None
    counts = known.counts
    # A count without a `-` in its text is not negative: the numbers are looked at only then.
    negative = counts is not None and "-" in "".join(counts(values))
    if negative and any(map(_NEGATIVE, counts(numbers))):
        return None
    return known.samples, numbers


def _picker(positions: list[int]) -> Callable[[tuple | list], tuple]:
    """The items at `positions` of a sequence, as a tuple (itemgetter, in C)."""
    if not positions:
        return lambda _: ()
    if len(positions) == 1:
        (only,) = positions
        return lambda items: (items[only],)
    return operator.itemgetter(*positions)


def _layout(
    heads: tuple[str, ...], words: tuple[str, ...], selection: Selection
) -> KnownLayout | None:
    """What every payload whose found lines have these heads holds besides its values,
    when every line made of these heads, a space and plain values parses as its head
    alone does: each head stands alone (no blank before it, no blank after it) and its
    labels end it, or it has no labels and no space or tab; and its HELP/TYPE lines, as
    they are with these `words`, and its samples with zeros for values, break no rule.
    None otherwise (or when a head is malformed): such lines are parsed one by one, as
    any text."""
    layout = []
    sample_positions: list[int] = []
    comment_positions: list[int] = []
    rules = _Rules(selection.names)
    counts = []
    try:
        for position, head in enumerate(heads):
            if not head:
                return None
            if head[0] == "#":
                comment_positions.append(position)
                rules.metadata(f"{head} {words[position]}")
                continue
            if head.strip() != head:
                return None
            if "{" in head:
                if head[-1] != "}":
                    return None
            elif " " in head or "\t" in head:
                return None
            sample = _parse_line(head + " 0")
            rules.sample(sample, rules.seen.get(sample.name))
            if selection.names is None or sample.name in selection.names:
                layout.append((len(sample_positions), sample.name, sample.labels))
            if rules.seen[sample.name][0]:  # a histogram's count: never negative
                counts.append(len(sample_positions))
            sample_positions.append(position)
    except (ValueError, IndexError):
        return None
    comment_words = _picker(comment_positions)
    return KnownLayout(
        tuple(layout),
        _picker(sample_positions),
        comment_words,
        comment_words(words),
        _picker(counts) if counts else None,
        heads,
    )


def _parse_lines(
    lines: Iterable[tuple[int, str]],
    limit: int | None,
    prefixes: tuple[str, ...] | None = None,
    names: frozenset[str] | None = None,
    line_number: Callable[[int], int] | None = None,
) -> list[Sample]:
    """Parse (position, line) pairs: a line number, or with `line_number` an index it
    turns into one (counted only for an error); with `prefixes`, only lines starting
    with one of them (or with `{`, a quoted name), the rules held for `names` only."""
    samples: list[Sample] = []
    rules = _Rules(names)
    seen = rules.seen
    if prefixes is not None:
        prefixes = (*prefixes, "{")
    for position, line in lines:
        if not line:
            continue
        if line[0] in " \t\r" or line[-1] in " \t\r":
            line = line.strip()
            if not line:
                continue
        try:
            if line[0] == "#":
                rules.metadata(line)
                continue
            if prefixes is not None and not line.startswith(prefixes):
                continue
            sample = _parse_line(line)
            rule = seen.get(sample.name)
            if rule is not _NO_RULE:  # inline: most names have no rule
                rules.sample(sample, rule)
        except (ValueError, IndexError) as err:
            number = position if line_number is None else line_number(position)
            raise ParseError(number, line, str(err)) from None
        if names is None or sample.name in names:
            samples.append(sample)
            if limit is not None and len(samples) > limit:
                raise SampleLimitExceeded(limit)
    return samples
