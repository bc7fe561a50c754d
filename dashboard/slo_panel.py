"""The Live page's SLO panel: is the latency promise kept, and how fast does its error
budget burn? Attainment and goodput beside budget utilisation, the burn rate over each
standard window, and the error budget left (docs/metrics.md, "The latency promise as an
SLO"). Reads one `series` object of the exporter's JSON; the cells are pure functions.
"""

from __future__ import annotations

import streamlit as st

from batchscope.dashboard.episodes import SPEED_ALERTS
from batchscope.dashboard.formatting import MISSING, percent, plain_markdown, seconds, tile
from batchscope.dashboard.time_frames import TimeFrames


def attainment_text(attainment: dict | None) -> str:
    """The share within the budget: exact, or the estimate with its bounds."""
    if attainment is None:
        return MISSING
    if attainment.get("exact"):
        return percent(attainment["estimate"], 1)
    return (
        f"{percent(attainment['estimate'], 1)} "
        f"({percent(attainment['lower'], 1)}–{percent(attainment['upper'], 1)})"
    )


def promise_cells(series: dict, frames: TimeFrames) -> list[tuple[str, str, str]]:
    """(label, value, tooltip) of the promise's numbers over the window: budget used (the
    quantile's view), attainment, goodput, and with an objective the objective and the
    error budget left."""
    over = f"Over {frames.window(series)}"
    goodput = series.get("goodput_per_second")
    cells = [
        (
            "budget used",
            *tile(series, "budget_utilization", percent(series.get("budget_utilization")), over),
        ),
        (
            "requests within the budget",
            *tile(series, "slo_attainment", attainment_text(series.get("slo_attainment")), over),
        ),
        (
            "goodput",
            *tile(
                series,
                "goodput_per_second",
                MISSING if goodput is None else f"{goodput['estimate']:.3g}/s",
                f"{over}: requests per second within the budget",
            ),
        ),
    ]
    slo = series.get("slo")
    if slo is not None:
        cells += [
            ("objective", percent(slo["objective"], 2), "The target's slo_objective."),
            ("error budget left", *error_budget_cell(slo)),
        ]
    return cells


def error_budget_cell(slo: dict) -> tuple[str, str]:
    """The budget left over the compliance period and its tooltip; a dash, and how much
    of the period the exporter's history covers so far, until it covers it all."""
    period = seconds(slo["period_seconds"])
    left = slo.get("error_budget_remaining")
    if left is not None:
        return percent(left, 1), f"Over the compliance period ({period})."
    return (
        MISSING,
        f"{MISSING}: not known yet: the exporter's history covers "
        f"{seconds(slo['history_seconds'])} of the {period} compliance period.",
    )


def burn_cells(slo: dict) -> list[tuple[str, str, str]]:
    """(window, burn rate, tooltip) over each standard window: "100x", or "–" without
    requests in it."""
    return [
        (
            f"burn {b['window']}",
            *(
                (MISSING, f"{MISSING}: no request finished in the last {b['window']}.")
                if b["rate"] is None
                else (f"{b['rate']:.3g}x", f"Error budget spent over the last {b['window']}.")
            ),
        )
        for b in slo["burn_rates"]
    ]


def burning_messages(slo: dict) -> list[tuple[str, str]]:
    """(speed, sentence) of each speed whose window pair burns now."""
    return [
        (
            speed,
            f"Breaking the latency promise: the error budget burns fast enough for "
            f"{SPEED_ALERTS[speed][0]} (a {SPEED_ALERTS[speed][1]}). Not the batcher at its "
            "ceiling: users are being failed; docs/runbook.md says what to do.",
        )
        for speed in slo.get("burning") or ()
        if speed in SPEED_ALERTS
    ]


def metric_row(cells: list[tuple[str, str, str]]) -> None:
    for column, (label, value, why) in zip(st.columns(len(cells)), cells, strict=True):
        column.metric(label, value, help=why)


def slo_panel(series: dict, frames: TimeFrames) -> None:
    """The promise of one series (or the target total): its numbers, its burn, what fires."""
    with st.expander("The latency promise (SLO)", key="live_slo"):
        if series.get("budget_seconds") is None:
            st.caption(
                "No latency budget configured (budget_seconds): attainment and goodput need "
                "one; an slo_objective adds burn rates and the burn alerts."
            )
            return
        metric_row(promise_cells(series, frames))
        slo = series.get("slo")
        if slo is not None:
            for speed, message in burning_messages(slo):
                (st.error if speed == "fast" else st.warning)(message)
            metric_row(burn_cells(slo))
        else:
            st.caption(
                "No slo_objective for this target: no burn rate, error budget or burn alert."
            )
        attained = series.get("slo_attainment")
        if attained is not None:
            st.caption(plain_markdown(attained["reason"]))
