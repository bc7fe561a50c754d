"""The exporter's own alerts: which fire when, their v2 payloads, and their delivery."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from batchscope.exporter.alerts.book import RESEND_SECONDS, AlertBook, delivered, payload, step
from batchscope.exporter.alerts.delivery import AlertmanagerDelivery
from batchscope.exporter.alerts.specs import (
    ALERTS,
    BUDGET_SATURATED,
    MEMORY_BOUND,
    SLO_BURN_FAST,
    SLO_BURN_SLOW,
    STALLED,
    TARGET_DOWN,
    AlertWords,
    duration_words,
)
from batchscope.exporter.config.settings import Settings
from batchscope.exporter.core.diagnosis import Diagnosis
from batchscope.exporter.core.evaluate import (
    SeriesSignals,
    TargetIdentity,
    TargetSignals,
    evaluate_window,
)
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.slo import WINDOW_PAIRS, BurnRate, SloStatus, pair_burning
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.core.window import Window
from batchscope.exporter.engines import read_series
from tests.support.monitoring_stack import (
    alertmanager,
    exporter,
    http_get,
    payload_server,
    webhook,
)
from tests.support.network import wait_until
from tests.support.vllm_payload import VllmState, render


def signals(
    target="llm",
    *,
    up=True,
    saturated=False,
    utilization=0.5,
    state="healthy",
    waiting=0.0,
    tokens=100.0,
    t=0.0,
) -> TargetSignals:
    total = SeriesSignals(
        waiting=waiting,
        budget_utilization=utilization,
        budget_saturated=saturated,
        generation_tokens_per_second=tokens,
        diagnosis=Diagnosis(state, ""),
    )
    return TargetSignals(
        target, "http://127.0.0.1:8000/metrics", t, up, None if up else "refused", (), total
    )


def names(book: AlertBook) -> dict[tuple[str, str], float | None]:
    return {key: alert.resolved_at for key, alert in book.unsent.items()}


def test_sustained_saturation_is_posted_at_once_with_the_rules_labels():
    book = step(AlertBook(), [signals(saturated=True, utilization=0.97)], now=1_800_000_000.0)
    [alert] = book.unsent.values()
    body = payload(alert, "http://127.0.0.1:9500/api/v1/signals")
    assert body["labels"] == {
        "alertname": "BatchingBudgetSaturated",
        "severity": "warning",
        "target": "llm",
    }
    assert body["annotations"]["summary"] == "llm: latency budget saturated for a minute"
    assert body["annotations"]["description"].startswith("Budget utilisation on llm is 97%:")
    assert body["annotations"]["runbook_url"] == "docs/runbook.md#batchingbudgetsaturated"
    assert body["startsAt"] == "2027-01-15T08:00:00Z"
    # Valid for four resends: a dead exporter's alerts resolve on their own.
    assert body["endsAt"] == "2027-01-15T08:04:00Z"


def test_a_saturated_series_fires_for_its_target_when_the_total_has_no_latency():
    # An LLM beside an embedding batcher with its own budget: the total keeps no latency.
    llm = SeriesSignals(
        labels={"model_name": "m"},
        budget_utilization=0.99,
        budget_saturated=True,
        diagnosis=Diagnosis("budget_saturated", ""),
    )
    batcher = SeriesSignals(labels={"batcher": "embed"}, budget_utilization=0.4)
    target = TargetSignals(
        "demo", "http://127.0.0.1:8000/metrics", 0.0, True, None, (llm, batcher), SeriesSignals()
    )
    book = step(AlertBook(), [target], now=0.0)
    assert list(book.unsent) == [(BUDGET_SATURATED.name, "demo")]
    assert book.unsent[(BUDGET_SATURATED.name, "demo")].value == 0.99


def test_memory_bound_is_posted_only_after_its_two_minute_hold():
    book = AlertBook()
    for now in (0.0, 60.0, 119.0):
        book = step(book, [signals(state="memory_bound", waiting=12, t=now)], now)
        assert book.unsent == {}
    book = step(book, [signals(state="memory_bound", waiting=12, t=120.0)], 120.0)
    assert names(book) == {(MEMORY_BOUND.name, "llm"): None}
    body = payload(book.unsent[(MEMORY_BOUND.name, "llm")], "")
    assert body["annotations"]["description"].startswith("On llm 12 requests wait")


def test_a_condition_that_clears_inside_its_hold_is_never_posted():
    book = step(AlertBook(), [signals(state="stalled", tokens=0.0)], 0.0)
    book = step(book, [signals(state="healthy")], 30.0)
    book = step(book, [signals(state="healthy")], 90.0)
    assert book.unsent == {} and book.active == {}


def test_a_down_target_fires_target_down_after_a_minute_and_resolves_when_back():
    book = AlertBook()
    for now in (0.0, 59.0):
        book = step(book, [signals(up=False)], now)
    assert book.unsent == {}
    book = delivered(step(book, [signals(up=False)], 60.0))
    book = step(book, [signals()], 75.0)
    assert names(book) == {(TARGET_DOWN.name, "llm"): 75.0}
    resolved = payload(book.unsent[(TARGET_DOWN.name, "llm")], "")
    assert resolved["startsAt"] == "1970-01-01T00:00:00Z"
    assert resolved["endsAt"] == "1970-01-01T00:01:15Z"


def test_a_firing_alert_is_posted_again_every_resend_interval_only():
    book = delivered(
        step(AlertBook(), [signals(state="stalled", tokens=0.0)], 0.0, holds={STALLED.name: 0})
    )
    book = step(book, [signals(state="stalled", tokens=0.0)], RESEND_SECONDS - 1, {STALLED.name: 0})
    assert book.unsent == {}
    book = step(book, [signals(state="stalled", tokens=0.0)], RESEND_SECONDS, {STALLED.name: 0})
    assert names(book) == {(STALLED.name, "llm"): None}


def test_a_target_removed_from_the_config_resolves_its_alerts():
    book = delivered(step(AlertBook(), [signals("a", saturated=True), signals("b")], 10.0))
    book = step(book, [signals("b")], 20.0)
    assert names(book) == {(BUDGET_SATURATED.name, "a"): 20.0}


def test_unsent_alerts_keep_their_latest_state_until_delivered():
    book = step(AlertBook(), [signals(saturated=True)], 10.0)
    book = step(book, [signals()], 20.0)  # resolved before the first post got through
    assert names(book) == {(BUDGET_SATURATED.name, "llm"): 20.0}


@pytest.mark.integration
async def test_delivery_backs_off_while_alertmanager_fails_then_posts():
    received: list[list[dict]] = []
    failures = 2

    async def alerts(request: web.Request) -> web.Response:
        nonlocal failures
        if failures:
            failures -= 1
            return web.Response(status=503, text="not ready")
        received.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/api/v2/alerts", alerts)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    delivery = AlertmanagerDelivery(
        f"http://127.0.0.1:{port}",
        lambda: [signals(saturated=True)],
        generator_url="g",
        interval_seconds=0.1,
    )
    try:
        async with aiohttp.ClientSession() as session:
            await delivery.deliver_once(session)
            assert (delivery.backoff, received) == (1.0, [])
            await delivery.deliver_once(session)  # inside the backoff: no post
            assert failures == 1
            delivery.retry_at = 0.0
            await delivery.deliver_once(session)
            assert (delivery.backoff, received) == (2.0, [])
            delivery.retry_at = 0.0
            await delivery.deliver_once(session)
    finally:
        await runner.cleanup()
    assert delivery.backoff == 0.0 and delivery.book.unsent == {}
    assert [[a["labels"]["alertname"] for a in body] for body in received] == [
        ["BatchingBudgetSaturated"]
    ]


@pytest.mark.integration
async def test_a_hanging_alertmanager_does_not_hold_the_event_loop():
    hang = asyncio.Event()

    async def accept(reader, writer):
        await hang.wait()  # reads nothing, answers nothing
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    delivery = AlertmanagerDelivery(
        f"http://127.0.0.1:{port}",
        lambda: [signals(saturated=True)],
        generator_url="g",
        interval_seconds=0.1,
    )
    ticks = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        posting = asyncio.create_task(delivery.deliver_once(session))
        while not posting.done():
            ticks += 1  # a scrape round would run here
            await asyncio.sleep(0.01)
        await posting
    hang.set()
    server.close()
    assert ticks >= 10
    assert delivery.backoff == 1.0 and len(delivery.book.unsent) == 1


@pytest.mark.integration
def test_alerts_reach_a_real_alertmanager_and_resolve(tmp_path):
    state = {"saturated": True}
    with webhook() as hook, alertmanager(tmp_path, hook.url) as am:

        async def run() -> None:
            delivery = AlertmanagerDelivery(
                am.url,
                lambda: [signals(saturated=state["saturated"], utilization=0.99)],
                generator_url="http://127.0.0.1:9500/api/v1/signals",
                interval_seconds=0.2,
            )
            async with aiohttp.ClientSession() as session:
                await delivery.deliver_once(session)
                active = json.loads(http_get(f"{am.url}/api/v2/alerts"))
                assert [a["labels"] for a in active] == [
                    {"alertname": "BatchingBudgetSaturated", "severity": "warning", "target": "llm"}
                ]
                await asyncio.to_thread(
                    wait_until,
                    lambda: hook.alerts(BUDGET_SATURATED.name),
                    30,
                    "the firing notification",
                )
                state["saturated"] = False
                await delivery.deliver_once(session)

        asyncio.run(run())
        wait_until(
            lambda: hook.alerts(BUDGET_SATURATED.name, "resolved"), 30, "the resolved notification"
        )
        [firing] = hook.alerts(BUDGET_SATURATED.name)
        assert firing["annotations"]["summary"] == "llm: latency budget saturated for a minute"
        # Resolved: Alertmanager lists it no more.
        assert json.loads(http_get(f"{am.url}/api/v2/alerts")) == []


def test_the_posted_alert_states_the_configured_threshold_and_hold():
    # Before the texts took their numbers from the settings, an exporter run with
    # --saturation-threshold 0.9 --hold-seconds 120 posted "95%" and "for a minute".
    words = AlertWords.from_settings(
        Settings(targets=(), saturation_threshold=0.9, hold_seconds=120.0)
    )
    book = step(AlertBook(), [signals(saturated=True, utilization=0.93)], now=0.0)
    [alert] = book.unsent.values()
    body = payload(alert, "g", words)["annotations"]
    assert body["summary"] == "llm: latency budget saturated for 2 minutes"
    assert body["description"].startswith(
        "Budget utilisation on llm is 93%: the latency quantile has stayed at or above 90% "
        "of the budget for 2 minutes."
    )
    # The other alerts state their own holds (or an override) and the configured levels.
    levels = AlertWords(near_cap=0.8, kv_high=0.85, holds={"BatchscopeTargetDown": 90.0})
    memory = levels.texts(MEMORY_BOUND, "llm", "3")[1]
    assert "under 80% of its cap, with the KV cache at 85% or more" in memory
    assert "has failed for 90 s" in levels.texts(TARGET_DOWN, "llm", "0")[1]
    for spec in ALERTS:  # every placeholder of every text has a value
        levels.texts(spec, "llm", "1")
    assert [duration_words(s) for s in (60, 120, 300, 3600, 90, 0.5, 86400, 259200)] == [
        "a minute",
        "2 minutes",
        "5 minutes",
        "an hour",
        "90 s",
        "0.5 s",
        "a day",
        "3 days",
    ]


def _slo(burning: tuple[str, ...], **rates: float) -> SloStatus:
    """A status whose pairs of the `burning` speeds burn where both their rates are over
    the pair's factor."""
    windows = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0, "6h": 21600.0, "3d": 259200.0}
    by_window = {w: rates.get("w" + w) for w in windows}
    return SloStatus(
        0.99,
        tuple(BurnRate(w, s, by_window[w]) for w, s in windows.items()),
        tuple(p for p in WINDOW_PAIRS if p.speed in burning and pair_burning(p, by_window)),
        None,
        100.0,
        30 * 86400.0,
    )


def test_an_slo_burn_is_posted_at_once_with_the_configured_windows_and_period():
    total = SeriesSignals(slo=_slo(("fast",), w5m=100.0, w1h=20.0, w6h=8.0, w3d=0.5))
    target = TargetSignals("llm", "http://x", 0.0, True, None, (), total)
    book = step(AlertBook(), [target], now=0.0)
    [alert] = book.unsent.values()
    # The fast speed's highest long-window burn rate: the hour's.
    assert (alert.spec, alert.value) == (SLO_BURN_FAST, 20.0)
    words = AlertWords.from_settings(
        Settings(targets=(), slo_window_scale=0.01, slo_period_days=7.0)
    )
    body = payload(alert, "g", words)
    assert body["labels"] == {
        "alertname": "BatchingSLOBurnFast",
        "severity": "critical",
        "target": "llm",
    }
    assert body["annotations"]["description"] == (
        "Requests on llm miss the latency budget 20 times as fast as the SLO objective "
        "allows, over 36 s and 3 s at 14.4x, or 216 s and 18 s at 6x (both windows of a "
        "pair). This is the promise to users breaking now, not a batcher running at its "
        "ceiling: at the first pair's rate the error budget for 7 days is gone in 700 "
        "minutes. Page."
    )
    slow = step(AlertBook(), [replace_total(target, _slo(("slow",), w3d=1.5, w6h=2.0))], 0.0)
    assert [(a.spec, a.value) for a in slow.unsent.values()] == [(SLO_BURN_SLOW, 1.5)]
    # The burn stops: resolved at the next evaluation (no hold).
    resolved = step(delivered(book), [replace_total(target, _slo((), w1h=12.0))], 5.0)
    assert names(resolved) == {(SLO_BURN_FAST.name, "llm"): 5.0}


def replace_total(target: TargetSignals, slo: SloStatus) -> TargetSignals:
    return TargetSignals(
        target.target, target.url, target.t, target.up, None, (), SeriesSignals(slo=slo)
    )


def _over_budget_run(settings: SignalSettings) -> set[str]:
    """Every alert the book posts over five minutes of a vLLM with all requests at 3 s
    against a 2 s budget, 5 s apart."""
    state, window, states, book, posted = (
        VllmState(),
        Window(60.0, settings),
        {},
        AlertBook(),
        set(),
    )
    state.running, state.waiting, state.kv_usage = 4, 0, 0.3
    for i in range(60):
        t = 5.0 * i
        state.finish(20, 3.0, 40)
        window.add(Snapshot("llm", t, True, read_series(render(state), "vllm")))
        signals_now, states = evaluate_window(TargetIdentity("llm", "x"), window, states, t)
        book = step(book, [signals_now], t)
        posted |= {alert.spec.name for alert in book.unsent.values()}
        book = delivered(book)
    return posted


def test_a_target_without_an_objective_posts_nothing_new_however_slow():
    # Every request misses the budget: with an objective the promise is broken at 100x
    # (both burn alerts, once the history covers their short windows: 3 s and 216 s at
    # the 0.01 scale); without one, only what was posted before: budget saturation (the
    # median at 150% of the budget for the hold), nothing else.
    without = _over_budget_run(SignalSettings(cap=4, budget_seconds=2.0, quantile=0.5))
    assert without == {BUDGET_SATURATED.name}
    held = _over_budget_run(
        SignalSettings(
            cap=4, budget_seconds=2.0, quantile=0.5, slo_objective=0.99, slo_window_scale=0.01
        )
    )
    assert {SLO_BURN_FAST.name, SLO_BURN_SLOW.name} <= held
    assert held - without == {SLO_BURN_FAST.name, SLO_BURN_SLOW.name}


@pytest.mark.integration
def test_the_exporter_cli_posts_the_configured_numbers_to_a_real_alertmanager(tmp_path):
    # The whole path: flags, the exporter's own hold, its post, Alertmanager, the webhook.
    state = VllmState(running=8, waiting=20, kv_usage=0.5)

    def scripted() -> str:
        state.finish(10, 1.2, 100)  # p99 1.495 s against a 1.3 s budget: 115%
        return render(state)

    (tmp_path / "am").mkdir()
    with (
        payload_server(scripted) as target_url,
        webhook() as hook,
        alertmanager(tmp_path / "am", hook.url) as am,
        exporter(
            tmp_path,
            "--target",
            target_url,
            "--name",
            "llm",
            "--engine",
            "vllm",
            "--budget-seconds",
            "1.3",
            "--interval",
            "1",
            "--saturation-threshold",
            "0.9",
            "--hold-seconds",
            "3",
            "--alertmanager-url",
            am.url,
        ) as exp,
    ):
        wait_until(
            lambda: hook.alerts(BUDGET_SATURATED.name),
            60,
            "BatchingBudgetSaturated from the exporter",
            exp.log,
        )
        [firing] = hook.alerts(BUDGET_SATURATED.name)
    assert firing["annotations"]["summary"] == "llm: latency budget saturated for 3 s"
    assert "stayed at or above 90% of the budget for 3 s" in firing["annotations"]["description"]
