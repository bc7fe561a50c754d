"""The Live page's first screen, in the unit tier: the headline of every diagnosis state
(at most 12 words, naming its numbers), the one-line banner, the trend column's numbers,
and the page run by AppTest in process against the real exporter's bodies (no socket):
the chip and headline, the checklist named for what it checks, the catalog's groups of
numbers, and the notes beside numbers that would look absurd alone."""

from __future__ import annotations

import re

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from batchscope.dashboard.formatting import plain_markdown
from batchscope.dashboard.headline import (
    HEADLINE_WORDS,
    HEADLINES,
    banner_title,
    headline,
    model_of,
    replicas_line,
)
from batchscope.dashboard.trends import KEPT_SECONDS, TREND_POINTS, BudgetTrends
from batchscope.exporter.core.catalog import CACHES, SERIES
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES
from tests.support.live_screens import patch_client, screens_exporter
from tests.support.live_stories import START
from tests.support.paths import REPO

VIEWS = REPO / "dashboard" / "views"


def series(state: str, **numbers) -> dict:
    """A series as the exporter's JSON gives it, in `state`, with long-tailed numbers."""
    return {
        "diagnosis": {"state": state, "reason": "the exporter's own reason"},
        "engine": "vllm",
        "not_exposed": [],
        "running": 3.0,
        "running_peak": 3.0,
        "cap": 8,
        "waiting": 421.0,
        "kv_cache_usage": 0.973,
        "preemptions_per_second": 0.333,
        "latency_seconds": 9.95,
        "latency_quantile": 0.99,
        "budget_seconds": 2.0,
        "budget_utilization": 4.975,
        "budget_saturated_seconds": 1234.0,
        "token_budget_ratio": 0.98,
        **numbers,
    }


# Each state's numbers and what its headline must name of them.
NAMED = {
    "down": ({}, ["/metrics"]),
    "unreadable": ({}, ["/metrics"]),
    "no_data": ({}, ["no samples"]),
    "idle": ({"running": 0.0, "running_peak": 0.0, "waiting": 0.0}, ["0 running", "0 waiting"]),
    "budget_saturated": ({}, ["p99", "497%", "2 s", "21 min"]),
    "stalled": ({}, ["421 waiting", "3 of 8 running"]),
    "memory_bound": ({}, ["3 of 8 running", "421 waiting", "97%", "0.33 preemptions/s"]),
    "token_budget_bound": ({}, ["3 of 8 running", "421 waiting", "98%"]),
    "preempting": ({}, ["3 of 8 running", "421 waiting", "97%", "0.33 preemptions/s"]),
    "work_too_slow": ({"waiting": 0.0}, ["p99", "9.95 s", "2 s", "497%"]),
    "over_budget": ({}, ["p99", "497%", "3 of 8 running", "421 waiting"]),
    "healthy": ({"running_peak": 8.0, "waiting": 2.0}, ["8 of 8 running", "2 waiting"]),
    "batch_limited": ({}, ["3 of 8 running", "421 wait"]),
    "routing": ({"cap": 16}, ["3 of 16 running", "421 waiting", "idles"]),
    "queueing": ({"cap": None}, ["421 waiting"]),
    "underloaded": ({"waiting": 0.0}, ["3 of 8 running"]),
}


def test_every_diagnosis_state_has_a_headline() -> None:
    assert set(HEADLINES) == set(DIAGNOSIS_STATES) == set(NAMED)


@pytest.mark.parametrize("state", DIAGNOSIS_STATES)
def test_a_headline_is_at_most_12_words_and_names_the_numbers(state: str) -> None:
    numbers, named = NAMED[state]
    text = headline(series(state, **numbers))
    assert len(text.split()) <= HEADLINE_WORDS, text
    for number in named:
        assert number in text, (state, text)
    assert "None" not in text and "–" not in text, text


def test_a_batchers_headline_names_its_fired_batches() -> None:
    batcher = series(
        "over_budget",
        engine="inhouse",
        not_exposed=["running", "kv_cache_usage"],
        running=None,
        running_peak=5.67,
        mean_batch_size=5.67,
        cap=32.0,
        waiting=12.0,
    )
    text = headline(batcher)
    assert text == "p99 497% of budget; batches of 5.7 of 32, 12 waiting"
    assert len(text.split()) <= HEADLINE_WORDS


def test_an_unknown_state_shows_the_start_of_its_reason() -> None:
    reason = " ".join(f"w{i}" for i in range(30))
    text = headline({"diagnosis": {"state": "new_state", "reason": reason}})
    assert text == " ".join(f"w{i}" for i in range(HEADLINE_WORDS)) + "…"


def test_a_banner_is_one_line_the_target_the_state_how_long_how_far_over() -> None:
    target = {"target": "a" * 80, "total": series("budget_saturated")}
    title = banner_title(target)
    assert "\n" not in title
    visible = re.sub(r"[*\\]", "", title)
    # 40 characters of the name at most: the line fits a 1400 px page.
    assert visible == f"Budget saturated: {'a' * 39}… for 21 min, p99 at 497% of the 2 s budget"
    held = banner_title({"target": "b", "total": series("budget_saturated", latency_seconds=None)})
    assert held == "**Budget saturated: b** for 21 min, budget used 497%"
    unmeasured = series("budget_saturated", latency_seconds=None, budget_utilization=None)
    assert banner_title({"target": "c", "total": unmeasured}).endswith("no latency measured now")


# ---------------------------------------------------------------- the trend column


def test_a_trend_keeps_each_refresh_and_forgets_past_the_hour() -> None:
    trends = BudgetTrends()
    trends.add(0.0, {"a": 50.0, "b": None})
    trends.add(0.0, {"a": 999.0, "b": 1.0})  # the exporter's same body: nothing added
    trends.add(5.0, {"a": 60.0, "b": 20.0, "c": 5.0})
    assert trends.trend("a", None) == [50.0, 60.0]
    assert trends.trend("b", None) == [20.0]  # not known at the first refresh
    assert trends.trend("c", None) == [5.0]
    assert trends.trend("a", since=3.0) == [60.0]
    trends.add(10.0, {"a": 70.0})  # b and c left the fleet
    assert set(trends.values) == {"a"} and trends.trend("b", None) == []
    trends.add(KEPT_SECONDS + 7.0, {"a": 80.0})
    assert list(trends.times) == [10.0, KEPT_SECONDS + 7.0]
    assert trends.trend("a", None) == [70.0, 80.0]


def test_a_long_trend_is_drawn_by_its_peaks() -> None:
    trends = BudgetTrends()
    for i in range(TREND_POINTS * 3):
        trends.add(float(i), {"a": 100.0 if i == 100 else 10.0})
    drawn = trends.trend("a", None)
    assert len(drawn) == TREND_POINTS
    assert drawn.count(100.0) == 1 and max(drawn) == 100.0


# ---------------------------------------------------------------- the page, in process


@pytest.fixture(scope="module")
def exporter():
    """The screens' exporter and its histories."""
    return screens_exporter(START)


def live(monkeypatch, exporter, target: str | None = None) -> AppTest:
    patch_client(monkeypatch, exporter)
    st.cache_data.clear()
    at = AppTest.from_file(str(VIEWS / "live.py"), default_timeout=30)
    at.session_state["exporter_url"] = "http://in-process"
    at.run()
    if target is not None:
        at.selectbox(key="live_target").set_value(target).run()
    assert not at.exception, at.exception
    return at


def markdown(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown]


def test_the_first_screen_shows_the_chip_and_the_headline(monkeypatch, exporter) -> None:
    at = live(monkeypatch, exporter, "memory-llm")
    shown = markdown(at)
    chip = shown.index(":orange-badge[memory-bound]")
    assert (
        shown[chip + 1]
        == "**"
        + plain_markdown("3 of 8 running, 6 waiting: KV 97% full, 0.33 preemptions/s")
        + "**"
    )
    bars = [bar.proto.text for bar in at.get("progress")]
    assert bars[0] == plain_markdown("Binds: the KV cache, 97% used, 0.33 preemptions/s")
    overview = at.get("plotly_chart")[0]
    assert '"Batch, queue and budget used (shaded: saturated)"' in overview.proto.spec


def test_the_checklist_is_named_for_what_it_checks_and_credits_its_article(
    monkeypatch, exporter
) -> None:
    at = live(monkeypatch, exporter, "steady-llm")
    (box,) = [e for e in at.expander if e.label == "Is continuous batching doing its job?"]
    credit = box.caption[0].value
    assert '"Continuous Batching: Why Your GPU Waits for the Slowest Request"' in credit
    assert "(DEV Community)" in credit
    assert any("Does the running batch sit near the cap?" in m.value for m in box.markdown)


def test_the_catalogs_caches_group_is_on_the_page(monkeypatch, exporter) -> None:
    at = live(monkeypatch, exporter, "steady-llm")
    assert "**Caches, over the last 18 s**" in markdown(at)
    caches = [s for s in SERIES if s.live == CACHES]
    assert [s.name for s in caches] == ["prefix_cache_hit_rate", "spec_decode_acceptance_rate"]
    tiles = {m.label: (m.value, m.proto.help) for m in at.metric}
    # 620 of 1,000 prompt tokens held; 280 of 400 draft tokens accepted, at every scrape
    assert tiles["prefix cache hits"][0] == "62%"
    assert tiles["draft tokens accepted"][0] == "70%"
    for signal in caches:
        assert tiles[signal.title][1] == f"Over the last 18 s. {signal.help}"


def test_a_gain_below_one_and_a_far_off_device_model_say_why(monkeypatch, exporter) -> None:
    at = live(monkeypatch, exporter, "costly-embeddings")
    gain = next(m for m in at.metric if m.label == "throughput gain")
    # 170 items in 0.82 s of execution against 500 items/s at batch size 1
    assert gain.value == "0.4x"
    assert gain.proto.delta == "below 1: batching costs here"
    assert "Batching is costing here, not paying" in gain.proto.help
    (note,) = [w.value for w in at.warning if w.value.startswith("The latency measured")]
    # the fixed pair's worst latency (batches of 1: 2 ms of execution) against 498 ms
    assert note.startswith(
        plain_markdown("The latency measured, 498 ms, is 124 times this model's worst (4 ms)")
    )
    assert plain_markdown("requests queued in front of it (12 waiting now)") in note
    # the healthy LLM has no fixed pair: no note
    at.selectbox(key="live_target").set_value("steady-llm").run()
    assert not [w for w in at.warning if w.value.startswith("The latency measured")]


def words_on(at: AppTest) -> str:
    """Every text element's words, labels and tooltips of a page run."""
    parts = []
    for kind in ("markdown", "caption", "title", "subheader", "error", "warning", "info"):
        for element in at.get(kind):
            parts += [str(element.value), getattr(element.proto, "help", "") or ""]
    for element in at.expander:
        parts.append(element.label)
    for element in at.metric:
        parts += [element.label, element.value, element.proto.help]
    for element in at.radio:
        parts += [str(o) for o in element.options]
    return "\n".join(parts)


@pytest.mark.parametrize("view", ["live.py", "calculator.py", "load_tests.py", "alerts.py"])
def test_no_page_says_seed(monkeypatch, exporter, view: str) -> None:
    patch_client(monkeypatch, exporter)
    monkeypatch.setattr(
        "batchscope.dashboard.client.history",
        lambda _base, target=None: {"targets": {}, "pages": 1},
    )
    st.cache_data.clear()
    at = AppTest.from_file(str(VIEWS / view), default_timeout=30)
    at.session_state["exporter_url"] = "http://in-process"
    at.run()
    assert not at.exception, at.exception
    text = words_on(at)
    assert text.strip()
    assert not re.search(r"seed", text, re.IGNORECASE), text


def test_the_trend_column_reads_the_summary_rows_kept(monkeypatch, exporter) -> None:
    at = live(monkeypatch, exporter)
    table = at.dataframe[0].value.set_index("target")
    # one refresh so far: each target's budget used at it
    for trend, percent in zip(table["budget_trend"], table["budget_percent"], strict=True):
        assert trend == pytest.approx([percent], rel=1e-6)
    at.run()  # the exporter's same body: no point added
    assert at.dataframe[0].value.set_index("target").loc["steady-llm", "budget_trend"] == [
        pytest.approx(74.75, rel=1e-6)
    ]
    served = exporter[0]
    monkeypatch.setattr(served, "clock", lambda: served.latest("steady-llm")[0].t + 5)
    st.cache_data.clear()
    at.run()  # a later body: a second point
    trend = at.dataframe[0].value.set_index("target").loc["steady-llm", "budget_trend"]
    assert trend == pytest.approx([74.75, 74.75], rel=1e-6)


def _model(**fields) -> dict:
    """One model of /api/v1/replicas, as the exporter sends it, with `fields` changed."""
    return {
        "model": "llama",
        "replicas": 1,
        "desired_replicas": 2,
        "stale": False,
        "state": "scale_up",
        "pending": None,
        "demand": {"per_second": 27.9},
        "capacity": {"per_second": 14.2, "limit": "requests"},
        "spread": [{"target": "llm-a"}],
        **fields,
    }


def test_the_replica_line_says_now_recommended_and_why_with_its_numbers() -> None:
    assert replicas_line(_model()) == (
        "Replicas of llama: 1 now, 2 recommended: 27.9 requests/s asked, 14.2 a replica "
        "serves at the request cap"
    )
    kv = _model(replicas=3, desired_replicas=3, capacity={"per_second": 9, "limit": "kv_cache"})
    assert replicas_line(kv).endswith(
        "3 recommended: 27.9 requests/s asked, 9 a replica serves at the KV cache"
    )
    # A count waiting out its hold says where it is going.
    rising = _model(desired_replicas=1, pending={"replicas": 2, "since": 0, "at": 60})
    assert replicas_line(rising).startswith(
        "Replicas of llama: 1 now, 1 recommended (2 once it holds): "
    )
    assert replicas_line(_model(state="routing")) == (
        "Replicas of llama: 1 now, 2 recommended: routed unevenly, not short of capacity"
    )
    assert replicas_line(_model(desired_replicas=None, stale=True)) == (
        "Replicas of llama: 1 now, no recommendation (not read lately)"
    )
    assert replicas_line(None) is None


def test_a_target_reads_the_model_whose_replicas_name_it() -> None:
    doc = {"models": [_model(), _model(model="mistral", spread=[{"target": "llm-b"}])]}
    assert model_of("llm-b", doc)["model"] == "mistral"
    assert model_of("llm-c", doc) is None and model_of("llm-a", None) is None


def test_the_first_screen_shows_the_replica_count_under_the_headline(monkeypatch, exporter) -> None:
    at = live(monkeypatch, exporter, "saturated-llm")
    # The stories' six LLM targets serve one model; one queues at its cap beside an idle one.
    assert plain_markdown(
        "Replicas of tiny: 6 now, 6 recommended: routed unevenly, not short of capacity"
    ) in [c.value for c in at.caption]
