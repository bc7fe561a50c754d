"""End to end: the headline alert through a real Prometheus and Alertmanager while
Prometheus' scrapes of the exporter keep failing.

A scripted vLLM holds budget utilisation at 1.21, the exporter scrapes it, and Prometheus
scrapes the exporter through a proxy that makes every third answer slower than
Prometheus' scrape timeout: each such scrape fails and leaves stale markers, which
restarted the old rule's `for:` every few seconds. BatchingBudgetSaturated must reach
the webhook once the exporter's hold has passed, and stay firing through the gaps.
The hold is shortened by setting (`hold_seconds`, the rules' config), not by a code path.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from batchscope.grafana.build import rule_yaml
from batchscope.grafana.config import CONFIG
from batchscope.grafana.rules import exporter_alerts
from tests.support.monitoring_stack import (
    alertmanager,
    exporter,
    http_get,
    payload_server,
    prometheus,
    query,
    serving,
    wait_until,
    webhook,
)
from tests.support.vllm_payload import VllmState, render

pytestmark = pytest.mark.slow

HOLD = 10
BUDGET = 1.495 / 1.21  # p99 1.495 s (requests of 1.2 s): utilisation 1.21
SLOW_EVERY = 3


@contextmanager
def slow_proxy(upstream: str, delay: float, every: int) -> Iterator[tuple[str, dict]]:
    """Forward GETs to `upstream`, holding every `every`-th answer back `delay` seconds;
    yields the proxy's base URL and its counts (requests, delayed)."""
    counts = {"requests": 0, "delayed": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            with lock:
                counts["requests"] += 1
                slow = counts["requests"] % every == 0
                counts["delayed"] += slow
            with urllib.request.urlopen(upstream + self.path, timeout=10) as response:
                body, kind = response.read(), response.headers["Content-Type"]
            if slow:
                time.sleep(delay)
            try:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # Prometheus gave up on this scrape: that is the point

        def log_message(self, *args):
            pass

    with serving(Handler) as server:
        yield f"127.0.0.1:{server.server_address[1]}", counts


def failed_scrapes(prom) -> int:
    """Prometheus' failed scrapes of the exporter so far: its `up == 0` samples."""
    job = 'up{job="batchscope-exporter"}'
    result = query(prom, f"count_over_time({job}[10m]) - sum_over_time({job}[10m])")
    return int(float(result[0]["value"][1])) if result else 0


def test_saturation_fires_and_stays_firing_while_prometheus_misses_scrapes(tmp_path: Path):
    state = VllmState(running=8, waiting=20, kv_usage=0.5)

    def scripted() -> str:
        state.finish(10, 1.2, 100)
        return render(state)

    for name in ("am", "prometheus"):
        (tmp_path / name).mkdir()
    config = {**CONFIG, "saturation_hold_seconds": HOLD}
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
            "--cap",
            "8",
            "--budget-seconds",
            str(BUDGET),
            "--interval",
            "1",
            "--hold-seconds",
            str(HOLD),
        ) as exp,
        slow_proxy(exp.url, delay=2.0, every=SLOW_EVERY) as (proxy, counts),
        prometheus(
            tmp_path / "prometheus",
            [{"job_name": "batchscope-exporter", "static_configs": [{"targets": [proxy]}]}],
            {"exporter-alerts.yml": rule_yaml(exporter_alerts(config))},
            alertmanager_url=am.url,
            resend_delay=None,  # Prometheus' default: an alert sent stays valid 4 minutes
        ) as prom,
    ):
        wait_until(
            lambda: hook.alerts("BatchingBudgetSaturated"),
            90,
            "BatchingBudgetSaturated at the webhook",
            exp.log,
        )
        missed_at_fire = failed_scrapes(prom)
        # Firing, and still firing after three more failed scrapes.
        wait_until(
            lambda: failed_scrapes(prom) >= missed_at_fire + 3,
            60,
            "three more failed scrapes of the exporter",
            exp.log,
        )
        missed = failed_scrapes(prom)
        firing = query(prom, 'ALERTS{alertname="BatchingBudgetSaturated", alertstate="firing"}')
        resolved = hook.alerts("BatchingBudgetSaturated", "resolved")
        history = json.loads(http_get(f"{exp.url}/api/v1/history?target=llm"))["points"]
    # What is under test is Prometheus' failed scrapes, whatever failed them: the proxy's
    # delays, or on a loaded machine the exporter's own slow answer. So the count asserted
    # is Prometheus' (`up == 0`), and the proxy need only have delayed at least once.
    assert missed >= missed_at_fire + 3 >= 4, (missed_at_fire, missed)
    assert counts["delayed"] >= 1, counts
    assert missed_at_fire >= 1  # the old rule's for: restarted at each of these
    [alert] = {a["labels"]["target"]: a for a in hook.alerts("BatchingBudgetSaturated")}.values()
    assert alert["labels"] == {
        "alertname": "BatchingBudgetSaturated",
        "severity": "warning",
        "target": "llm",
    }
    assert alert["annotations"]["description"].startswith("Budget utilisation on llm is 121%")
    # The rules were generated with this hold: their words state it.
    assert alert["annotations"]["summary"] == f"llm: latency budget saturated for {HOLD} s"
    # Not before the hold: the exporter said saturated only once the episode had lasted
    # it (its own times), and Prometheus fires on that.
    onset = next(p for p in history if p["budget_utilization"] is not None)["t"]
    first = next(p for p in history if p["budget_saturated"])
    assert first["t"] - onset >= HOLD, (onset, first)
    assert firing, "the alert stopped firing at a missed scrape"
    assert resolved == []
    print(
        f"\nsaturated {first['t'] - onset:.1f} s after the onset; Prometheus missed "
        f"{missed_at_fire} scrapes of the exporter by then, {missed} in all; {counts}"
    )


def test_slow_proxy_delays_every_third_answer():
    # The proxy itself, so that the test above cannot pass with a proxy that never delays.
    with (
        payload_server(lambda: "x 1\n") as upstream,
        slow_proxy(upstream.rsplit("/", 1)[0], delay=0.3, every=3) as (proxy, counts),
    ):
        seconds = []
        for _ in range(6):
            t0 = time.monotonic()
            with urllib.request.urlopen(f"http://{proxy}/metrics", timeout=5) as r:
                assert r.read() == b"x 1\n"
            seconds.append(time.monotonic() - t0)
    assert counts == {"requests": 6, "delayed": 2}
    assert seconds[2] >= 0.3 and seconds[5] >= 0.3, seconds
