"""The parser's fuzzing oracle: what `promtext.parse` must do on any text.

It raises nothing but ParseError; where both it and `prometheus_client.parser` read a
text, they return the same samples; and on a valid text (by the exposition format's
grammar) it reads what prometheus_client reads. prometheus_client is more lenient than
the format (label names with `:`, `1_000` as a number): those texts it may refuse. Shared by the
hypothesis tests and the atheris harness
(`scripts/fuzz_parser.py`), so both check one promise.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from exporter.engines import ADAPTERS
from exporter.ingest.promtext import ParseError, SampleLimitExceeded, parse, wanted_names

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
    too. Any exception other than ParseError propagates as the failure it is."""
    try:
        samples = parse(text)
    except ParseError:
        samples = None
    ours = None if samples is None else [_key(*s) for s in samples]
    _check_selective(text, samples)
    reference = reference_samples(text)
    if reference is not None and (ours is not None or valid):
        assert ours == reference, f"differs from prometheus_client on {text!r}"


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
