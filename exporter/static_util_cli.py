"""batchscope-static-util: what static batching would waste on your own traffic.

Reads logged output lengths (plain numbers, CSV, JSON lines, or a `vllm bench serve`
result file), streams them through exporter.static_util, and prints the static-batching
utilisation and the continuous-batching gain for each batch size asked.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import gzip
import io
import json
import math
import sys
import zlib
from collections.abc import Iterator, Sequence
from itertools import chain, islice
from typing import TextIO

from exporter.static_util import StaticBatchingAccumulator, StaticBatchingResult

PROG = "batchscope-static-util"
# Looked for in this order when --field is not given; a dotted name reaches into an object.
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

DESCRIPTION = """\
A static batch of B requests runs until its longest request finishes, so only
sum(lengths) / (B * max(lengths)) of its slot-steps do useful work. Consecutive
requests are grouped into batches of B, in file order (files in the order given);
a last partial group runs max(its lengths) steps on all B slots. Continuous
batching refills a slot as soon as its request ends: its gain is the inverse.

Input formats, detected per file from its first line:
  plain     one length per line ('#' comments and blank lines are skipped)
  CSV       a header naming a length column (comma or tab separated)
  JSON      one object per line; a field holding a length, or a list of them
  vLLM      `vllm bench serve --save-result --save-detailed` result file
            (per-request lengths in `output_lens`; failed requests, written
            as 0, are skipped and counted)
Fields looked for: output_tokens, output_len, completion_tokens,
num_output_tokens, output_lens, usage.completion_tokens.
FILE may be '-' for stdin, or end in .gz."""

EPILOG = """\
examples:
  batchscope-static-util lengths.txt --batch-size 8
  batchscope-static-util requests.csv --field gen_tokens -b 8 -b 32 -b 128
  batchscope-static-util bench-result.json -b 64 --json

exit status: 0 on success (bad lines are reported on stderr and skipped),
2 on bad usage, an unreadable file, or no valid length at all."""


class InputError(Exception):
    """A file the tool cannot read any length from, whatever its lines hold."""


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
                raise ValueError(f"{_shown(value)} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{_shown(value)} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{_shown(value)} is not a whole number of tokens")
        value = int(value)
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_lengths(stream: TextIO, report: FileReport, field_name: str | None) -> Iterator[list[int]]:
    """Lengths from one file, in order, in chunks; bad lines go to `report`.

    The format is detected from the first line that is neither blank nor a comment.
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
        yield from _json_document(first + stream.read(), report, field_name)
    elif first[0] in "{[":
        report.format = "JSON lines"
        yield from _json_lines(chain([line], stream), line_number, report, field_name)
    elif _is_number(first):
        report.format = "plain numbers"
        yield from _plain(chain([line], stream), line_number, report)
    else:
        yield from _csv(line, stream, line_number, report, field_name)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _plain(lines: Iterator[str], first_number: int, report: FileReport) -> Iterator[list[int]]:
    start = first_number
    while chunk := list(islice(lines, CHUNK_LINES)):
        try:
            # int() takes surrounding whitespace: a clean chunk never reaches the slow path.
            values = list(map(int, chunk))
            clean = min(values) >= 0
        except ValueError:
            clean = False
        if not clean:
            values = []
            for number, line in enumerate(chunk, start):
                text = line.strip()
                if not text or text.startswith("#"):
                    continue
                try:
                    values.append(parse_length(text))
                except ValueError as error:
                    report.bad(f"line {number}", str(error))
        start += len(chunk)
        report.lengths += len(values)
        yield values


def _csv(
    header_line: str,
    stream: Iterator[str],
    header_number: int,
    report: FileReport,
    field_name: str | None,
) -> Iterator[list[int]]:
    delimiter = "\t" if "\t" in header_line and "," not in header_line else ","
    columns = next(csv.reader([header_line.strip()], delimiter=delimiter))
    index = _column_index(columns, field_name)
    if index is None and len(columns) == 1:
        # One word that names no length: a plain file whose first line is bad.
        report.format = "plain numbers"
        yield from _plain(chain([header_line], stream), header_number, report)
        return
    if index is None:
        wanted = f"no column {field_name!r}" if field_name else "no output-length column"
        raise InputError(
            f"{report.name}: {wanted} in the header (columns: {', '.join(columns)}); "
            "name one with --field"
        )
    report.format = "CSV" if delimiter == "," else "TSV"
    report.field = columns[index]
    reader = csv.reader(stream, delimiter=delimiter)
    values: list[int] = []
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as error:
            report.bad(f"line {header_number + reader.line_num}", f"not CSV ({error})")
            continue
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        try:
            if index >= len(row):
                raise ValueError(f"no {columns[index]!r} column in this row")
            values.append(parse_length(row[index]))
        except ValueError as error:
            report.bad(f"line {header_number + reader.line_num}", str(error))
        if len(values) >= CHUNK_LINES:
            report.lengths += len(values)
            yield values
            values = []
    report.lengths += len(values)
    yield values


def _column_index(columns: list[str], field_name: str | None) -> int | None:
    names = [c.strip().lower() for c in columns]
    for wanted in [field_name] if field_name else KNOWN_FIELDS:
        if wanted.lower() in names:
            return names.index(wanted.lower())
    return None


def _json_lines(
    lines: Iterator[str], first_number: int, report: FileReport, field_name: str | None
) -> Iterator[list[int]]:
    values: list[int] = []
    for number, line in enumerate(lines, first_number):
        text = line.strip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except ValueError:
            report.bad(f"line {number}", f"not valid JSON: {_shown(text)}")
            continue
        _take(record, f"line {number}", report, field_name, values)
        if len(values) >= CHUNK_LINES:
            report.lengths += len(values)
            yield values
            values = []
    report.lengths += len(values)
    yield values


def _json_document(text: str, report: FileReport, field_name: str | None) -> Iterator[list[int]]:
    try:
        document = json.loads(text)
    except ValueError as error:
        raise InputError(f"{report.name}: not valid JSON ({error})") from None
    values: list[int] = []
    _take(document, "document", report, field_name, values)
    report.lengths += len(values)
    yield values


def _take(
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
                _take(item, f"{where} item {position}", report, field_name, values)
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


def _open(name: str) -> contextlib.AbstractContextManager[TextIO]:
    if name == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is None:
            return contextlib.nullcontext(sys.stdin)
        return contextlib.nullcontext(
            io.TextIOWrapper(buffer, encoding="utf-8", errors="replace", newline="")
        )
    if name.endswith(".gz"):
        return gzip.open(name, "rt", encoding="utf-8", errors="replace", newline="")
    return open(name, encoding="utf-8", errors="replace", newline="")


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line of batchscope-static-util."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="log of output lengths")
    parser.add_argument(
        "-b",
        "--batch-size",
        type=_batch_size,
        action="append",
        required=True,
        metavar="B",
        help="static batch size to evaluate (the size you serve); repeat for a table",
    )
    parser.add_argument(
        "--field",
        metavar="NAME",
        help="CSV column or JSON field holding the output length (dotted for nested JSON)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 2 usage or input error)."""
    args = build_parser().parse_args(argv)
    sizes = list(dict.fromkeys(args.batch_size))
    accumulators = [StaticBatchingAccumulator(size) for size in sizes]
    reports: list[FileReport] = []
    try:
        for name in args.files:
            report = FileReport(name)
            reports.append(report)
            with _open(name) as stream:
                for chunk in read_lengths(stream, report, args.field):
                    for accumulator in accumulators:
                        accumulator.add_many(chunk)
    except InputError as error:
        _warn_bad_lines(reports)
        return _fail(str(error))
    except (OSError, EOFError, zlib.error) as error:
        _warn_bad_lines(reports)
        # open() names the file in its message; gzip's errors do not.
        return _fail(str(error) if getattr(error, "filename", None) else f"{name}: {error}")
    _warn_bad_lines(reports)
    if not any(r.lengths for r in reports):
        return _fail(f"no valid output length in {', '.join(args.files)}")
    try:
        results = [a.result() for a in accumulators]
    except ValueError as error:
        return _fail(f"{error} (every length is 0)")
    if args.json:
        _print_json(results, reports)
    else:
        _print_table(results, reports)
    return 0


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _warn_bad_lines(reports: list[FileReport]) -> None:
    for r in reports:
        if r.bad_lines:
            print(
                f"{PROG}: {r.name}: skipped {r.bad_lines} bad line(s); first: "
                + "; ".join(r.examples),
                file=sys.stderr,
            )
        if r.failed_requests:
            print(
                f"{PROG}: {r.name}: skipped {r.failed_requests} failed request(s) "
                "(vLLM bench writes 0 for them)",
                file=sys.stderr,
            )


def _print_json(results: list[StaticBatchingResult], reports: list[FileReport]) -> None:
    extra = {
        "bad_lines": sum(r.bad_lines for r in reports),
        "failed_requests": sum(r.failed_requests for r in reports),
        "files": [{"name": r.name, "format": r.format, "field": r.field} for r in reports],
    }
    rows = [{**result.to_dict(), **extra} for result in results]
    print(json.dumps(rows[0] if len(rows) == 1 else rows, indent=2))


def _print_table(results: list[StaticBatchingResult], reports: list[FileReport]) -> None:
    for r in reports:
        source = r.format + (f", field {r.field}" if r.field else "")
        print(f"{r.name}: {r.lengths:,} request{'' if r.lengths == 1 else 's'} ({source})")
    header = (
        "batch size",
        "groups",
        "utilization",
        "CB gain",
        "useful slot-steps",
        "idle slot-steps",
    )
    rows = [
        (
            f"{r.batch_size}",
            f"{r.groups:,}",
            f"{r.static_utilization:.4f}",
            f"{r.continuous_batching_gain:.2f}x",
            f"{r.useful_slot_steps:,}",
            f"{r.idle_slot_steps:,}",
        )
        for r in results
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    print()
    for row in (header, *rows):
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    partial = [r for r in results if r.partial_group_requests]
    for r in partial:
        print(
            f"B={r.batch_size}: the last group holds {r.partial_group_requests} of "
            f"{r.batch_size} requests and counts {r.batch_size} slots (the capacity reserved)"
        )


if __name__ == "__main__":
    sys.exit(main())
