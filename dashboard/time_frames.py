"""Which time frame each number on the Live page reads, in words: pure, from the
exporter's `evaluation` object and a series' own window.

One evaluation holds numbers of three frames: the last scrape (waiting, the KV cache),
the last few scrapes (the running batch the diagnosis judges: their peak) and the window
(rates, latency, budget used, the advice). A box that shows numbers of one frame says
which; where two boxes judge the same thing, they read the same number.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchscope.dashboard.formatting import plain_markdown
from batchscope.exporter.core.reading import RECENT_SCRAPES
from batchscope.exporter.core.units import percent_text, seconds_text


@dataclass(frozen=True, slots=True)
class TimeFrames:
    """The exporter's time frames (None: an exporter that does not state them)."""

    interval_seconds: float | None = None
    window_seconds: float | None = None
    hold_seconds: float | None = None
    saturation_threshold: float | None = None

    @classmethod
    def of(cls, doc: dict) -> TimeFrames:
        """The frames stated by a signals (or summary) body."""
        evaluation = doc.get("evaluation") or {}
        return cls(
            evaluation.get("interval_seconds"),
            evaluation.get("window_seconds"),
            evaluation.get("hold_seconds"),
            evaluation.get("saturation_threshold"),
        )

    def window(self, series: dict | None = None) -> str:
        """ "the last 20 s": the series' own measured span where known, else the configured
        window."""
        seconds = (series or {}).get("window_seconds") or self.window_seconds
        return f"the last {seconds_text(seconds)}" if seconds else "the window"

    def peak(self) -> str:
        """How the judged running batch is read."""
        span = (
            f", {seconds_text(RECENT_SCRAPES * self.interval_seconds)}"
            if self.interval_seconds
            else ""
        )
        return f"the peak of the last {RECENT_SCRAPES} scrapes{span}"

    def saturation(self) -> str:
        """When utilisation counts as saturated: "at or above 95% for 60 s"."""
        if self.saturation_threshold is None or self.hold_seconds is None:
            return "at or above the threshold for the hold time"
        return (
            f"at or above {percent_text(self.saturation_threshold)} for "
            f"{seconds_text(self.hold_seconds)}"
        )

    def diagnosis(self, series: dict) -> str:
        """What one diagnosis read, frame by frame."""
        return (
            f"Judged from one evaluation: the running batch as {self.peak()}; the queue and "
            f"the KV cache at the last scrape; preemptions and latency over "
            f"{self.window(series)}; saturation once utilisation stays {self.saturation()}."
        )

    def fleet(self) -> str:
        """What the fleet table's columns read."""
        return (
            f"Diagnosis and running: {self.peak()}, as the diagnosis judges it. Waiting and "
            f"KV cache: the last scrape. Preemptions/s and budget used: over {self.window()}. "
            f"At threshold: how long budget used has stayed at or above the threshold "
            f"(saturated {self.saturation()}). A dash: not exposed by the engine, or not "
            "known yet (no traffic in the window, no cap or budget configured)."
        )


def banner_text(target: dict, frames: TimeFrames) -> str:
    """The alert Terrane's "Dynamic batching: more throughput without wrecking the tail"
    asks for when a target's budget stays saturated: its name, then `banner_reason`."""
    name = plain_markdown(target.get("target", ""))
    return f"**Budget saturated: {name}**. {banner_reason(target, frames)}"


def banner_reason(target: dict, frames: TimeFrames) -> str:
    """Why a target's budget stays saturated: the diagnosis' own words where it was read
    now, so the banner and the diagnosis tell one story; else why the episode holds."""
    total = target.get("total") or {}
    diagnosis = total.get("diagnosis") or {}
    if (
        target.get("up")
        and not target.get("error")
        and diagnosis.get("state") == "budget_saturated"
    ):
        reason = diagnosis.get("reason") or ""
        return f"{plain_markdown(reason[:1].upper() + reason[1:])}."
    # Held, not judged now: the last scrape read nothing, measured no latency, or the
    # diagnosis names another state while the saturation stands.
    if not target.get("up") or target.get("error"):
        held = "the last scrape could not read the target"
    elif total.get("latency_seconds") is None:
        held = (
            "the last evaluation measured no latency (a window of one scrape, or no "
            "request finished in it)"
        )
    else:
        utilisation = total.get("budget_utilization")
        used = f" at {percent_text(utilisation)} of the budget" if utilisation is not None else ""
        reason = diagnosis.get("reason")
        held = (
            f"the diagnosis now reads {diagnosis.get('state') or 'unknown'}"
            + (f" ({plain_markdown(reason)})" if reason else "")
            + f", while latency over {frames.window(total)} stands{used}"
        )
    lasted = seconds_text(total.get("budget_saturated_seconds") or 0.0)
    return (
        f"Utilisation has stayed {frames.saturation()} and the episode has lasted {lasted}; "
        f"{held}, and nothing measured since has ended it: the budget is too tight for this "
        "traffic, or the server needs more capacity."
    )
