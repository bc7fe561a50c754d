"""The Live page tells one story: on the states where its boxes used to
disagree (tests/support/live_stories.py), the diagnosis, the fleet row, the tiles, the
advice and the banner read one evaluation, agree where they judge the same thing, and say
"now" or "over the last N s" where they read different frames. And a fleet is more than
a list: filtered, ordered, a page at a time, with only the shown target fetched whole."""

from __future__ import annotations

import pytest
import streamlit as st
from aiohttp import web
from streamlit.testing.v1 import AppTest

from batchscope.dashboard.formatting import plain_markdown
from batchscope.dashboard.frames import FLEET_PAGE_ROWS
from batchscope.dashboard.states import look
from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.engines import read_series
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve.app import create_app
from batchscope.exporter.serve.history import Histories
from tests.support.live_stories import STORIES, serve_stories
from tests.support.paths import REPO, fixture_text
from tests.support.scripted_fleet import BackgroundServer

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration


LIVE = REPO / "dashboard" / "views" / "live.py"


@pytest.fixture(scope="module")
def stories():
    server = serve_stories()
    yield server.url
    server.stop()


def live(exporter_url: str, target: str | None = None) -> AppTest:
    st.cache_data.clear()
    at = AppTest.from_file(str(LIVE), default_timeout=30)
    at.session_state["exporter_url"] = exporter_url
    at.run()
    if target is not None:
        at.selectbox(key="live_target").set_value(target).run()
    assert not at.exception, at.exception
    return at


def tiles(at: AppTest) -> dict[str, tuple[str, str]]:
    return {m.label: (m.value, m.proto.help) for m in at.metric}


def markdown(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown]


def helps(at: AppTest) -> dict[str, str]:
    """Each markdown's tooltip, by its text."""
    return {m.value: m.proto.help for m in at.markdown}


def badge_help(at: AppTest) -> str:
    return next(m.proto.help for m in at.markdown if "-badge[" in m.value)


def badge(at: AppTest) -> str:
    return next(t for t in markdown(at) if "-badge[" in t).split("[", 1)[1].rstrip("]")


def next_step_text(at: AppTest) -> str:
    return next(t for t in markdown(at) if t.startswith("**Next:**"))


def row(at: AppTest, target: str):
    return at.dataframe[0].value.set_index("target").loc[target]


@pytest.mark.parametrize("target", list(STORIES))
def test_the_row_the_badge_and_the_tiles_agree_and_never_say_nothing_to_fix_over_budget(
    stories, target
) -> None:
    at = live(stories, target)
    shown = tiles(at)
    fleet = row(at, target)
    # a missing cell is a dash, not "None"
    assert at.dataframe[0].proto.placeholder == "–"
    # one state: the row's words are the badge's
    assert fleet["state"] == badge(at)
    # one batch: the row's running / cap is the tile's (a batcher: its mean fired batch)
    batch = shown.get("running / cap", shown.get("mean batch / cap"))[0]
    assert fleet["batch"] == batch
    # one budget used: the row's number is the tile's, to the whole percent
    used = shown["budget used"][0]
    assert f"{fleet['budget_percent']:.0f}%" == used
    if float(used.rstrip("%")) > 100:
        assert "nothing to fix" not in next_step_text(at)
        assert fleet["state"] in {
            look(s).words for s in ("budget_saturated", "work_too_slow", "over_budget")
        } | {look("preempting").words}


def test_over_budget_before_the_hold_is_not_underloaded(stories) -> None:
    at = live(stories, "slow-embeddings")
    # 150 ms of a 50 ms budget, nothing queued, batches of 3 of 32, 15 s into a 60 s hold
    assert badge(at) == "too slow for the budget"
    assert tiles(at)["budget used"][0] == "299%"
    assert any(
        t.startswith(
            plain_markdown(
                "over the last 18 s, p99 latency 150 ms of a 50 ms budget (299%), while batches "
                "average 3 of max 32: nothing waits and batches are small, so the latency is "
                "each request's own serving time"
            )
        )
        for t in markdown(at)
    )
    assert next_step_text(at).startswith("**Next:** Batching cannot help here")


def test_the_row_shows_the_batch_the_diagnosis_judged_not_the_last_scrape(stories) -> None:
    # the last scrape caught 0 of 8 running between a finish and the next admission
    at = live(stories, "flicker-llm")
    assert badge(at) == "healthy"
    assert row(at, "flicker-llm")["batch"] == "8 / 8"
    value, help_text = tiles(at)["running / cap"]
    assert value == "8 / 8"
    assert help_text.startswith("Running requests, the peak of the last 3 scrapes, 9 s")
    assert any(t.startswith("running 8 of cap 8") for t in markdown(at))


def test_the_advice_and_the_diagnosis_say_which_time_frame_each_reads(stories) -> None:
    # requests waited at the cap early in the window; none wait now
    at = live(stories, "waited-llm")
    assert any(t.startswith("nothing waits now") for t in markdown(at))
    # How each was judged: a tooltip on what it qualifies (the chip, the groups of numbers).
    assert "the queue and the KV cache at the last scrape" in badge_help(at)
    assert helps(at)["**Now**"] == "The last scrape; running: the peak of the last 3 scrapes, 9 s."
    assert "**Over the last 18 s**" in markdown(at)
    (advice,) = [e for e in at.expander if e.label.startswith("What to change")]
    assert advice.label == "What to change, from the last 18 s"
    summary = next(t for t in markdown(at) if t.startswith("**Advice:**"))
    assert "requests waited at the cap of 8" in summary
    assert helps(at)[summary].startswith("The advice reads the whole window, the last 18 s")


def test_the_banner_is_one_line_and_opens_on_the_diagnosis_with_the_hold_and_the_window(
    stories,
) -> None:
    at = live(stories)
    (banner,) = [e for e in at.expander if e.label.startswith(":red[**Budget saturated")]
    assert banner.label == (
        ":red[**Budget saturated: saturated\\-llm** for 69 s, p99 at 497% of the 2 s budget]"
    )
    reason = banner.markdown[0].value
    assert reason == (
        plain_markdown(
            "Latency has stayed at or above 95% of the budget for 69 s (saturated after 60 s); "
            "over the last 18 s, p99 latency 9.95 s of a 2 s budget (497%): the budget is too "
            "tight for this traffic, or the server needs more capacity"
        )
        + "."
    )
    at.selectbox(key="live_target").set_value("saturated-llm").run()
    assert any(t.lower() == reason[:-1].lower() for t in markdown(at))


def test_preempting_at_the_cap_with_a_long_queue_names_both_limits(stories) -> None:
    at = live(stories, "overload-llm")
    assert badge(at) == "preempting"
    assert any(
        plain_markdown(
            "2 limits are at their bound at once, the KV cache (67% used, 0.50 preemptions/s) "
            "and the request cap (8 of 8 running)"
        )
        in t
        for t in markdown(at)
    )
    assert (
        "Binding now: **KV cache**; also at its bound: requests (the cap, --max-num-seqs)."
        in markdown(at)
    )


# ---------------------------------------------------------------- a fleet, not a list

FLEET_SIZE = 45


def counted(app: web.Application, seen: list[str]) -> web.Application:
    """The app, noting every request's path and query."""

    @web.middleware
    async def note(request: web.Request, handler):
        seen.append(request.path_qs)
        return await handler(request)

    app.middlewares.append(note)
    return app


@pytest.fixture(scope="module")
def fleet():
    """45 vLLM targets from the real payloads: every fifth one overloaded (memory-bound)."""
    targets = tuple(
        Target(
            f"gpu-{i:02d}", f"http://127.0.0.1:9/{i}/metrics", engine="vllm", cap=8 if i % 5 else 64
        )
        for i in range(FLEET_SIZE)
    )
    exporter = Exporter(Settings(targets=targets), clock=lambda: 2000.0)
    histories = Histories(exporter)
    idle = read_series(fixture_text("vllm-0.32.0-cpu-idle.txt"), "vllm")
    load = read_series(fixture_text("vllm-0.32.0-cpu-load.txt"), "vllm")
    for state in exporter.states.values():
        for t, series in ((1990.0, idle), (1995.0, load), (2000.0, load)):
            exporter.ingest(state, Snapshot(state.target.name, t, True, series), t)
    exporter.rounds += 1
    seen: list[str] = []
    server = BackgroundServer(counted(create_app(exporter, histories=histories), seen))
    server.start()
    yield server.url, seen
    server.stop()


def test_a_fleet_is_paged_worst_first_with_the_rest_counted(fleet) -> None:
    url, _ = fleet
    at = live(url)
    table = at.dataframe[0].value
    assert len(table) == FLEET_PAGE_ROWS
    states = list(table["state"])
    # worst first: the 9 targets at cap 64 (below it with requests waiting) come first
    assert states[:9] == [states[0]] * 9 and states[0] != states[9]
    captions = [c.value for c in at.caption]
    rest = next(c for c in captions if c.startswith("Targets 1–20 of 45, worst first."))
    assert rest.endswith(f"Not on this page: 25 {states[-1]}.")
    pages = [list(table["target"])]
    for number in (2, 3):
        at.number_input(key="live_page").set_value(number).run()
        pages.append(list(at.dataframe[0].value["target"]))
    assert [len(p) for p in pages] == [20, 20, 5]
    assert sorted(sum(pages, [])) == [f"gpu-{i:02d}" for i in range(FLEET_SIZE)]
    assert any(c.value.startswith("Targets 41–45 of 45, worst first.") for c in at.caption)
    at.text_input(key="live_filter").set_value("gpu-1").run()
    # the two of gpu-10 to gpu-19 at cap 64 first, the rest by name
    matching = list(at.dataframe[0].value["target"])
    assert matching == ["gpu-10", "gpu-15"] + [f"gpu-1{i}" for i in (1, 2, 3, 4, 6, 7, 8, 9)]
    assert any(
        c.value.startswith("Targets 1–10 of 10 matching the filter, of 45") for c in at.caption
    )
    at.text_input(key="live_filter").set_value("").run()
    at.selectbox(key="live_sort").set_value("name").run()
    assert list(at.dataframe[0].value["target"])[:3] == ["gpu-00", "gpu-01", "gpu-02"]


def test_a_refresh_fetches_the_fleets_rows_the_shown_targets_signals_and_the_replica_counts(
    fleet,
) -> None:
    url, seen = fleet
    seen.clear()
    at = live(url)
    shown = at.selectbox(key="live_target").value
    # and the models' replica counts, for the line under the shown target's headline
    assert sorted(set(seen)) == sorted(
        {
            "/api/v1/signals?view=summary",
            f"/api/v1/signals?target={shown}",
            f"/api/v1/history?target={shown}",
            "/api/v1/replicas",
        }
    )
