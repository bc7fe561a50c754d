"""Streamlit pieces every page shares: where the data comes from, fetching with a short
cache and the last good data kept, and how states and problems are shown."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from batchscope.dashboard import client, prometheus
from batchscope.dashboard.client import DEFAULT_EXPORTER, EXPORTER_ENV, PROMETHEUS_ENV
from batchscope.dashboard.formatting import age, plain_markdown
from batchscope.dashboard.states import look

REFRESH_SECONDS = 5
# Shorter than the refresh: every refresh reads fresh data, two pages in one refresh share it.
FETCH_TTL_SECONDS = 2


@dataclass(frozen=True, slots=True)
class Sources:
    exporter: str
    prometheus: str | None


def sources() -> Sources:
    """The exporter (and Prometheus) URLs: from the command line, changeable in the sidebar."""
    if "exporter_url" not in st.session_state:
        st.session_state["exporter_url"] = os.environ.get(EXPORTER_ENV, DEFAULT_EXPORTER)
    if "prometheus_url" not in st.session_state:
        st.session_state["prometheus_url"] = os.environ.get(PROMETHEUS_ENV, "")
    st.sidebar.text_input("Exporter URL", key="exporter_url")
    st.sidebar.text_input("Prometheus URL (optional, for longer history)", key="prometheus_url")
    return Sources(
        st.session_state["exporter_url"].strip(),
        st.session_state["prometheus_url"].strip() or None,
    )


@st.cache_data(ttl=FETCH_TTL_SECONDS, show_spinner=False)
def _fleet_summary(base: str) -> dict:
    return client.fleet_summary(base)


@st.cache_data(ttl=FETCH_TTL_SECONDS, show_spinner=False)
def _target_signals(base: str, target: str) -> dict | None:
    return client.target_signals(base, target)


@st.cache_data(ttl=FETCH_TTL_SECONDS, show_spinner=False)
def _replicas(base: str) -> dict:
    return client.replicas(base)


@st.cache_data(ttl=FETCH_TTL_SECONDS, show_spinner=False)
def _history(base: str, target: str | None) -> dict:
    return client.history(base, target)


@st.cache_data(ttl=FETCH_TTL_SECONDS * 5, show_spinner=False)
def _prometheus_history(base: str, target: str, start: float, end: float, step: float) -> list:
    return prometheus.history(base, target, start, end, step)


@st.cache_data(ttl=FETCH_TTL_SECONDS * 5, show_spinner=False)
def _prometheus_targets(base: str) -> list:
    return prometheus.targets(base)


@dataclass(frozen=True, slots=True)
class Loaded:
    """Data as fetched, or the last good data with the error that kept it from updating."""

    data: object | None
    fetched_at: float | None
    error: str | None

    def age_seconds(self, now: float) -> float | None:
        return None if self.fetched_at is None else now - self.fetched_at


def load(key: str, fetch: Callable[[], object]) -> Loaded:
    """Fetch, remembering the result per session; on failure, the last result and why."""
    remembered = st.session_state.setdefault("last_good", {})
    try:
        data = fetch()
    except client.SourceError as err:
        last = remembered.get(key)
        return Loaded(*(last or (None, None)), error=str(err))
    remembered[key] = (data, time.time())
    return Loaded(data, time.time(), None)


def fleet_summary(base: str) -> Loaded:
    return load(f"summary {base}", lambda: _fleet_summary(base))


def target_signals(base: str, target: str) -> Loaded:
    return load(f"target {base} {target}", lambda: _target_signals(base, target))


def replicas(base: str) -> Loaded:
    return load(f"replicas {base}", lambda: _replicas(base))


def history(base: str, target: str | None = None) -> Loaded:
    return load(f"history {base} {target}", lambda: _history(base, target))


def prometheus_history(base: str, target: str, seconds: float, now: float) -> Loaded:
    # Rounded to the step so the cache hits between refreshes; about 300 points a chart.
    step = max(5.0, round(seconds / 300))
    end = now // step * step
    return load(
        f"prom {base} {target} {seconds}",
        lambda: _prometheus_history(base, target, end - seconds, end, step),
    )


def prometheus_targets(base: str) -> Loaded:
    return load(f"prom targets {base}", lambda: _prometheus_targets(base))


def show_problem(loaded: Loaded, now: float) -> None:
    """Say in words why the data did not update, and how old what is shown is."""
    if loaded.error is None:
        return
    st.error(plain_markdown(loaded.error), icon=":material/cloud_off:")
    seconds = loaded.age_seconds(now)
    if seconds is None:
        st.info("No data received yet in this session.")
    else:
        st.warning(f"Showing the last data received, {age(seconds)}.")


def state_badge(state: str) -> None:
    shown = look(state)
    st.badge(shown.words, color=shown.badge)  # type: ignore[arg-type]
