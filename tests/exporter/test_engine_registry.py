"""One engine registry: an adapter added to ADAPTERS is known everywhere it matters."""

from __future__ import annotations

import argparse
import re
from types import ModuleType

import pytest

from batchscope.exporter import engines
from batchscope.exporter.config.flags import add_arguments, settings_from_args
from batchscope.exporter.config.fleet_file import load_config
from batchscope.exporter.config.settings import ConfigError
from batchscope.exporter.core.snapshot import SeriesSnapshot
from batchscope.exporter.engines import detect, engine_choices, latency_kinds, read_series
from batchscope.exporter.engines.grouping import SamplesByName, histograms_by_key, values_by_key
from tests.support.metrics_doc import DOC, undocumented_engines
from tests.support.paths import REPO, fixture_text

PAYLOAD = """\
# TYPE example:requests_running gauge
example:requests_running 3
# TYPE example:requests_waiting gauge
example:requests_waiting 2
# TYPE example:prefill_time_seconds histogram
example:prefill_time_seconds_bucket{le="0.05"} 40
example:prefill_time_seconds_bucket{le="+Inf"} 50
example:prefill_time_seconds_sum 2.0
example:prefill_time_seconds_count 50
"""
FLEET = "targets:\n  - url: http://127.0.0.1:8080/metrics\n    engine: example\n    histogram: prefill\n"


def example_adapter() -> ModuleType:
    """An adapter module as a new engine's file would define it, with a new latency kind."""
    adapter = ModuleType("example")
    adapter.NAME = "example"
    adapter.MARKER = "example:"
    adapter.KEY_LABELS = ()
    adapter.LATENCY_FAMILIES = {"prefill": "example:prefill_time_seconds"}
    adapter.FAMILIES = (
        "example:requests_running",
        "example:requests_waiting",
        *adapter.LATENCY_FAMILIES.values(),
    )

    def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
        running = values_by_key(by_name, "example:requests_running", ())
        waiting = values_by_key(by_name, "example:requests_waiting", ())
        prefill = histograms_by_key(by_name, "example:prefill_time_seconds", ())
        return [
            SeriesSnapshot(
                key=(),
                engine="example",
                running=running.get(()),
                waiting=waiting.get(()),
                latency={"prefill": prefill[()]} if () in prefill else {},
            )
        ]

    adapter.to_series = to_series
    return adapter


@pytest.fixture
def registered(monkeypatch) -> ModuleType:
    """The one line a new engine adds: its module in ADAPTERS."""
    adapter = example_adapter()
    monkeypatch.setitem(engines.ADAPTERS, adapter.NAME, adapter)
    return adapter


def test_the_choices_are_the_registered_adapters_and_the_kinds_they_fill() -> None:
    assert engine_choices() == (
        "auto",
        "vllm",
        "inhouse",
        "sglang",
        "tgi",
        "trtllm",
        "triton",
        "rayserve",
        "llamacpp",
    )
    assert latency_kinds() == ("e2e", "ttft", "queue", "inference", "tpot", "itl")


def test_an_unregistered_engine_is_refused_by_the_config(tmp_path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}:3: targets[0].engine: must be one of auto, vllm, inhouse, sglang, tgi, "
        "trtllm, triton, rayserve, llamacpp (got 'example')"
    )


def test_a_registered_engine_and_its_latency_kind_are_accepted_by_yaml(tmp_path, registered):
    assert engine_choices()[-1] == "example"
    assert latency_kinds() == ("e2e", "ttft", "queue", "inference", "tpot", "itl", "prefill")
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    (target,) = load_config(path).targets
    assert (target.name, target.engine, target.histogram) == (
        "127.0.0.1:8080",
        "example",
        "prefill",
    )


def test_a_registered_engine_is_accepted_by_the_flags(registered) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--target", "http://127.0.0.1:8080", "--engine", "example", "--histogram", "prefill"]
    )
    (target,) = settings_from_args(args).targets
    assert (target.url, target.engine, target.histogram) == (
        "http://127.0.0.1:8080/metrics",
        "example",
        "prefill",
    )


def test_a_registered_engine_is_detected_by_auto(registered) -> None:
    assert detect(PAYLOAD) == ["example"]
    (series,) = read_series(PAYLOAD, "auto")
    assert (series.engine, series.running, series.waiting) == ("example", 3.0, 2.0)
    assert series.latency["prefill"].count == 50.0
    assert series.latency["prefill"].counts == (40.0, 50.0)


def test_the_unrecognised_payload_message_lists_every_registered_engine(registered) -> None:
    with pytest.raises(engines.UnrecognisedPayload) as caught:
        read_series("<html>hello</html>")
    assert str(caught.value) == (
        "no known engine's metrics in the payload (looked for vllm vllm:*, "
        "inhouse batchscope_batcher_*, sglang sglang:*, tgi tgi_*, trtllm nv_trt_llm_*, "
        "triton nv_inference_*, rayserve ray_serve_*, llamacpp llamacpp:*, example example:*)"
    )


def test_a_registered_engine_must_be_documented_in_metrics_md(registered) -> None:
    assert undocumented_engines(DOC, engines.ADAPTERS) == {
        "example": [
            "a row in 'What the exporter reads'",
            "example:requests_running",
            "example:requests_waiting",
            "example:prefill_time_seconds",
        ]
    }
    row = (
        "| Example (`example`) | `example:requests_running`, "
        "`example:requests_waiting`, `example:prefill_time_seconds` | running |\n"
    )
    documented = DOC.replace("\n\nvLLM labels series", "\n" + row + "\nvLLM labels series", 1)
    assert documented != DOC
    assert undocumented_engines(documented, engines.ADAPTERS) == {}


def test_every_adapter_fills_only_the_latency_kinds_it_declares() -> None:
    payloads = {
        "vllm": fixture_text("vllm-0.32.0-cpu-load.txt"),
        "sglang": fixture_text("sglang-0.4-docs.txt"),
        "triton": fixture_text("triton-23.11-docs.txt"),
        "tgi": fixture_text("tgi-3.x-b.txt"),
        "trtllm": fixture_text("trtllm-triton-24.07-b.txt"),
        "rayserve": fixture_text("rayserve-2.50-b.txt"),
        "llamacpp": fixture_text("llamacpp-b4500-b.txt"),
    }
    filled = {
        name: {kind for s in read_series(text, name) for kind in s.latency}
        for name, text in payloads.items()
    }
    assert filled == {
        "vllm": {"e2e", "ttft", "queue", "inference", "tpot", "itl"},
        "sglang": {"e2e", "ttft", "tpot"},
        "triton": set(),
        "tgi": {"e2e", "queue", "inference"},
        "trtllm": set(),  # its latencies come from Triton's families, the triton adapter's
        "rayserve": {"queue", "inference"},
        "llamacpp": set(),
    }
    for name, kinds in filled.items():
        assert kinds <= set(engines.ADAPTERS[name].LATENCY_FAMILIES), name


def test_the_configuration_doc_lists_every_engine_and_latency_kind() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    rows = {
        line.split("|")[1].strip(): line for line in doc.splitlines() if line.startswith("| `--")
    }
    engine_row = rows["`--engine`"].split("|")[3]
    assert tuple(dict.fromkeys(re.findall(r"`(\w+)`", engine_row))) == engine_choices()
    histogram_row = rows["`--histogram`"].split("|")[3]
    assert tuple(re.findall(r"`(\w+)`", histogram_row)) == latency_kinds()
