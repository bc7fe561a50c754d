"""The dashboard's pure parts: formatting, ordering, episodes, calculator, load test files,
Prometheus history and the continuous batching checklist."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from batchscope.dashboard.calculator import (
    MIXED_LENGTHS,
    TOY_EXAMPLES,
    continuous_picture,
    static_picture,
    summarize_lengths,
)
from batchscope.dashboard.client import SourceError, check_api_version
from batchscope.dashboard.episodes import burn_episodes, burn_episodes_frame, saturation_episodes
from batchscope.dashboard.formatting import percent, plain_markdown, seconds
from batchscope.dashboard.frames import (
    SORTS,
    first_matching,
    fleet_frame,
    fleet_page,
    fleet_rows,
    history_frame,
    series_choices,
    series_points,
)
from batchscope.dashboard.load_results import ResultError, good_share, load_result, run_from_record
from batchscope.dashboard.next_steps import advice_rows, advice_value, checklist, limit_bars
from batchscope.dashboard.prometheus import history_query, points_from_matrix
from batchscope.dashboard.states import look
from batchscope.dashboard.time_frames import TimeFrames, banner_text
from batchscope.exporter.core.static_util import exact_static_utilization


def test_percentages_are_percentages() -> None:
    assert percent(0.9) == "90%"
    assert percent(0.5234375, 1) == "52.3%"
    assert percent(None) == "–"
    assert seconds(0.045) == "45 ms"
    assert seconds(4.975) == "4.97 s"


def test_target_text_cannot_become_markdown_or_html() -> None:
    assert plain_markdown("**x** <b>y</b> $z$ :red[w]") == (
        r"\*\*x\*\* \<b\>y\</b\> \$z\$ \:red\[w\]"
    )


def test_an_unknown_api_major_version_is_refused_in_words() -> None:
    assert check_api_version({"api_version": 1, "targets": []}, "u") == {
        "api_version": 1,
        "targets": [],
    }
    assert check_api_version({"targets": []}, "u") == {"targets": []}
    with pytest.raises(SourceError, match="speaks API version 2; this dashboard reads version 1"):
        check_api_version({"api_version": 2}, "http://x/api/v1/signals")


def _target(name: str, state: str, utilization: float | None = None, kv: float | None = None):
    return {
        "target": name,
        "up": state != "down",
        "error": None,
        "total": {
            "diagnosis": {"state": state, "reason": f"{name} reason"},
            "budget_utilization": utilization,
            "kv_cache_usage": kv,
        },
        "series": [],
    }


def test_fleet_table_is_worst_first() -> None:
    doc = {
        "targets": [
            _target("ok", "healthy"),
            _target("full", "memory_bound", 0.5, 0.97),
            _target("fuller", "memory_bound", 0.7, 0.91),
            _target("gone", "down"),
            _target("new", "some_new_state"),
            _target("hot", "budget_saturated", 1.2),
            _target("stuck", "stalled"),
        ]
    }
    frame = fleet_frame(doc)
    assert list(frame["target"]) == ["gone", "hot", "stuck", "fuller", "full", "new", "ok"]
    assert list(frame["state"])[-2:] == ["some new state", "healthy"]
    assert look("memory_bound").hex == look("memory_bound").hex != look("healthy").hex


def test_the_chosen_target_is_the_table_s_own_choice_without_building_the_table() -> None:
    doc = {
        "targets": [
            _target(f"t{i:02d}", state, 0.1 * i)
            for i, state in enumerate(["healthy", "memory_bound", "down", "idle"] * 12)
        ]
    }
    rows = fleet_rows(doc)
    for sort in SORTS:
        frame = fleet_frame(doc, sort)
        for text in ("", "memory", "t1", "T0", "nothing matches"):
            table = fleet_page(frame, text)
            names = table.matching["target"].tolist()
            for preferred in (None, "t05", "t13", "gone"):
                expected = preferred if preferred in names else (names[0] if names else None)
                assert first_matching(rows, text, sort, preferred) == expected
            # a page of the filtered rows is the page fleet_page gives
            for page in (0, 1, 2, 9):
                paged = table.at_page(page)
                again = fleet_page(frame, text, page)
                assert paged.rows.equals(again.rows) and paged.page == again.page
    assert fleet_page(fleet_frame(doc), "").pages == 3


def test_fleet_table_reads_the_worst_series_when_the_total_has_no_budget() -> None:
    # An LLM beside a batcher with its own budget: the total keeps no latency.
    mixed = _target("demo", "budget_saturated")
    mixed["series"] = [
        {"budget_utilization": 0.4, "budget_saturated_seconds": 0.0},
        {"budget_utilization": 1.3, "budget_saturated_seconds": 75.0},
    ]
    frame = fleet_frame({"targets": [mixed, _target("ok", "budget_saturated", 1.1)]})
    assert list(frame["target"]) == ["demo", "ok"]
    assert frame["budget_utilization"].tolist() == [1.3, 1.1]
    assert frame["saturated_seconds"].tolist()[0] == 75.0


def test_series_choices_name_each_model() -> None:
    target = {
        "total": {"running": 5},
        "series": [
            {"labels": {"model_name": "a", "engine": "0"}, "running": 2},
            {"labels": {"model_name": "b", "engine": "0"}, "running": 3},
        ],
    }
    # The model's name, not its raw labels (it once read "model_name=a, engine=0").
    choices = series_choices(target)
    assert list(choices) == ["all models (target total)", "a", "b"]
    assert choices["b"]["running"] == 3
    # Two engines serving one model: the name, and the label that tells them apart.
    twins = {
        "series": [
            {"labels": {"model_name": "a", "engine": "0"}, "running": 2},
            {"labels": {"model_name": "a", "engine": "1"}, "running": 4},
            {"labels": {"batcher": "embeddings"}, "running": 1},
        ]
    }
    assert list(series_choices(twins))[1:] == ["a (engine=0)", "a (engine=1)", "embeddings"]


def _history(flags: list[bool], utilization: list[float], **extra) -> pd.DataFrame:
    points = [
        {
            "t": 100.0 + 5 * i,
            "budget_saturated": f,
            "budget_utilization": u,
            **{k: v[i] for k, v in extra.items()},
        }
        for i, (f, u) in enumerate(zip(flags, utilization, strict=True))
    ]
    return history_frame(points)


def test_saturation_episodes_have_start_end_and_peak() -> None:
    frame = _history(
        [False, True, True, True, False, False, True, True],
        [0.5, 1.0, 1.3, 0.97, 0.8, 0.99, 1.1, 1.05],
    )
    first, second = saturation_episodes(frame, "t1")
    assert (first.start, first.end, first.peak_utilization) == (105.0, 120.0, 1.3)
    assert (second.start, second.end, second.peak_utilization) == (130.0, None, 1.1)
    assert second.seconds(now=150.0) == 20.0


def test_an_episode_starts_when_utilisation_reached_the_threshold() -> None:
    frame = _history(
        [False, True, False], [0.99, 1.0, 0.5], budget_saturated_seconds=[0.0, 60.0, 0.0]
    )
    (episode,) = saturation_episodes(frame)
    assert (episode.start, episode.end) == (105.0 - 60.0, 110.0)


def test_burn_episodes_have_their_speed_start_end_and_lowest_attainment() -> None:
    frame = _history(
        [False] * 6,
        [0.5] * 6,
        slo_burning_fast=[False, True, True, False, False, False],
        slo_burning_slow=[False, True, True, True, True, True],
        slo_attainment=[0.99, 0.2, 0.1, 0.9, 0.95, 0.97],
    )
    fast, slow = burn_episodes(frame, "t1")
    assert (fast.speed, fast.start, fast.end, fast.lowest_attainment) == ("fast", 105.0, 115.0, 0.1)
    assert (slow.speed, slow.start, slow.end) == ("slow", 105.0, None)
    table = burn_episodes_frame([fast, slow], now=130.0)
    assert list(table["alert"]) == ["BatchingSLOBurnFast (page)", "BatchingSLOBurnSlow (ticket)"]
    assert list(table["duration_seconds"]) == [10.0, 25.0]
    # A history from before the SLO signals (or without an objective): no episode.
    assert burn_episodes(_history([False, False], [0.5, 0.5])) == []


def test_slot_pictures_match_the_articles_example_and_the_exact_count() -> None:
    lengths = TOY_EXAMPLES[MIXED_LENGTHS]
    static = static_picture(lengths, 8)
    assert (static.useful_slot_steps, static.total_slot_steps) == (67, 128)
    assert static.utilization == 0.5234375
    assert static.grid[0].tolist() == [0, 0, 0] + [-1] * 13  # 3 tokens, then idle
    continuous = continuous_picture(lengths, 8, 16)
    assert (continuous.useful_slot_steps, continuous.total_slot_steps) == (128, 128)
    assert continuous.grid[0].tolist()[:4] == [0, 0, 0, 8]  # the next request takes the slot
    partial = static_picture([2, 3, 1], 2)
    assert partial.total_slot_steps == exact_static_utilization([2, 3, 1], 2).total_slot_steps


def test_lengths_are_summarised_in_chunks_with_progress() -> None:
    seen: list[int] = []
    text = "\n".join(str(i % 7 + 1) for i in range(200_000))
    summary = summarize_lengths(io.StringIO(text), "x", [8, 32], progress=seen.append)
    assert seen[-1] == 200_000 and len(seen) >= 3
    lengths = [i % 7 + 1 for i in range(200_000)]
    assert summary.results[8] == exact_static_utilization(lengths, 8)
    assert summary.results[32] == exact_static_utilization(lengths, 32)
    assert summary.first == lengths[:64]
    assert summary.counts[7] == sum(1 for v in lengths if v == 7)


def test_vllm_bench_names_are_read_beside_loadgen_names() -> None:
    run = run_from_record(
        {
            "request_rate": "inf",
            "request_throughput": 12.5,
            "median_e2el_ms": 40.0,
            "p99_e2el_ms": 90.0,
            "p99_ttft_ms": 5.0,
            "max_concurrency": 16,
        },
        "bench.json",
    )
    assert (run.rate_per_s, run.throughput_per_s) == (float("inf"), 12.5)
    assert (run.p50_ms, run.p99_ms) == (40.0, 90.0)
    assert run.setting == "max_concurrency=16"
    loadgen = run_from_record(
        {
            "setting": {"b": 2, "a": 1},
            "rate_per_s": 5,
            "throughput_per_s": 4.9,
            "p50_ms": 10,
            "p99_ms": 30,
        },
        "s",
    )
    assert (loadgen.setting, loadgen.p99_ms) == ("a=1, b=2", 30.0)


def test_goodput_share_is_exact_with_latencies_and_bounded_without() -> None:
    exact = run_from_record({"request_throughput": 1.0, "latencies": [0.1, 0.2, 0.3, 2.0]}, "v")
    assert good_share(exact, 250.0) == (0.5, 0.5)
    bounded = run_from_record({"throughput_per_s": 1.0, "p50_ms": 100, "p99_ms": 500}, "l")
    assert good_share(bounded, 200.0) == (0.5, 0.99)
    assert good_share(bounded, 600.0) == (0.99, 1.0)
    assert good_share(bounded, 50.0) == (0.0, 0.5)


def test_a_file_without_runs_is_refused() -> None:
    with pytest.raises(ResultError, match="no run found"):
        load_result('{"hello": 1}', "x.json")
    assert len(load_result('{"runs": [{"rate_per_s": 1, "p99_ms": 3}]}', "y.json")) == 1


def test_prometheus_range_results_become_history_points() -> None:
    result = [
        {
            "metric": {"__name__": "batchscope_budget_utilization_ratio", "target": "a"},
            "values": [[10, "0.5"], [20, "1.2"]],
        },
        {
            "metric": {
                "__name__": "batchscope_budget_utilization_ratio",
                "target": "a",
                "model_name": "m",
            },
            "values": [[10, "9"]],
        },
        {
            "metric": {"__name__": "batchscope_budget_saturated", "target": "a"},
            "values": [[10, "0"], [20, "1"]],
        },
        {
            "metric": {
                "__name__": "batchscope_static_utilization_ratio",
                "target": "a",
                "bound": "lower",
            },
            "values": [[10, "0.1"]],
        },
        {
            "metric": {
                "__name__": "batchscope_static_utilization_ratio",
                "target": "a",
                "bound": "estimate",
            },
            "values": [[10, "0.6"]],
        },
        {
            "metric": {"__name__": "batchscope_diagnosis", "target": "a", "state": "healthy"},
            "values": [[10, "1"], [20, "0"]],
        },
        {
            "metric": {"__name__": "batchscope_slo_burning", "target": "a", "speed": "fast"},
            "values": [[20, "1"]],
        },
        {
            "metric": {
                "__name__": "batchscope_slo_attainment_ratio",
                "target": "a",
                "bound": "lower",
            },
            "values": [[20, "0.1"]],
        },
        {
            "metric": {
                "__name__": "batchscope_slo_attainment_ratio",
                "target": "a",
                "bound": "estimate",
            },
            "values": [[20, "0.2"]],
        },
        {
            "metric": {
                "__name__": "batchscope_diagnosis",
                "target": "a",
                "state": "budget_saturated",
            },
            "values": [[10, "0"], [20, "1"]],
        },
    ]
    assert points_from_matrix(result) == [
        {
            "t": 10.0,
            "budget_utilization": 0.5,
            "budget_saturated": False,
            "static_utilization": 0.6,
            "diagnosis": "healthy",
        },
        {
            "t": 20.0,
            "budget_utilization": 1.2,
            "budget_saturated": True,
            "slo_burning_fast": True,
            "slo_attainment": 0.2,
            "diagnosis": "budget_saturated",
        },
    ]
    assert history_query('we"ird').endswith(',target="we\\"ird"}')


def test_checklist_answers_the_articles_questions_from_the_signals() -> None:
    series = {
        "running": 3,
        "waiting": 5,
        "cap": 8,
        "running_vs_cap": 0.375,
        "preemptions_per_second": 0.5,
        "static_utilization": None,
    }
    near_cap, preempted, static = checklist(series)
    assert not near_cap.ok and near_cap.answer == (
        "running 3 of 8 (38%) while 5 wait: something else limits the batch"
    )
    assert not preempted.ok and preempted.answer == "0.50 preemptions/s"
    assert static.ok is None


def test_the_checklist_says_why_the_cap_cannot_be_judged() -> None:
    down = {"running": None, "waiting": None, "cap": 8, "preemptions_per_second": None}
    (near_cap, *_) = checklist(down)
    assert near_cap.ok is None
    assert near_cap.answer == (
        "unknown: the running batch is not read now (the target is down, or does not expose it)"
    )
    (near_cap, *_) = checklist({**down, "running": 3, "cap": None})
    assert near_cap.answer == "unknown: no cap configured for this target"


def test_one_models_history_is_picked_from_the_target_points() -> None:
    a, b = {"model_name": "a"}, {"model_name": "b"}
    points = [
        {
            "t": 1.0,
            "up": True,
            "running": 5,
            "series": [{"labels": a, "running": 2}, {"labels": b, "running": 3}],
        },
        {"t": 2.0, "up": True, "running": 4, "series": [{"labels": b, "running": 4}]},
    ]
    assert series_points(points, b) == [
        {"labels": b, "running": 3, "t": 1.0, "up": True},
        {"labels": b, "running": 4, "t": 2.0, "up": True},
    ]
    assert series_points(points, {"model_name": "c"}) == []
    assert "series" not in history_frame(points).columns


def test_advice_values_carry_their_units() -> None:
    assert advice_value(1, "bool") == "yes" and advice_value(0, "bool") == "no"
    assert advice_value(0.3, "ratio") == "30%"
    assert advice_value(1.91, "ratio") == "1.91x"
    assert advice_value(0.0055, "s") == "5.5 ms"
    assert advice_value(1048576, "tokens") == "1,048,576 tokens"
    assert advice_value(3.158, "requests") == "3.16 requests"
    assert advice_value(2.9999999999999996, "requests") == "3 requests"


def test_advice_rows_name_each_item_its_inputs_and_its_caveats() -> None:
    advice = {
        "items": [
            {
                "kind": "sustainable_concurrency",
                "value": 3.125,
                "unit": "requests",
                "inputs": {"kv_capacity_tokens": 1024, "kv_tokens_per_request": 327.68},
                "confidence": "medium",
                "caveats": ["short window (20 s of 5 scrapes)"],
            },
            {
                "kind": "new_kind",
                "value": 2,
                "unit": "items",
                "inputs": {},
                "confidence": "high",
                "caveats": [],
            },
        ]
    }
    assert advice_rows(advice) == [
        {
            "what": "Requests the KV cache holds at today's mix",
            "value": "3.12 requests",
            "confidence": "medium (short window (20 s of 5 scrapes))",
            "inputs": "kv_capacity_tokens 1024, kv_tokens_per_request 327.68",
        },
        {"what": "new_kind", "value": "2 items", "confidence": "high", "inputs": ""},
    ]
    assert advice_rows({"items": [], "summary": "too little data"}) == []


def test_limit_bars_mark_the_binding_limit_and_list_what_was_not_judged() -> None:
    limits = {
        "readings": [
            {"limit": "requests", "ratio": 1.0, "exposed": True, "reading": "8 of 8 running"},
            {"limit": "kv_cache", "ratio": 0.02, "exposed": True, "reading": "2% used"},
            {
                "limit": "token_budget",
                "ratio": 1.2,
                "exposed": True,
                "reading": "77.0 tokens per step of a 64-token budget",
            },
            {"limit": "deferred", "ratio": None, "exposed": False, "reading": "not said"},
            {"limit": "arrivals", "ratio": None, "exposed": True, "reading": "3 wait"},
        ],
        "binding": "requests",
        "at_bound": ["requests", "token_budget"],
    }
    headline, bars, unjudged = limit_bars(limits)
    assert headline == (
        "Binding now: **requests (the cap, --max-num-seqs)**; also at its bound: token budget "
        "(--max-num-batched-tokens)."
    )
    assert [(b.label, b.fill, b.binding) for b in bars] == [
        ("requests (the cap, --max-num-seqs)", 1.0, True),
        ("KV cache", 0.02, False),
        ("token budget (--max-num-batched-tokens)", 1.0, False),  # 120%, drawn full
    ]
    assert bars[0].text == "▶ requests (the cap, --max-num-seqs): 100% of its bound, 8 of 8 running"
    assert bars[2].text.startswith("token budget (--max-num-batched-tokens): 120% of its bound")
    assert unjudged == ["deferred requests: not said"]
    assert limit_bars({})[0] == "Not judged: the target was not read."
    unbound = {"binding": None, "readings": [{"limit": "requests", "ratio": 0.0}]}
    assert limit_bars(unbound)[0] == "No limit binds: the gauges read nothing running or waiting."


def test_a_saturation_banner_is_the_diagnosis_or_says_why_it_is_held() -> None:
    frames = TimeFrames.of({"evaluation": {"hold_seconds": 20.0, "saturation_threshold": 0.95}})
    reason = "latency has stayed at or above 95% of the budget for 57 s (saturated after 20 s)"
    read = {
        "target": "llm",
        "up": True,
        "error": None,
        "total": {
            "budget_saturated_seconds": 57.01,
            "diagnosis": {"state": "budget_saturated", "reason": reason},
        },
    }
    assert banner_text(read, frames) == (
        "**Budget saturated: llm**. Latency has stayed at or above 95% of the budget for 57 s "
        "\\(saturated after 20 s\\)."
    )
    # read now, but a window of one scrape measured nothing: held, and said so
    unmeasured = {**read, "total": {**read["total"], "diagnosis": {"state": "idle"}}}
    assert banner_text(unmeasured, frames).startswith(
        "**Budget saturated: llm**. Utilisation has stayed at or above 95% for 20 s and the "
        "episode has lasted 57 s; the last evaluation measured no latency"
    )
    down = {**unmeasured, "up": False, "error": "timed out"}
    assert "; the last scrape could not read the target, and nothing" in banner_text(down, frames)

    # read now, nothing running, but the window measured latency: not "no latency"
    idle = {
        **read,
        "total": {
            **read["total"],
            "latency_seconds": 0.116,
            "budget_utilization": 2.32,
            "window_seconds": 20.0,
            "diagnosis": {"state": "idle", "reason": "no request is running or waiting"},
        },
    }
    assert "measured no latency" not in banner_text(idle, frames)
    assert (
        "lasted 57 s; the diagnosis now reads idle (no request is running or waiting), while "
        "latency over the last 20 s stands at 232% of the budget, and nothing measured since"
    ) in banner_text(idle, frames)
