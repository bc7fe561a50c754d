"""The parser's fuzzing oracle: what `promtext.parse` must do on any text.

It raises nothing but ParseError; it refuses every text that breaks one of the format's
rules (`broken_rule`, written here from the exposition format's specification and
Prometheus's parser, apart from the parser's own code); where both it and
`prometheus_client.parser` read a text, they return the same samples; and on a valid
text (by the format's grammar) that breaks no rule it reads what prometheus_client reads.

Where the oracle follows which: the samples read (names, labels, values, timestamps)
follow prometheus_client. The refusals follow the format and Prometheus, where
prometheus_client is lenient: it reads a negative histogram count, an `le` or `quantile`
that is not a number, a second HELP or TYPE line, a TYPE line after its samples, an
invalid escape (kept literally) and a fractional timestamp (as fractional milliseconds),
all of which `broken_rule` names. It is also more lenient than the grammar (label names
with `:`, `1_000` as a number): those texts the parser may refuse. Shared by the
hypothesis tests and the atheris harness (`scripts/fuzz_parser.py`), so both check one
promise.
"""

from __future__ import annotations

import math
import re

from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.engines import ADAPTERS
from batchscope.exporter.ingest.promtext import ParseError, SampleLimitExceeded, parse, wanted_names

# The families the exporter asks for: the selective path must agree with the full one.
FAMILIES = tuple(f for adapter in ADAPTERS.values() for f in adapter.FAMILIES)
WANTED = wanted_names(FAMILIES)

Key = tuple[str, tuple[tuple[str, str], ...], float | str, float | None]


def _key(name: str, labels: dict[str, str], value: float, timestamp: float | None) -> Key:
    shown = "NaN" if math.isnan(value) else float(value)  # NaN equals itself here, -0 == 0
    # prometheus_client names a counter's samples `_total` whatever the wire said; promtext
    # returns the wire's name: the two agree up to that suffix.
    return name.removesuffix("_total"), tuple(sorted(labels.items())), shown, timestamp


def reference_samples(text: str) -> list[Key] | None:
    """The samples prometheus_client reads from `text`, or None when it refuses it."""
    try:
        return [
            _key(s.name, s.labels, s.value, float(s.timestamp) if s.timestamp is not None else None)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except Exception:  # noqa: BLE001 - the reference refuses in many ways; all mean "invalid"
        return None


def check_parse(text: str, valid: bool = False) -> None:
    """Raise AssertionError when `parse` breaks its promise on `text`; `valid`: the text
    follows the format's grammar, so refusing what prometheus_client reads is a failure
    too, unless the text breaks a rule. Any exception other than ParseError propagates
    as the failure it is."""
    try:
        samples = parse(text)
    except ParseError:
        samples = None
    ours = None if samples is None else [_key(*s) for s in samples]
    _check_selective(text, samples)
    reference = reference_samples(text)
    rule = broken_rule(text)
    assert ours is None or rule is None, f"read {text!r}, which breaks: {rule}"
    if reference is not None and (ours is not None or (valid and rule is None)):
        assert ours == reference, f"differs from prometheus_client on {text!r}"


_METADATA = re.compile(r'#[ \t]+(HELP|TYPE)(?:[ \t]+("(?:[^"\\]|\\.)*"|[^\s"]+))?(?:[ \t]+(.*))?$')
_SAMPLE_NAME = re.compile(r'\s*(?:\{\s*"((?:[^"\\]|\\.)*)"|([^\s{]+))')
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_TYPES = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "untyped": ("",),
}


def broken_rule(text: str) -> str | None:
    """The first rule of the format that `text` breaks, or None. From the exposition
    format's specification: one HELP and one TYPE line a name, TYPE before the name's
    samples, the five types, three label value escapes, integer millisecond timestamps,
    `le` and `quantile` as numbers; from Prometheus: no HELP/TYPE without a name; from
    OpenMetrics: a histogram's `_bucket` and `_count` are never negative."""
    helps: set[str] = set()
    types: dict[str, str] = {}
    seen: set[str] = set()
    for line in (raw.strip() for raw in text.split("\n")):
        if not line:
            continue
        if line.startswith("#"):
            rule = _metadata_rule(line, helps, types, seen)
            if rule:
                return rule
            continue
        name = _SAMPLE_NAME.match(line)
        if name is not None:
            seen.add(_unescape(name.group(1)) if name.group(1) is not None else name.group(2))
        for quoted in _QUOTED.findall(line):
            if re.search(r"\\[^\\\"n]", quoted.replace("\\\\", "")):
                return "an invalid escape"
        words = line[line.rfind("}") + 1 :].split() if "{" in line else line.split()[1:]
        if len(words) == 2 and not re.fullmatch(r"[+-]?[0-9]+", words[1]):
            return "a timestamp that is not whole milliseconds"
    return _sample_rule(text, types)


def _unescape(quoted: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), quoted)


def _metadata_rule(line: str, helps: set[str], types: dict[str, str], seen: set[str]) -> str:
    m = _METADATA.match(line)
    if m is None:
        return ""
    keyword, name, rest = m.groups()
    if name is None:
        return f"{keyword} without a name"
    if name.startswith('"'):
        name = _unescape(name[1:-1])
    if keyword == "HELP":
        if name in helps:
            return "a second HELP line"
        helps.add(name)
        return ""
    kind = (rest or "").strip()
    if name in types:
        return "a second TYPE line"
    if kind not in _TYPES:
        return "an unknown type"
    if any(name + suffix in seen for suffix in _TYPES[kind]):
        return "a TYPE line after its samples"
    types[name] = kind
    return ""


def _sample_rule(text: str, types: dict[str, str]) -> str | None:
    """The rules on a typed family's samples. The type is the TYPE line's for the sample's
    name, as Prometheus reads it; prometheus_client only gives the samples (it starts a
    new family at any HELP line, so a HELP between a TYPE and its samples would hide them)."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:  # noqa: BLE001 - refused by the reference: its rules cannot be read
        return None
    for s in (s for family in families for s in family.samples):
        base = {s.name[: -len(x)]: x for x in ("_bucket", "_count") if s.name.endswith(x)}
        histogram = next((x for b, x in base.items() if types.get(b) == "histogram"), None)
        if histogram is not None and s.value < 0:
            return "a negative histogram count"
        bound = s.labels.get("le") if histogram == "_bucket" else None
        if types.get(s.name) == "summary":
            bound = s.labels.get("quantile")
        if bound is not None and not _number(bound):
            return "an le or quantile that is not a number"
    return None


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return "_" not in text


def _check_selective(text: str, samples: list | None) -> None:
    """Asking for families gives the full parse's samples of those families, and
    never anything but ParseError (or SampleLimitExceeded past its limit)."""
    try:
        selected = parse(text, FAMILIES, limit=10_000)
    except (ParseError, SampleLimitExceeded):
        wanted = [] if samples is None else [s for s in samples if s.name in WANTED]
        assert samples is None or len(wanted) > 10_000, (
            f"the selective parse refused what the full parse read: {text!r}"
        )
        return
    if samples is not None:
        assert selected == [s for s in samples if s.name in WANTED], (
            f"the selective parse differs on {text!r}"
        )
