"""Static batching calculator: how much of a static batch's slot-steps would do work."""

from __future__ import annotations

import io

import pandas as pd
import streamlit as st

from batchscope.dashboard import charts
from batchscope.dashboard.calculator import (
    EXAMPLES_SOURCE,
    PICTURE_REQUESTS,
    TOY_EXAMPLES,
    LengthsSummary,
    continuous_picture,
    static_picture,
    summarize_lengths,
)
from batchscope.dashboard.formatting import percent, plain_markdown
from batchscope.exporter.core.static_util import exact_static_utilization
from batchscope.exporter.length_log import InputError

PASTE = "paste lengths"
UPLOAD = "upload a file"
TOY_BATCH_SIZE = 8

RESULT_COLUMNS = {
    "batch_size": st.column_config.NumberColumn("batch size B"),
    "requests": st.column_config.NumberColumn("requests"),
    "groups": st.column_config.NumberColumn("static batches"),
    "useful_slot_steps": st.column_config.NumberColumn("useful slot-steps"),
    "total_slot_steps": st.column_config.NumberColumn("slot-steps paid"),
    "idle_slot_steps": st.column_config.NumberColumn("idle slot-steps"),
    "static_utilization": st.column_config.NumberColumn("static utilisation", format="%.7f"),
    "continuous_batching_gain": st.column_config.NumberColumn("continuous gain", format="%.3fx"),
}


def batch_sizes(text: str) -> list[int]:
    """Batch sizes typed as "8, 32, 128"; raises ValueError naming a bad one."""
    sizes = []
    for part in text.replace(",", " ").split():
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} is not a batch size (a whole number from 1)")
        sizes.append(int(part))
    if not sizes:
        raise ValueError("give at least one batch size")
    return sorted(set(sizes))


def toy_table() -> pd.DataFrame:
    rows = []
    for name, lengths in TOY_EXAMPLES.items():
        result = exact_static_utilization(lengths, TOY_BATCH_SIZE)
        rows.append(
            {
                "example": name,
                "lengths": " ".join(map(str, lengths)),
                "useful / paid slot-steps": f"{result.useful_slot_steps} / "
                f"{result.total_slot_steps}",
                "static utilisation": result.static_utilization,
            }
        )
    return pd.DataFrame(rows)


def summarize_upload(uploaded, sizes: list[int], field_name: str | None) -> LengthsSummary:
    """Stream an uploaded file through the reader with a progress bar; kept per session."""
    key = ("calculator upload", uploaded.file_id, tuple(sizes), field_name)
    kept = st.session_state.get("calculator_summary")
    if kept is not None and kept[0] == key:
        return kept[1]
    bar = st.progress(0.0, text=f"reading {uploaded.name}")
    size = max(uploaded.size, 1)
    raw = io.BufferedReader(uploaded)
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")

    def progress(lines_read: int) -> None:
        done = min(raw.tell() / size, 1.0)
        bar.progress(done, text=f"reading {uploaded.name}: {lines_read:,} lines, {done:.0%}")

    summary = summarize_lengths(stream, uploaded.name, sizes, field_name, progress)
    bar.empty()
    st.session_state["calculator_summary"] = (key, summary)
    return summary


def show_report(summary: LengthsSummary) -> None:
    report = summary.report
    field = f", field {report.field!r}" if report.field else ""
    st.caption(plain_markdown(f"{report.name}: {report.format}{field}, {report.lengths:,} lengths"))
    if report.failed_requests:
        st.caption(f"{report.failed_requests:,} failed requests left out.")
    if report.bad_lines:
        st.warning(
            f"{report.bad_lines:,} lines held no valid length and were skipped; the first ones:"
        )
        st.code("\n".join(report.examples), language=None)


def slots_pictures(lengths: list[int], size: int) -> None:
    st.subheader(f"Slots over steps at B={size}")
    static = static_picture(lengths, size)
    steps = static.grid.shape[1]
    continuous = continuous_picture(lengths, size, steps)
    shown = st.slider(
        "Decode step",
        0,
        steps,
        steps,
        key="calculator_step",
        help="Move to watch the batches fill and drain, step by step.",
    )
    st.plotly_chart(
        charts.slots_chart(
            static,
            "Static batching: a batch runs until its longest request ends (grey: paid, idle)",
            shown,
            steps,
        ),
        width="stretch",
        key="static_slots",
    )
    st.markdown(
        f"Static: **{static.useful_slot_steps} of {static.total_slot_steps}** "
        f"slot-steps do work ({percent(static.utilization, 1)})."
    )
    st.plotly_chart(
        charts.slots_chart(
            continuous,
            "Continuous batching: a waiting request takes each free slot on the next step",
            shown,
            steps,
        ),
        width="stretch",
        key="continuous_slots",
    )
    st.markdown(
        f"Continuous, with requests like these waiting: **{continuous.useful_slot_steps}"
        f" of {continuous.total_slot_steps}** slot-steps do work "
        f"({percent(continuous.utilization, 1)})."
    )


st.title("Static batching calculator")
st.markdown(
    "How much of a static batch's slot-steps do useful work: "
    "`sum(lengths) / (B × max(lengths))` per group of B consecutive requests. Continuous "
    "batching gives each free slot to a waiting request, so its gain is the inverse."
)
st.caption(EXAMPLES_SOURCE)
st.dataframe(
    toy_table(),
    hide_index=True,
    width="stretch",
    column_config={
        "static utilisation": st.column_config.NumberColumn(
            "static utilisation (B=8)", format="%.7f"
        )
    },
)

source = st.radio(
    "Output lengths", [*TOY_EXAMPLES, PASTE, UPLOAD], horizontal=True, key="calculator_source"
)
try:
    sizes = batch_sizes(st.text_input("Batch sizes", "8", key="calculator_sizes"))
except ValueError as err:
    st.error(str(err))
    st.stop()

summary: LengthsSummary | None = None
try:
    if source in TOY_EXAMPLES:
        text = "\n".join(map(str, TOY_EXAMPLES[source]))
        summary = summarize_lengths(io.StringIO(text), source, sizes)
    elif source == PASTE:
        pasted = st.text_area(
            "One length per line (or CSV, JSON lines, a vLLM bench result)",
            "3\n5\n8\n11\n4\n14\n6\n16",
            key="calculator_paste",
        )
        summary = summarize_lengths(io.StringIO(pasted), "pasted lengths", sizes)
    else:
        field_name = (
            st.text_input(
                "Field (CSV column or JSON key; empty: detect)", key="calculator_field"
            ).strip()
            or None
        )
        uploaded = st.file_uploader(
            "Lengths file (any format batchscope-static-util reads)", key="calculator_file"
        )
        if uploaded is not None:
            summary = summarize_upload(uploaded, sizes, field_name)
except InputError as err:
    st.error(plain_markdown(str(err)))

if summary is not None:
    show_report(summary)
    if not summary.results:
        st.error("No length produced a token: there is nothing to batch.")
    else:
        results = pd.DataFrame([r.to_dict() for r in summary.results.values()])
        st.dataframe(
            results[list(RESULT_COLUMNS)],
            column_config=RESULT_COLUMNS,
            hide_index=True,
            width="stretch",
        )
        first = next(iter(summary.results.values()))
        st.metric(
            f"Static utilisation at B={first.batch_size}",
            f"{first.static_utilization:.7g}",
            help="Share of slot-steps doing useful work",
        )
        if len(summary.counts) > 1:
            counts = pd.DataFrame(sorted(summary.counts.items()), columns=["length", "requests"])
            st.bar_chart(
                counts,
                x="length",
                y="requests",
                x_label="output length (tokens)",
                y_label="requests",
                height=220,
            )
        if len(summary.first) < summary.report.lengths:
            st.caption(f"The picture shows the first {PICTURE_REQUESTS} requests.")
        slots_pictures(summary.first, first.batch_size)
