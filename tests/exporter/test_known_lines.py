"""The C pass of `promtext.read_values` (`exporter/ingest/_known_lines.c`) against the
Python path it stands in for: on every engine's real payloads, and on payloads mutated
in the ways that could make a line found or lost, a head or a comment change, or a value
one that float() or the format reads otherwise. Where the C pass reads a payload, it must
return what `_known_values` returns for the lines the selection regex finds; where it
cannot be sure, it must say so and leave the payload to Python."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import pytest

from batchscope.exporter import engines
from batchscope.exporter.ingest import promtext

FIXTURES = Path(__file__).parent.parent / "fixtures"
PAYLOADS = {
    name: (FIXTURES / file).read_text()
    for name, file in [
        ("vllm", "vllm-0.32.0-cpu-load.txt"),
        ("vllm", "vllm-0.32.0-cpu-idle.txt"),
        ("vllm", "vllm-0.10.0-excerpt.txt"),
        ("sglang", "sglang-0.4-docs.txt"),
        ("tgi", "tgi-3.x-a.txt"),
        ("triton", "triton-24.05-summaries-a.txt"),
        ("llamacpp", "llamacpp-b4500-a.txt"),
    ]
}
CASES = [
    (engine, FIXTURES / file, kind)
    for engine, file in [
        ("vllm", "vllm-0.32.0-cpu-load.txt"),
        ("vllm", "vllm-0.32.0-cpu-idle.txt"),
        ("vllm", "vllm-0.10.0-excerpt.txt"),
        ("vllm", "vllm-v0-0.6-excerpt.txt"),
        ("sglang", "sglang-0.4-docs.txt"),
        ("tgi", "tgi-3.x-a.txt"),
        ("triton", "triton-24.05-summaries-a.txt"),
        ("llamacpp", "llamacpp-b4500-a.txt"),
        ("trtllm", "trtllm-triton-24.07-a.txt"),
        ("rayserve", "rayserve-2.50-a.txt"),
    ]
    for kind in (None, "e2e", "ttft")
]


def test_the_c_pass_is_built():
    """The test environment builds it (`make install`): without it every test below
    would pass by reading in Python alone."""
    assert promtext._known_lines is not None, "exporter/ingest/_known_lines.c was not built"


def _families(engine: str, kind: str | None) -> tuple[str, ...]:
    return engines._families((engine,), kind)


def _reference(text: str, families: tuple[str, ...], limit: int | None = None):
    """What read_values returned before the C pass: the selection regex, `_known_values`."""
    selection = promtext._selection(families)
    return promtext._known_values(selection, selection.lines.findall("\n" + text), limit)


def _bits(values: list[float]) -> list[bytes]:
    """Values compared bit for bit: NaN equals NaN, 0.0 is not -0.0."""
    return [struct.pack("<d", v) for v in values]


def _c_read(text: str, families: tuple[str, ...]):
    selection = promtext._selection(families)
    return promtext._known_lines.read(text, selection.known_names, selection.templates)


@pytest.mark.parametrize(("engine", "path", "kind"), CASES, ids=lambda c: getattr(c, "name", c))
def test_a_payload_read_twice_is_read_by_the_c_pass_as_python_reads_it(engine, path, kind):
    text = path.read_text()
    families = _families(engine, kind)
    promtext.clear_caches()
    first = promtext.read_values(text, families)
    expected = _reference(text, families)
    if expected is None:
        # A payload the Python path does not read as a layout keeps no template either.
        assert first is None
        assert _c_read(text, families) is None or _c_read(text, families)[1] is None
        return
    key, layout, values = _c_read(text, families)
    assert layout is expected[0]
    assert _bits(values) == _bits(expected[1])
    assert promtext.read_values(text, families) == (layout, values)


def test_the_sample_limit_holds_on_the_c_pass():
    text = PAYLOADS["vllm"]
    families = _families("vllm", "e2e")
    promtext.clear_caches()
    layout, _ = promtext.read_values(text, families)
    assert _c_read(text, families)[1] is layout  # the C pass reads it
    assert promtext.read_values(text, families, limit=len(layout)) is not None
    assert promtext.read_values(text, families, limit=len(layout) - 1) is None
    assert _reference(text, families, limit=len(layout) - 1) is None


# Lines that the selection regex finds or skips by what stands before the name, and
# values float() or the format reads in ways of their own.
_INSERTED_LINES = [
    'vllm:num_requests_running{engine="0",model_name="m"} 3',
    "  vllm:num_requests_running 4",
    "\x1cvllm:num_requests_running 5",  # a blank to the regex, not to str.strip
    "\u00a0vllm:num_requests_running 6",  # a non-ASCII blank: left to Python
    "\u2003# HELP vllm:num_requests_running x",
    "#\tTYPE vllm:num_requests_running gauge",
    "# HELP vllm:num_requests_running",
    '# HELP "vllm:num_requests_running" quoted',
    "#HELP vllm:num_requests_running glued",
    "# HELPS vllm:num_requests_running not a help line",
    '{"vllm:num_requests_running",model_name="m"} 7',
    ' {"vllm.dotted"} 1',
    "vllm:num_requests_runningX 1",
    "vllm 1",
    'python_gc_objects_collected_total{generation="0"} 1',
    "",
    "   ",
    "# a comment",
]
LONG = "1" * 65
_VALUES = [
    "1",
    "-1",
    "0",
    "-0",
    "-0.0",
    "+1",
    "1e3",
    "1E-3",
    "NaN",
    "nan",
    "+Inf",
    "-Inf",
    "inf",
    "Infinity",
    "1_000",
    "0x10",
    "1.5\r",
    " 2",
    "2 ",
    "\t3",
    "3\x0b",
    "4\x1c",
    "\u0665",
    "1\u00a0",
    "",
    "1.",
    ".5",
    LONG,
    "1e999",
    "5\x00",
    "abc",
    "1 2",
    "123.0",
    "0.000",
    "007",
    "999999999999999",
    "9999999999999999",
    "12345678901234567",
    "9007199254740993",
    "1.05",
]


def _float_reads(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _mutate(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        i = rng.randrange(len(lines))
        line = lines[i]
        head, space, word = line.rpartition(" ")
        move = rng.randrange(9)
        if move <= 2 and space:  # a new value
            lines[i] = f"{head} {rng.choice(_VALUES)}"
        elif move == 3:
            lines.insert(i, rng.choice(_INSERTED_LINES))
        elif move == 4 and len(lines) > 1:
            del lines[i]
        elif move == 5 and line:  # one character of the head changed
            j = rng.randrange(len(line))
            lines[i] = line[:j] + rng.choice(' \t{#"x_0\u00a0') + line[j + 1 :]
        elif move == 6:
            lines[i] = rng.choice([" ", "\t", "\x1c", "\r"]) + line
        elif move == 7:
            lines[i] = line + rng.choice([" 1700000000000", "\r", " ", "  1"])
        else:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], line
    return "\n".join(lines)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "triton", "llamacpp"])
def test_mutated_payloads_are_read_by_the_c_pass_as_python_reads_them_or_left_to_it(engine):
    """4,000 mutations of a payload whose template is kept: each one the C pass reads
    gives the Python path's layout and values; the rest it leaves to Python. Both happen."""
    rng = random.Random(f"known-lines-{engine}")
    text = PAYLOADS[engine]
    families = _families(engine, "e2e")
    promtext.clear_caches()
    if promtext.read_values(text, families) is None:
        pytest.fail(f"the {engine} payload is not read as a layout")
    read, left = 0, 0
    for n in range(4_000):
        mutated = _mutate(text, rng)
        c = _c_read(mutated, families)
        if c is None or c[1] is None:
            left += 1
            continue
        read += 1
        expected = _reference(mutated, families)
        assert expected is not None, (n, mutated)
        assert c[1] == expected[0], n
        assert _bits(c[2]) == _bits(expected[1]), n
    assert read >= 400, (read, left)
    assert left >= 400, (read, left)


def test_values_are_read_as_float_reads_them_or_left_to_python():
    """Every value of `_VALUES` on a found line: the C pass gives float()'s number, or
    leaves the payload to Python where float() refuses it or reads it its own way."""
    families = _families("vllm", "e2e")
    line = 'vllm:num_requests_running{engine="0",model_name="m"}'
    base = f"# TYPE vllm:num_requests_running gauge\n{line} 1\n"
    promtext.clear_caches()
    assert promtext.read_values(base, families) is not None
    outcomes = {}
    for value in _VALUES:
        c = _c_read(base.replace(" 1\n", f" {value}\n"), families)
        outcomes[value] = None if c is None or c[1] is None else c[2][0]
    for value, read in outcomes.items():
        if read is None:
            continue
        assert struct.pack("<d", read) == struct.pack("<d", float(value)), value
    read_by_c = {v for v, r in outcomes.items() if r is not None}
    # float() reads these too; the C pass leaves them to Python: `_` (the format has no
    # such numbers), non-ASCII digits or blanks, a space (another head), 64 bytes or more.
    left_to_python = {"1_000", "\u0665", "1\u00a0", " 2", "2 ", LONG}
    assert read_by_c == {v for v in _VALUES if _float_reads(v)} - left_to_python
    assert len(read_by_c) == 28
    assert math.isinf(outcomes["1e999"])


def test_a_key_collision_or_a_changed_line_falls_back_to_python():
    """A template that does not fit the lines under its key (as after a collision of the
    64-bit key) is never read from: the C pass says no template fits."""
    text = PAYLOADS["vllm"]
    families = _families("vllm", "e2e")
    promtext.clear_caches()
    promtext.read_values(text, families)
    selection = promtext._selection(families)
    ((key, template),) = selection.templates.items()
    expected, kinds, layout, samples = template
    changed = (expected[0] + "x", *expected[1:])
    selection.templates[key] = (changed, kinds, layout, samples)
    assert _c_read(text, families)[1] is None
    # The Python path reads it and keeps a template that fits again.
    assert promtext.read_values(text, families)[0] == layout
    assert _c_read(text, families)[1] == layout


def test_templates_are_forgotten_with_the_layouts_they_stand_for(monkeypatch):
    """When the layouts are cleared (their bound), the templates go too: a template kept
    past it would read a payload whose heads now have another layout (here: the same
    heads with another HELP word, read first after the clearing), where Python reads none."""
    monkeypatch.setattr(promtext, "_LAYOUTS_MAX", 3)
    families = ("m",)
    a = "# HELP m foo\n# TYPE m gauge\nm 1\n"
    b = "# HELP m bar\n# TYPE m gauge\nm 2\n"
    promtext.clear_caches()
    assert promtext.read_values(a, families) is not None
    for i in range(3):  # malformed heads: layouts of None, never a template
        assert promtext.read_values(f"m{{bad{i} 1\n", families) is None
    assert promtext.read_values(b, families) is not None
    assert _reference(a, families) is None  # the heads now read as b's layout
    c = _c_read(a, families)
    assert c is None or c[1] is None
    assert promtext.read_values(a, families) is None


def test_a_payload_the_c_pass_cannot_encode_is_read_by_python():
    """A lone surrogate (a payload decoded with errors='surrogateescape') has no UTF-8."""
    families = _families("vllm", "e2e")
    text = PAYLOADS["vllm"] + "# \udc80 a comment\n"
    promtext.clear_caches()
    expected = _reference(text, families)
    assert expected is not None
    assert _c_read(text, families) is None
    assert promtext.read_values(text, families) == expected


def test_names_the_c_pass_cannot_find_as_the_regex_does_are_left_to_python():
    """A name with a newline makes the regex find across lines; with a blank, past one."""
    assert promtext._known_names(("m", "a\nb")) is None
    assert promtext._known_names(("m", "a b")) is None
    assert promtext._known_names(("m", "{q")) is None
    assert promtext._known_names(("vllm:b", "vllm:a", "vllm:ab")) == (b"vllm:a", b"vllm:b")
    families = ("m", "a\nb")
    promtext.clear_caches()
    promtext.read_values("m 1\n", families)
    text = "m 2\na\nb 5\n"
    assert promtext.read_values(text, families) == _reference(text, families)
    assert promtext.read_values(text, families)[1] == [2.0, 5.0]


def test_a_malformed_template_is_a_miss_not_an_error():
    text = PAYLOADS["vllm"]
    families = _families("vllm", "e2e")
    promtext.clear_caches()
    promtext.read_values(text, families)
    selection = promtext._selection(families)
    (key,) = selection.templates
    selection.templates[key] = ((), b"", None, "x")
    assert _c_read(text, families) == (key, None, None)
