"""Logged output lengths, read from any of four formats, in bounded-memory chunks.

Plain numbers, CSV (or TSV) with a length column, JSON lines, and a JSON document such
as a `vllm bench serve --save-result --save-detailed` result file. The format is
detected from the first line. Lines that hold no length are counted in a `FileReport`
and skipped; only a file that cannot hold lengths at all raises `InputError`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice, repeat
from operator import attrgetter
from typing import TextIO, TypeVar

# Looked for in this order when no field is named; a dotted name reaches into an object.
KNOWN_FIELDS = (
    "output_tokens",
    "output_len",
    "completion_tokens",
    "num_output_tokens",
    "output_lens",
    "usage.completion_tokens",
)
# vLLM bench writes 0 in `output_lens` for a request that failed.
BENCH_FIELD = "output_lens"
EXAMPLES_SHOWN = 5
# Lines read at a time: bounded memory, and whole chunks parse at C speed.
CHUNK_LINES = 65536
# CSV rows are lists: holding fewer at once keeps allocation and garbage collection cheap.
CHUNK_ROWS = 2048

# Called after each chunk with the number of lines read so far (a CSV row whose quoted
# field holds line breaks counts once; a JSON document reports once, when parsed).
Progress = Callable[[int], None]
Item = TypeVar("Item")


class InputError(Exception):
    """A file no length can be read from, whatever its lines hold."""


@dataclasses.dataclass
class FileReport:
    """What one file gave: its format, its lengths, and the lines that were not lengths."""

    name: str
    format: str = "empty"
    field: str | None = None
    lengths: int = 0
    bad_lines: int = 0
    failed_requests: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)

    def bad(self, where: str, reason: str) -> None:
        """Count a line (or list item) that holds no valid length; keep the first few."""
        self.bad_lines += 1
        if len(self.examples) < EXAMPLES_SHOWN:
            self.examples.append(f"{where}: {reason}")


def parse_length(value: object) -> int:
    """A length from a number or a numeric string; ValueError with the reason otherwise.

    Integral floats (12.0) are accepted, since JSON and numeric tools write them.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{_abbreviated(value)} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{_abbreviated(value)} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{_abbreviated(value)} is not a whole number of tokens")
        value = int(value)
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def _abbreviated(value: object) -> str:
    """The value's repr, cut to 40 characters for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_lengths(
    stream: TextIO,
    report: FileReport,
    field_name: str | None,
    progress: Progress | None = None,
) -> Iterator[list[int]]:
    """Lengths from one file, in order, in chunks; bad lines go to `report`.

    The format is detected from the first line that is neither blank nor a comment.
    `progress`, when given, is called after each chunk with the lines read so far.
    Raises InputError when the file cannot hold lengths (no length column, a vLLM bench
    result saved without per-request data, a JSON document that does not parse).
    """
    line_number = 0
    for line in stream:
        line_number += 1
        first = line.strip()
        if first and not first.startswith("#"):
            break
    else:
        return
    if first in ("{", "["):
        report.format = "JSON document"
        yield _json_document(first, stream.read(), line_number, report, field_name, progress)
        return
    if first[0] in "{[":
        report.format, parse = "JSON lines", _json_lines_parser(report, field_name)
    elif _is_number(first):
        report.format, parse = "plain numbers", _plain_parser(report)
    else:
        yield from _csv(line, stream, line_number, report, field_name, progress)
        return
    lines = chain([line], stream)
    yield from _in_chunks(lines, CHUNK_LINES, line_number, parse, report, progress)


def _in_chunks(
    items: Iterable[Item],
    size: int,
    first_line: int,
    parse: Callable[[list[Item], int], list[int]],
    report: FileReport,
    progress: Progress | None,
) -> Iterator[list[int]]:
    """The one reading loop: `size` items at a time, each chunk parsed, counted and yielded.

    `parse(chunk, line)` gets the chunk and the line number of its first item.
    """
    items = iter(items)
    line = first_line
    while chunk := list(islice(items, size)):
        values = parse(chunk, line)
        line += len(chunk)
        yield _counted(values, line - 1, report, progress)


def _counted(
    values: list[int], lines_read: int, report: FileReport, progress: Progress | None
) -> list[int]:
    report.lengths += len(values)
    if progress is not None:
        progress(lines_read)
    return values


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _plain_parser(report: FileReport) -> Callable[[list[str], int], list[int]]:
    def parse(lines: list[str], first_number: int) -> list[int]:
        try:
            # int() takes surrounding whitespace: a clean chunk never reaches the slow path.
            values = list(map(int, lines))
            if min(values) >= 0:
                return values
        except ValueError:
            pass
        values = []
        for number, line in enumerate(lines, first_number):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                values.append(parse_length(text))
            except ValueError as error:
                report.bad(f"line {number}", str(error))
        return values

    return parse


def _csv(
    header_line: str,
    stream: Iterator[str],
    header_number: int,
    report: FileReport,
    field_name: str | None,
    progress: Progress | None,
) -> Iterator[list[int]]:
    delimiter = "\t" if "\t" in header_line and "," not in header_line else ","
    columns = next(csv.reader([header_line.strip()], delimiter=delimiter))
    index = _column_index(columns, field_name)
    if index is None and len(columns) == 1:
        # One word that names no length: a plain file whose first line is bad.
        report.format = "plain numbers"
        lines = chain([header_line], stream)
        parse = _plain_parser(report)
        yield from _in_chunks(lines, CHUNK_LINES, header_number, parse, report, progress)
        return
    if index is None:
        wanted = f"no column {field_name!r}" if field_name else "no output-length column"
        raise InputError(
            f"{report.name}: {wanted} in the header (columns: {', '.join(columns)}); "
            "name one with --field"
        )
    report.format = "CSV" if delimiter == "," else "TSV"
    report.field = columns[index]

    def parse(rows: list[tuple[list[str] | csv.Error, int]], _: int) -> list[int]:
        try:
            # A chunk of clean rows never reaches the row-by-row path below.
            values = [int(row[index]) for row, _ in rows]
            if min(values) >= 0:
                return values
        except (ValueError, IndexError, TypeError):
            pass
        values = []
        for row, reader_line in rows:
            where = f"line {header_number + reader_line}"
            if isinstance(row, csv.Error):
                report.bad(where, f"not CSV ({row})")
                continue
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            try:
                if index >= len(row):
                    raise ValueError(f"no {columns[index]!r} column in this row")
                values.append(parse_length(row[index]))
            except ValueError as error:
                report.bad(where, str(error))
        return values

    rows = _rows_with_lines(csv.reader(stream, delimiter=delimiter))
    yield from _in_chunks(rows, CHUNK_ROWS, header_number + 1, parse, report, progress)


def _rows_with_lines(reader: Iterator[list[str]]) -> Iterator[tuple[list[str] | csv.Error, int]]:
    """Each row (or the csv.Error it raised) with the reader's line it ends on."""
    line_numbers = map(attrgetter("line_num"), repeat(reader))
    while True:
        try:
            # zip reads the row first, then the line it ended on: no Python code per row.
            yield from zip(reader, line_numbers, strict=False)
            return
        except csv.Error as error:
            # The reader goes on after a bad row: count it, keep reading.
            yield error, reader.line_num


def _column_index(columns: list[str], field_name: str | None) -> int | None:
    names = [c.strip().lower() for c in columns]
    for wanted in [field_name] if field_name else KNOWN_FIELDS:
        if wanted.lower() in names:
            return names.index(wanted.lower())
    return None


def _json_lines_parser(
    report: FileReport, field_name: str | None
) -> Callable[[list[str], int], list[int]]:
    def parse(lines: list[str], first_number: int) -> list[int]:
        values: list[int] = []
        for number, line in enumerate(lines, first_number):
            text = line.strip()
            if not text:
                continue
            try:
                record = json.loads(text)
            except ValueError:
                report.bad(f"line {number}", f"not valid JSON: {_abbreviated(text)}")
                continue
            _collect_lengths(record, f"line {number}", report, field_name, values)
        return values

    return parse


def _json_document(
    first: str,
    rest: str,
    first_number: int,
    report: FileReport,
    field_name: str | None,
    progress: Progress | None,
) -> list[int]:
    try:
        document = json.loads(first + rest)
    except ValueError as error:
        raise InputError(f"{report.name}: not valid JSON ({error})") from None
    values: list[int] = []
    _collect_lengths(document, "document", report, field_name, values)
    last_line = first_number + rest.count("\n") + (not rest.endswith("\n") and bool(rest))
    return _counted(values, last_line, report, progress)


def _collect_lengths(
    record: object, where: str, report: FileReport, field_name: str | None, values: list[int]
) -> None:
    """Append the lengths one JSON record holds: a number, a list, or an object's field."""
    name = None
    if isinstance(record, dict):
        name = field_name or report.field or _known_field(record)
        if name is None:
            if {"completed", "total_output_tokens"} <= record.keys():
                raise InputError(
                    f"{report.name}: a vLLM bench result without per-request lengths; "
                    "rerun `vllm bench serve --save-result --save-detailed`"
                )
            report.bad(where, "no length field (looked for " + ", ".join(KNOWN_FIELDS) + ")")
            return
        report.field = name
        if name == BENCH_FIELD:
            report.format = "vLLM bench result"
        found, record = _lookup(record, name)
        if not found:
            report.bad(where, f"no field {name!r}")
            return
    if isinstance(record, list):
        for position, item in enumerate(record):
            if isinstance(item, dict):
                _collect_lengths(item, f"{where} item {position}", report, field_name, values)
                continue
            try:
                length = parse_length(item)
            except ValueError as error:
                report.bad(f"{where} item {position}", str(error))
                continue
            if length == 0 and name == BENCH_FIELD:
                report.failed_requests += 1
            else:
                values.append(length)
        return
    try:
        values.append(parse_length(record))
    except ValueError as error:
        report.bad(where, str(error))


def _known_field(record: dict[str, object]) -> str | None:
    for name in KNOWN_FIELDS:
        if _lookup(record, name)[0]:
            return name
    return None


def _lookup(record: dict[str, object], dotted: str) -> tuple[bool, object]:
    value: object = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value
