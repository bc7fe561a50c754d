"""batchscope-loadgen against a fleet: the choice of base URL for each request (pure), the
per-URL part of the result, and two demo servers loaded as the policy says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchscope.dashboard import load_format
from batchscope.demo_server.http.app import ServerConfig
from batchscope.demo_server.loadgen import arguments
from batchscope.demo_server.loadgen import run as loadgen
from batchscope.demo_server.loadgen.fleet import Balancer, Fleet, choose_replica, split_urls
from batchscope.demo_server.loadgen.report import ReplicaResult, RunResult
from tests.support.demo_http import serve

# ----------------------------------------------------------------------- the policy, pure


def test_round_robin_sends_the_nth_request_to_url_n_mod_n() -> None:
    picks = [choose_replica("round-robin", [5, 0, 0], turn) for turn in range(7)]
    # Outstanding counts do not matter to it: the first URL keeps its turn though busiest.
    assert picks == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_picks_the_fewest_and_breaks_ties_in_turn() -> None:
    assert choose_replica("least-outstanding", [3, 1, 2], 0) == 1
    assert choose_replica("least-outstanding", [3, 1, 2], 2) == 1  # no tie: turn is moot
    # A tie between URLs 0 and 2: the first at or after the turn's position wins.
    assert [choose_replica("least-outstanding", [0, 4, 0], t) for t in range(3)] == [0, 2, 2]
    # An idle fleet is loaded as round robin loads it.
    idle = [choose_replica("least-outstanding", [0, 0, 0], t) for t in range(6)]
    assert idle == [0, 1, 2, 0, 1, 2]


def test_a_balancer_counts_outstanding_requests_and_sends_around_a_slow_replica() -> None:
    balancer = Balancer(Fleet(("http://a", "http://b"), "least-outstanding"))
    # a never answers, b answers each request before the next: after the tie at the
    # start goes to a, everything goes to b.
    picks = []
    for _ in range(5):
        index = balancer.take()
        picks.append(index)
        if index == 1:
            balancer.release(1)
    assert picks == [0, 1, 1, 1, 1]
    assert balancer.outstanding == [1, 0]
    # The same arrivals in round robin keep going to a, piling up 3 outstanding there.
    balancer = Balancer(Fleet(("http://a", "http://b")))
    picks = [balancer.take() for _ in range(5)]
    assert picks == [0, 1, 0, 1, 0] and balancer.outstanding == [3, 2]


def test_base_urls_come_repeated_or_as_a_comma_list_and_never_twice() -> None:
    assert split_urls(["http://a/", "http://b, http://c"]) == ("http://a", "http://b", "http://c")
    with pytest.raises(ValueError, match="more than once: http://a"):
        split_urls(["http://a", "http://b,http://a/"])
    with pytest.raises(ValueError, match="an empty base URL"):
        split_urls(["http://a,"])
    with pytest.raises(ValueError, match="balance must be one of"):
        Fleet(("http://a",), "random")
    assert Fleet.of("http://a/") == Fleet(("http://a",), "round-robin")


def test_the_command_line_reads_a_fleet_and_keeps_one_url_as_it_was() -> None:
    parser = arguments.build_parser()
    one = parser.parse_args(["--url", "http://x"])
    assert arguments.fleet_of(one) == Fleet(("http://x",), "round-robin")
    default = parser.parse_args([])
    assert arguments.fleet_of(default).urls == ("http://127.0.0.1:8000",)
    several = parser.parse_args(
        ["--url", "http://a", "--base-url", "http://b,http://c", "--balance", "least-outstanding"]
    )
    assert arguments.fleet_of(several) == Fleet(
        ("http://a", "http://b", "http://c"), "least-outstanding"
    )


def test_a_fleets_record_says_per_url_what_it_was_sent_and_how_it_went() -> None:
    a, b = ReplicaResult("http://a"), ReplicaResult("http://b")
    result = RunResult({}, 4.0, 2.0, elapsed_s=2.0, replicas=[a, b])
    for replica, status, latency in [
        (a, 200, 10.0),
        (a, 200, 30.0),
        (a, 429, 1.0),
        (b, 200, 20.0),
        (b, "timeout", 30_000.0),
    ]:
        replica.sent += 1
        result.answered(replica, status, latency)
    record = result.record(None)
    assert list(record) == [*load_format.RECORD_FIELDS, "by_url"]
    assert record["completed"] == 3 and record["errors_by_status"] == {"429": 1, "timeout": 1}
    by_url = record["by_url"]
    assert list(by_url) == ["http://a", "http://b"]
    assert all(list(part) == list(load_format.REPLICA_FIELDS) for part in by_url.values())
    assert by_url["http://a"]["sent"] == 3 and by_url["http://a"]["completed"] == 2
    assert by_url["http://a"]["failed"] == 1 and by_url["http://a"]["request_throughput"] == 1.0
    assert by_url["http://a"]["p50_e2el_ms"] == 20.0
    assert by_url["http://b"]["errors_by_status"] == {"timeout": 1}
    assert by_url["http://b"]["mean_e2el_ms"] == 20.0  # a failure has no latency
    assert result.summary()["by_url"] == by_url
    # One URL: the record is as it always was, no `by_url`.
    single = RunResult({}, 4.0, 2.0, elapsed_s=2.0, replicas=[ReplicaResult("http://a")])
    assert list(single.record(None)) == list(load_format.RECORD_FIELDS)


# -------------------------------------------------------------- two demo servers, loaded


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[str, str]]:
    # Both pace each forward to the simulated H200's cost, so neither runs faster than
    # set here however fast this machine. `slow`: one sequence at a time, 20 times the
    # H200's step cost (about 0.7 s for a request of 32 tokens, 1.4 requests/s at most).
    # `fast`: 16 at a time at the H200's own cost (some 40 ms a request).
    slow = ServerConfig(max_num_seqs=1, device="sim:h200", sim_slowdown=20.0)
    fast = ServerConfig(max_num_seqs=16, device="sim:h200")
    with serve(slow) as slow_url, serve(fast) as fast_url:
        yield slow_url, fast_url


def finished(url: str) -> int:
    """The server's own count of generation requests finished."""
    return httpx.get(f"{url}/health", timeout=10).json()["generation"]["finished"]


def load(urls: list[str], balance: str, output: Path) -> dict:
    """One step of 6 requests/s for 3 s over the fleet; the step's `by_url`, once every
    request sent is counted at one URL, answered, and counted by that server itself."""
    before = {url: finished(url) for url in urls}
    code = loadgen.main(
        [
            *(arg for url in urls for arg in ("--url", url)),
            *("--balance", balance, "--endpoint", "completions", "--max-tokens", "32"),
            *("--rates", "6", "--duration", "3", "--keep-over-saturated"),
            *("--output", str(output)),
        ]
    )
    assert code == 0
    body = json.loads(output.read_text())
    assert body["base_urls"] == urls and body["balance"] == balance
    [run] = body["runs"]
    by_url = run["by_url"]
    assert sum(part["sent"] for part in by_url.values()) == run["sent"] >= 8
    for url, count in before.items():
        assert by_url[url]["completed"] == by_url[url]["sent"] == finished(url) - count >= 1
    return by_url


@pytest.mark.integration
def test_round_robin_loads_both_servers_alike_and_the_slow_one_queues(
    fleet: tuple[str, str], tmp_path: Path
) -> None:
    slow, fast = fleet
    by_url = load([slow, fast], "round-robin", tmp_path / "round-robin.json")
    assert abs(by_url[slow]["sent"] - by_url[fast]["sent"]) <= 1
    # Half of ~6/s is over the slow server's ~1.4/s: its backlog grows; the fast one's
    # does not.
    assert by_url[slow]["max_outstanding"] >= 3
    assert by_url[slow]["p99_e2el_ms"] > 2 * by_url[fast]["p99_e2el_ms"]


@pytest.mark.integration
def test_least_outstanding_sends_the_slow_server_only_what_it_keeps_up_with(
    fleet: tuple[str, str], tmp_path: Path
) -> None:
    slow, fast = fleet
    by_url = load([slow, fast], "least-outstanding", tmp_path / "least-outstanding.json")
    # The slow server gets a request only while it has no more outstanding than the
    # fast one, so it never holds more than one above the fast one's most, and the fast
    # one takes most of the load.
    assert by_url[slow]["max_outstanding"] <= by_url[fast]["max_outstanding"] + 1
    assert by_url[slow]["sent"] < by_url[fast]["sent"]
