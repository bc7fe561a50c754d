"""The parser under fuzzing: arbitrary text and mutations of the real payloads.

Whatever it is given, `promtext.parse` raises only ParseError, and it returns exactly
what prometheus_client's parser returns on every text that parser reads. A bounded run
here; the atheris harness (scripts/fuzz_parser.py) runs for longer by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.parser_oracle import check_parse, reference_samples
from tests.support.paths import FIXTURES, REPO

ROOT = REPO
PAYLOADS = sorted(p.read_text() for p in FIXTURES.glob("*.txt"))
# Characters that matter to the format: most mutations land on them.
SPECIAL = '{}"=\\,# \t\n_:.+-eE0123456789aINf'
ATHERIS_SEED = 1  # fixed, as the property tests' examples are (tests/conftest.py)
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

metric_names = st.one_of(
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True),
    # A few names, so that HELP/TYPE lines and samples of one family meet, with suffixes.
    st.builds(
        "".join,
        st.tuples(st.sampled_from(["h", "s"]), st.sampled_from(["", "_bucket", "_count"])),
    ),
)
# Names that need quotes (the Prometheus 3 text format), written escaped.
quoted_names = st.sampled_from(["a.b", "a.b_bucket", "é x", 'q"t', "b\\s"])
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True)
label_values = st.text(alphabet=st.sampled_from('ab \\"\n{},=é'), max_size=6)
values = st.one_of(
    # Subnormals as text: another test in the same process may set flush-to-zero.
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e3", "-0", ".5", "1.5E-7", "5e-324", "2.2e-310"]),
)
# Outside the grammar: label names with ':', Python-only number forms, stray characters.
near_misses = st.sampled_from(["1_000", "0x10", "inf", "nan", "1e", "--1", "a:b", "{", '"'])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def exposition_lines(draw, value=values, label_name=label_names) -> str:
    """A line of exposition text, valid by the format's grammar with the defaults (it may
    still break a rule: a second TYPE line, a negative count of a histogram)."""
    kind = draw(st.sampled_from(["sample", "sample", "sample", "help", "type", "blank"]))
    quoted = draw(st.booleans()) and draw(st.booleans())
    name = f'"{_escape(draw(quoted_names))}"' if quoted else draw(metric_names)
    if kind == "help":
        return f"# HELP {name} {draw(st.text(max_size=10))}"
    if kind == "type":
        kinds = ["counter", "gauge", "histogram", "summary", "untyped"]
        return f"# TYPE {name} {draw(st.sampled_from(kinds))}"
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "# a comment"]))
    keys = draw(st.lists(st.one_of(label_name, st.just('"my.label"')), max_size=3, unique=True))
    pairs = [f'{k}="{_escape(draw(label_values))}"' for k in keys]
    if "le" in keys or draw(st.booleans()):
        pairs.append(f'le="{draw(st.sampled_from(["1", "+Inf", "bla"]))}"')
    labels = ",".join(([name] if quoted else []) + pairs)
    section = f"{{{labels}}}" if labels or draw(st.booleans()) else ""
    stamp = st.one_of(st.integers(0, 2**41).map(str), st.sampled_from(["1.5", "-3", "1e3"]))
    timestamp = f" {draw(stamp)}" if draw(st.booleans()) else ""
    return f"{'' if quoted else name}{section} {draw(value)}{timestamp}"


@st.composite
def mutated_payloads(draw) -> str:
    """A real payload with a few random edits: inserts, deletions, truncation, swaps."""
    text = draw(st.sampled_from(PAYLOADS))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "delete", "truncate", "duplicate"]))
        if edit == "insert":
            text = (
                text[:at]
                + draw(st.text(alphabet=st.sampled_from(SPECIAL), min_size=1, max_size=3))
                + text[at:]
            )
        elif edit == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)) :]
        elif edit == "truncate":
            text = text[:at]
        else:
            line_end = text.find("\n", at)
            text = text[: line_end + 1] + text[at : line_end + 1] + text[line_end + 1 :]
    return text


@FUZZ
@given(st.binary(max_size=400))
def test_arbitrary_bytes_raise_only_parse_errors_and_agree(data: bytes) -> None:
    check_parse(data.decode("utf-8", errors="replace"))


@FUZZ
@given(st.lists(exposition_lines(), max_size=12).map("\n".join))
def test_valid_exposition_is_read_exactly_as_prometheus_client_reads_it(text: str) -> None:
    check_parse(text, valid=True)


@FUZZ
@given(
    st.lists(
        exposition_lines(st.one_of(values, near_misses), st.one_of(label_names, near_misses)),
        max_size=12,
    ).map("\n".join)
)
def test_near_misses_raise_only_parse_errors_and_agree_where_both_read(text: str) -> None:
    check_parse(text)


@FUZZ
@given(mutated_payloads())
def test_mutated_real_payloads_raise_only_parse_errors_and_agree(text: str) -> None:
    check_parse(text)


def test_every_real_payload_is_read_as_prometheus_client_reads_it() -> None:
    for payload in PAYLOADS:
        assert reference_samples(payload)  # the oracle has something to compare
        check_parse(payload, valid=True)


def _atheris_failure(stderr: str, artifacts: Path) -> str:
    """What a failed atheris run found: the Python exception and the input that raised it
    (the log's tail alone is libFuzzer's progress lines)."""
    start = stderr.find("Uncaught Python exception")
    found = stderr[start : start + 3000] if start >= 0 else stderr[-3000:]
    inputs = [f"{p.name}: {p.read_bytes()!r}" for p in sorted(artifacts.glob("*"))]
    return "\n".join([found, *inputs])


@pytest.mark.integration
def test_atheris_harness_runs_bounded(tmp_path: Path) -> None:
    # A fixed seed: the run is the same on every machine, so a failure here is
    # reproducible with the same flags; a longer run by hand fuzzes with fresh seeds.
    done = subprocess.run(
        [
            sys.executable,
            "scripts/fuzz_parser.py",
            f"-seed={ATHERIS_SEED}",
            "-runs=3000",
            "-max_total_time=20",
            "-rss_limit_mb=1024",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, _atheris_failure(done.stderr, tmp_path)
    assert "Done 3000 runs" in done.stderr or "DONE" in done.stderr, done.stderr[-2000:]
