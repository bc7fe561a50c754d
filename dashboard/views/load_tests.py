"""Load tests: batchscope-loadgen and `vllm bench serve` results, compared by rate."""

from __future__ import annotations

import streamlit as st

from batchscope.dashboard import charts
from batchscope.dashboard.formatting import plain_markdown
from batchscope.dashboard.load_results import (
    ResultError,
    knees,
    load_capacity,
    load_result,
    runs_frame,
)

RUN_COLUMNS = {
    "setting": st.column_config.TextColumn("setting"),
    "source": st.column_config.TextColumn("file"),
    "rate_per_s": st.column_config.NumberColumn("offered rate (req/s)", format="%.2f"),
    "throughput_per_s": st.column_config.NumberColumn("throughput (req/s)", format="%.2f"),
    "p50_ms": st.column_config.NumberColumn("p50 (ms)", format="%.1f"),
    "p99_ms": st.column_config.NumberColumn("p99 (ms)", format="%.1f"),
    "goodput_per_s": st.column_config.NumberColumn("goodput at SLO (req/s)", format="%.2f"),
    "goodput_upper_per_s": st.column_config.NumberColumn("goodput at most", format="%.2f"),
    "goodput_exact": st.column_config.CheckboxColumn("exact"),
    "binding_limit": st.column_config.TextColumn("binding limit"),
    "diagnosis": st.column_config.TextColumn("diagnosis (most of the step)"),
    "running_mean": st.column_config.NumberColumn("running (mean)", format="%.1f"),
    "running_max": st.column_config.NumberColumn("running (max)", format="%.0f"),
    "cap": st.column_config.NumberColumn("cap", format="%.0f"),
    "waiting_mean": st.column_config.NumberColumn("waiting (mean)", format="%.1f"),
    "kv_usage_max": st.column_config.NumberColumn("KV usage (max)", format="percent"),
    "preemptions_per_s": st.column_config.NumberColumn("preemptions/s", format="%.2f"),
    "tokens_per_step": st.column_config.NumberColumn("tokens per step", format="%.1f"),
}

st.title("Load tests")
st.markdown(
    "Open `batchscope-loadgen --json` output or `vllm bench serve --save-result` files: "
    "one line per setting, latency and throughput against the offered rate, and goodput "
    "(requests per second answered within the SLO). A run with `--watch` also shows, per "
    "step, the server's binding limit (the band along the bottom of the latency chart, "
    "coloured by the step's diagnosis) and its batching columns; the knee of each setting "
    "and a `--find-capacity` run's capacity are marked."
)
files = st.file_uploader("Result files (JSON)", accept_multiple_files=True, key="load_files")
slo_ms = st.number_input(
    "Latency SLO (ms, end to end)", min_value=0.0, value=1000.0, step=50.0, key="load_slo"
)

runs = []
capacities = []
for uploaded in files or []:
    text = uploaded.getvalue().decode("utf-8", "replace")
    try:
        runs.extend(load_result(text, uploaded.name))
    except ResultError as err:
        st.error(plain_markdown(str(err)))
    found = load_capacity(text, uploaded.name)
    if found is not None:
        capacities.append(found)

if not runs:
    st.info("No results opened yet.")
    st.stop()

frame = runs_frame(runs, slo_ms)
found_knees = knees(runs, slo_ms)
# The setting or file name in bold; it and the words after it come from the file, inert.
for knee in found_knees:
    st.markdown(f"**{plain_markdown(knee.setting)}**: {plain_markdown(knee.sentence)}")
for capacity in capacities:
    bracket = f"..{capacity.high:g}" if capacity.high is not None else " and above"
    st.markdown(
        f"**{plain_markdown(capacity.source)}**: "
        + plain_markdown(
            f"capacity at the SLO {capacity.rate:g} req/s (bracket {capacity.low:g}{bracket})"
        )
    )
st.plotly_chart(
    charts.latency_vs_rate_chart(
        frame,
        slo_ms,
        {knee.setting: knee.rate for knee in found_knees},
        {c.source: c.rate for c in capacities},
    ),
    width="stretch",
    key="latency",
)
st.plotly_chart(charts.throughput_vs_rate_chart(frame), width="stretch", key="throughput")
st.dataframe(frame, column_config=RUN_COLUMNS, hide_index=True, width="stretch")
if not frame["goodput_exact"].all():
    st.caption(
        "Goodput without per-request latencies is a lower bound from the known percentiles "
        "(p99 within the SLO means at least 99% of requests were in time); "
        "'goodput at most' is the matching upper bound."
    )
