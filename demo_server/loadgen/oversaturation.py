"""Over-saturation: a step in which the server clearly cannot keep up. Pure: samples in,
a `Saturation` verdict out.

The load generator samples, once a second, the requests in flight (sent, not answered)
and the age of the oldest of them (how long it has waited since its scheduled time).
A server that keeps up holds both level; one that cannot grows both, the queue by the
arrivals it does not serve. The rule, over the step's samples after its warm-up:
- at least MIN_SAMPLES samples spanning at least MIN_SECONDS;
- in flight grows (least-squares slope) by at least IN_FLIGHT_GROWTH_SHARE of the
  offered rate per second: at least 1 arrival in 10 is not being served;
- the oldest wait grows by at least WAIT_GROWTH seconds per second, and by at least
  MIN_WAIT_RISE_S over the samples (the fit's rise): a few slow requests at a low rate
  lengthen the wait by a fraction of a second, a queue that is not served by seconds;
- both fits explain at least MIN_R_SQUARED of their samples' variance: growth, not noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_SAMPLES = 6
MIN_SECONDS = 5.0
IN_FLIGHT_GROWTH_SHARE = 0.10
WAIT_GROWTH = 0.10
MIN_WAIT_RISE_S = 1.0
MIN_R_SQUARED = 0.7


@dataclass(frozen=True, slots=True)
class QueueSample:
    """At time `t` (s): requests in flight and the oldest one's wait (s; 0 when none)."""

    t: float
    in_flight: float
    oldest_wait_s: float


@dataclass(frozen=True, slots=True)
class Fit:
    """A least-squares line: its slope (per second) and the share of variance it explains
    (1.0 for samples that do not vary: a flat line explains them)."""

    slope: float
    r_squared: float


@dataclass(frozen=True, slots=True)
class Saturation:
    """The verdict over a step's samples: over-saturated or not, the two fits (None with
    too few samples), and why, in words."""

    over: bool
    in_flight: Fit | None
    oldest_wait: Fit | None
    reason: str


def linear_fit(ts: Sequence[float], values: Sequence[float]) -> Fit:
    """The least-squares line through (t, value); needs two distinct times."""
    n = len(ts)
    mean_t = sum(ts) / n
    mean_v = sum(values) / n
    var_t = sum((t - mean_t) ** 2 for t in ts)
    if var_t == 0:
        raise ValueError("a fit needs samples at two distinct times")
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(ts, values, strict=True))
    slope = cov / var_t
    var_v = sum((v - mean_v) ** 2 for v in values)
    if var_v == 0:
        return Fit(slope, 1.0)
    return Fit(slope, (cov * cov) / (var_t * var_v))


def over_saturation(samples: Sequence[QueueSample], offered_rate: float) -> Saturation:
    """Whether the step's samples (after its warm-up, oldest first) show a server that
    cannot keep up with `offered_rate` (requests/s), by the module's rule."""
    span = samples[-1].t - samples[0].t if samples else 0.0
    if len(samples) < MIN_SAMPLES or span < MIN_SECONDS:
        return Saturation(False, None, None, f"{len(samples)} samples over {span:.1f} s: too few")
    ts = [s.t for s in samples]
    in_flight = linear_fit(ts, [s.in_flight for s in samples])
    wait = linear_fit(ts, [s.oldest_wait_s for s in samples])
    needed = IN_FLIGHT_GROWTH_SHARE * offered_rate
    queue_grows = in_flight.slope >= needed and in_flight.r_squared >= MIN_R_SQUARED
    wait_grows = (
        wait.slope >= WAIT_GROWTH
        and wait.slope * span >= MIN_WAIT_RISE_S
        and wait.r_squared >= MIN_R_SQUARED
    )
    reason = (
        f"in flight {in_flight.slope:+.2f}/s (R² {in_flight.r_squared:.2f}; over-saturated from "
        f"{needed:.2f}/s), oldest wait {wait.slope:+.3f} s/s (R² {wait.r_squared:.2f}; from "
        f"{WAIT_GROWTH:g} s/s and a {MIN_WAIT_RISE_S:g} s rise) over {span:.0f} s"
    )
    return Saturation(queue_grows and wait_grows, in_flight, wait, reason)
