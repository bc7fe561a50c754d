"""The ingest path reads exactly what a reading without selection reads.

The selective parse and the adapters are held here against references: the full parse
of the candidate lines filtered to the same names, the samples prometheus_client reads
fed to the same adapter, and a plain re-statement of the histogram assembly.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.core.histogram import Histogram
from batchscope.exporter.engines import families_read, read_series, vllm
from batchscope.exporter.engines.grouping import histograms_by_key, values_by_key
from batchscope.exporter.ingest import promtext
from batchscope.exporter.ingest.promtext import ParseError, Sample, SampleLimitExceeded
from tests.support.paths import FIXTURES

VLLM_FAMILIES = tuple(families_read(vllm, "e2e"))
WANTED = promtext.wanted_names(VLLM_FAMILIES)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Values on the edge of what a plain value is: blanks, underscores, braces, hex, words.
ODD_VALUES = [
    "1_0",
    "1}",
    "{1",
    "\t1",
    "1\r",
    "1\t2",
    "",
    "0x1",
    "nan",
    "-Inf",
    "+inf",
    "1e3",
    "-0",
    ".5",
    "infinity",
    "1 2",
    "١٢",
    "1\x0b",
    "one",
]


def _reference_outcome(text: str) -> list[Sample] | str:
    """The plain path: every line that starts (after blanks) with a family's name or a
    quoted name, and every HELP/TYPE line of a family, parsed one by one, the wanted names
    kept; or the error, as the selective parse must say."""
    candidates = [line for line in text.split("\n") if _candidate(line.lstrip())]
    try:
        return [s for s in promtext.parse("\n".join(candidates)) if s.name in WANTED]
    except ParseError:
        return "ParseError"


def _candidate(line: str) -> bool:
    if line.startswith(("{", *VLLM_FAMILIES)):
        return True
    words = line.split(None, 2)
    return (
        len(words) == 3
        and words[:2] in (["#", "HELP"], ["#", "TYPE"])
        and words[2].lstrip('"').startswith(VLLM_FAMILIES)
    )


def _selective_outcome(text: str) -> list[Sample] | str:
    try:
        return promtext.parse(text, VLLM_FAMILIES)
    except ParseError:
        return "ParseError"


def _same_outcome(ours: list[Sample] | str, reference: list[Sample] | str) -> bool:
    """Equal samples (NaN equal to NaN, -0.0 unequal to 0.0), or both refused."""
    if isinstance(ours, str) or isinstance(reference, str):
        return ours == reference
    return [repr(s) for s in ours] == [repr(s) for s in reference]


def _payloads() -> list[str]:
    """The vLLM fixtures that hold lines of the families read."""
    texts = [p.read_text() for p in sorted(FIXTURES.glob("vllm-*.txt"))]
    return [t for t in texts if any(line.startswith(VLLM_FAMILIES) for line in t.split("\n"))]


@SETTINGS
@given(
    st.sampled_from(_payloads()),
    st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(ODD_VALUES)), max_size=4),
)
def test_a_payload_with_odd_values_reads_as_its_lines_one_by_one(
    payload: str, edits: list[tuple[int, str]]
) -> None:
    lines = payload.split("\n")
    wanted_at = [i for i, line in enumerate(lines) if line.startswith(VLLM_FAMILIES)]
    for at, value in edits:
        i = wanted_at[at % len(wanted_at)]
        lines[i] = lines[i].rpartition(" ")[0] + " " + value
    text = "\n".join(lines)
    assert _same_outcome(_selective_outcome(text), _reference_outcome(text))


@SETTINGS
@given(
    st.sampled_from(_payloads()),
    st.integers(0, 10_000),
    st.sampled_from(["  ", "\t", "#", " x", "{", "}", '{a="1"}', "\r", "_total", "", "\n"]),
)
def test_a_payload_with_an_edited_head_reads_as_its_lines_one_by_one(
    payload: str, at: int, insert: str
) -> None:
    lines = payload.split("\n")
    wanted_at = [i for i, line in enumerate(lines) if line.startswith(VLLM_FAMILIES)]
    i = wanted_at[at % len(wanted_at)]
    cut = random.Random(at).randint(0, len(lines[i]))
    lines[i] = lines[i][:cut] + insert + lines[i][cut:]
    text = "\n".join(lines)
    assert _same_outcome(_selective_outcome(text), _reference_outcome(text))


def test_the_selective_parse_keeps_the_sample_limit(vllm_load: str) -> None:
    wanted = len(promtext.parse(vllm_load, VLLM_FAMILIES))
    # 69, and iteration_tokens (17), waiting_by_reason (2), rejections (4), the prefix
    # cache's queries and hits (each _total and _created), and the inference histogram
    # (25: the service part of e2e, whose quantile the replica count's headroom reads)
    assert wanted == 121
    assert len(promtext.parse(vllm_load, VLLM_FAMILIES, limit=wanted)) == wanted
    with pytest.raises(SampleLimitExceeded):
        promtext.parse(vllm_load, VLLM_FAMILIES, limit=wanted - 1)


def _reference_vllm_samples(text: str) -> list[Sample]:
    """prometheus_client's samples of the vLLM families, as promtext Samples."""
    return [
        Sample(s.name, s.labels, s.value, None)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in WANTED
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("vllm-*.txt")))
def test_read_series_equals_the_adapter_fed_by_prometheus_client(name: str) -> None:
    text = (FIXTURES / name).read_text()
    reference = vllm.to_series(promtext.by_name(_reference_vllm_samples(text)))
    try:
        ours = read_series(text, "vllm", None, "e2e")
    except ValueError:
        assert reference == []
        return
    assert repr(ours) == repr(tuple(reference))


@st.composite
def fleet_like_payloads(draw) -> str:
    """vLLM 0.32's load payload with its own model name and random moving values."""
    text = (FIXTURES / "vllm-0.32.0-cpu-load.txt").read_text()
    model = draw(st.from_regex(r"[a-z][a-z0-9/._-]{0,12}", fullmatch=True))
    rng = random.Random(draw(st.integers(0, 2**32)))
    lines = []
    for line in text.replace('model_name="/tmp/tinyllama"', f'model_name="{model}"').split("\n"):
        if line.startswith("vllm:") and rng.random() < 0.5:
            value = rng.choice(
                [
                    repr(rng.uniform(0, 1e6)),
                    str(rng.randint(0, 10**9)),
                    "NaN",
                    "+Inf",
                    "-0.0",
                    repr(rng.random()),
                ]
            )
            line = line.rpartition(" ")[0] + " " + value
        lines.append(line)
    return "\n".join(lines)


@SETTINGS
@given(fleet_like_payloads())
def test_read_series_on_moving_payloads_equals_the_adapter_fed_by_prometheus_client(
    text: str,
) -> None:
    reference = tuple(vllm.to_series(promtext.by_name(_reference_vllm_samples(text))))
    assert repr(read_series(text, "vllm", None, "e2e")) == repr(reference)


def _plain_histograms(samples: list[Sample], family: str, key_labels: tuple[str, ...]) -> dict:
    """histograms_by_key as first written: dicts of dicts, a key built per sample."""

    def key_of(labels: dict[str, str]) -> tuple:
        return tuple((k, labels[k]) for k in key_labels if k in labels)

    buckets: dict = defaultdict(dict)
    sums: dict = defaultdict(float)
    counts: dict = defaultdict(float)
    for s in samples:
        key = key_of(s.labels)
        if s.name == family + "_bucket" and "le" in s.labels:
            bound = float(s.labels["le"])
            buckets[key][bound] = buckets[key].get(bound, 0.0) + s.value
        elif s.name == family + "_sum":
            sums[key] += s.value
        elif s.name == family + "_count":
            counts[key] += s.value
    # A series with a NaN or infinite bucket, count or sum is left out, as if absent.
    return {
        key: Histogram.from_buckets(b, sums.get(key, 0.0), counts.get(key))
        for key, b in buckets.items()
        if b
        and math.isinf(max(b))
        and all(math.isfinite(v) for v in (*b.values(), sums.get(key, 0.0), counts.get(key, 0.0)))
    }


label_sets = st.fixed_dictionaries(
    {},
    optional={
        "model_name": st.sampled_from(["a", "b"]),
        "engine": st.sampled_from(["0", "1"]),
        "reason": st.sampled_from(["x", "y"]),
        "le": st.sampled_from(["0.5", "1", "+Inf", "1.0"]),
    },
)
histogram_samples = st.lists(
    st.builds(
        lambda suffix, labels, value: Sample("h" + suffix, labels, value, None),
        st.sampled_from(["_bucket", "_bucket", "_sum", "_count"]),
        label_sets,
        st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1.0]),
    ),
    max_size=30,
)


@SETTINGS
@given(histogram_samples)
def test_histograms_and_values_by_key_equal_their_plain_statement(samples: list[Sample]) -> None:
    by_name = promtext.by_name(samples)
    key_labels = vllm.KEY_LABELS
    assert repr(histograms_by_key(by_name, "h", key_labels)) == repr(
        _plain_histograms(samples, "h", key_labels)
    )
    plain: dict = defaultdict(float)
    for s in by_name.get("h_sum", ()):
        if math.isfinite(s.value):
            plain[tuple((k, s.labels[k]) for k in key_labels if k in s.labels)] += s.value
    assert repr(values_by_key(by_name, "h_sum", key_labels)) == repr(dict(plain))


# Finite values on the edge of float arithmetic: signed zeros, the largest and smallest.
EDGE_FINITE = [
    "0",
    "-0.0",
    "1.7976931348623157e+308",
    "-1.7976931348623157e+308",
    "5e-324",
    "-5e-324",
    "1e-310",
    "3",
    "0.1",
    "123456789012345678",
]


@SETTINGS
@given(st.integers(0, 2**32), st.sampled_from(["a", "b/c"]))
def test_edge_finite_values_read_as_prometheus_client_reads_them(seed: int, model: str) -> None:
    text = (FIXTURES / "vllm-0.32.0-cpu-load.txt").read_text()
    text = text.replace('model_name="/tmp/tinyllama"', f'model_name="{model}"')
    rng = random.Random(seed)
    # A histogram's counts move to values >= 0 (a negative one is refused: test_promtext_contract).
    lines = [
        line.rpartition(" ")[0]
        + " "
        + _counted(line, rng.choice(EDGE_FINITE + [repr(rng.uniform(-1e6, 1e6))]))
        if line.startswith("vllm:")
        else line
        for line in text.split("\n")
    ]
    moved = "\n".join(lines)
    reference = tuple(vllm.to_series(promtext.by_name(_reference_vllm_samples(moved))))
    assert repr(read_series(moved, "vllm", None, "e2e")) == repr(reference)


def _counted(line: str, value: str) -> str:
    """`value`, without its sign on a histogram's `_bucket` or `_count` line."""
    head = line.partition("{")[0]
    return value.lstrip("-") if head.endswith(("_bucket", "_count")) else value
