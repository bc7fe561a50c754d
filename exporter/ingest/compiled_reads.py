"""Plans: what an adapter does with a payload layout, compiled once, replayed per scrape.

A server's payload keeps its layout (the same lines, in the same order, with the same
labels) from scrape to scrape while its values move, and an adapter's work on it
(grouping by series, assembling histograms, building snapshots) depends on the labels
only, except for the values' arithmetic. So the adapter runs once on the layout with
each value replaced by a `Traced` stand-in that records the arithmetic done on it; its
result is turned into the source of one function of the values, which builds the same
objects by the same float operations in the same order, and nothing else.

A stand-in refuses (raises `Untraceable`) every use that could steer the adapter by
value: comparisons, truth, hashing, conversions, division. The one use it cannot
intercept is a C function reading it as a float (`math.isfinite`, `math.isnan`): every
stand-in reads as 1.0 there, so a plan is only used on values that are all finite, where
those functions answer as they did for 1.0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from batchscope.exporter.ingest.promtext import Layout, Sample


class Untraceable(Exception):
    """The adapter used a value in a way a plan cannot replay."""


class Traced(float):
    """A value of the layout (`index` into the scrape's values) or arithmetic on values."""

    def __new__(cls, source: str) -> Traced:
        traced = super().__new__(cls, 1.0)
        traced.source = source
        return traced

    def _operation(self, symbol: str, left: Any, right: Any) -> Traced:
        if not isinstance(left, int | float) or not isinstance(right, int | float):
            return NotImplemented
        return Traced(f"({_source_of(left)} {symbol} {_source_of(right)})")

    def __add__(self, other: Any) -> Traced:
        return self._operation("+", self, other)

    def __radd__(self, other: Any) -> Traced:
        return self._operation("+", other, self)

    def __sub__(self, other: Any) -> Traced:
        return self._operation("-", self, other)

    def __rsub__(self, other: Any) -> Traced:
        return self._operation("-", other, self)

    def __mul__(self, other: Any) -> Traced:
        return self._operation("*", self, other)

    def __rmul__(self, other: Any) -> Traced:
        return self._operation("*", other, self)

    def _refuse(self, *_: Any) -> Any:
        raise Untraceable("a value steers the adapter")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __bool__ = __hash__ = __int__ = __float__ = __index__ = __round__ = _refuse
    __trunc__ = __floor__ = __ceil__ = __neg__ = __pos__ = __abs__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _refuse
    __mod__ = __rmod__ = __divmod__ = __rdivmod__ = __pow__ = __rpow__ = _refuse
    __repr__ = __str__ = __format__ = _refuse


def _source_of(number: int | float) -> str:
    if isinstance(number, Traced):
        return number.source
    if type(number) not in (int, float):
        raise Untraceable(f"a value mixed with a {type(number).__name__}")
    # repr reads back as the same number (sign of zero included); inf and nan do not.
    if number != number or number in (float("inf"), float("-inf")):
        raise Untraceable("a value mixed with a non-finite constant")
    return f"({number!r})"


Plan = Callable[[list[float]], Any]


def compile_plan(layout: Layout, read: Callable[[list[Sample]], Any]) -> Plan | None:
    """A function of a scrape's values (`promtext.read_values`) that returns what
    `read` returns for the samples of `layout` with those values, when they are all
    finite; None when `read` cannot be traced on this layout (or raises on it)."""
    samples = [Sample(name, labels, Traced(f"v[{i}]"), None) for i, name, labels in layout]
    constants: dict[str, Any] = {}
    try:
        source = _build(read(samples), constants)
    except Exception:  # whatever stops tracing leaves the layout to the general path
        return None
    code = f"def plan(v):\n    return {source}\n"
    namespace = dict(constants)
    exec(compile(code, "<series plan>", "exec"), namespace)  # the source is built above
    return namespace["plan"]


_IMMUTABLE = (str, int, float, bool, type(None))


def _build(value: Any, constants: dict[str, Any]) -> str:
    """Source that builds `value` anew, its traced numbers computed from `v`."""
    if isinstance(value, Traced):
        return value.source
    if isinstance(value, _IMMUTABLE) or (isinstance(value, tuple) and _frozen(value)):
        name = f"c{len(constants)}"
        constants[name] = value
        return name
    if type(value) is tuple:
        return "(" + "".join(_build(item, constants) + ", " for item in value) + ")"
    if type(value) is list:
        return "[" + ", ".join(_build(item, constants) for item in value) + "]"
    if type(value) is dict:
        return (
            "{"
            + ", ".join(f"{_build(k, constants)}: {_build(v, constants)}" for k, v in value.items())
            + "}"
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        if not all(f.init for f in fields):
            raise Untraceable(f"{type(value).__name__} has fields its __init__ does not take")
        cls = f"c{len(constants)}"
        constants[cls] = type(value)
        args = ", ".join(_build(getattr(value, f.name), constants) for f in fields)
        return f"{cls}({args})"
    raise Untraceable(f"a {type(value).__name__} in the adapter's result")


def _frozen(value: tuple) -> bool:
    """A tuple of immutable plain values, nested: safe to share between scrapes."""
    return all(
        (isinstance(item, _IMMUTABLE) and not isinstance(item, Traced))
        or (isinstance(item, tuple) and _frozen(item))
        for item in value
    )
