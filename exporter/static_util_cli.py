"""batchscope-static-util: what static batching would waste on your own traffic.

Reads logged output lengths with batchscope.exporter.length_log (plain numbers, CSV, JSON lines,
or a `vllm bench serve` result file), streams them through batchscope.exporter.core.static_util, and
prints the static-batching utilisation and the continuous-batching gain for each batch
size asked.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import sys
import textwrap
import zlib
from collections.abc import Sequence
from typing import TextIO

from batchscope.exporter.core.static_util import StaticBatchingAccumulator, StaticBatchingResult
from batchscope.exporter.length_log import KNOWN_FIELDS, FileReport, InputError, read_lengths

PROG = "batchscope-static-util"
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
{fields}
FILE may be '-' for stdin, or end in .gz.""".format(
    fields=textwrap.fill("Fields looked for: " + ", ".join(KNOWN_FIELDS) + ".", width=72)
)

EPILOG = """\
examples:
  batchscope-static-util lengths.txt --batch-size 8
  batchscope-static-util requests.csv --field gen_tokens -b 8 -b 32 -b 128
  batchscope-static-util bench-result.json -b 64 --json

exit status: 0 on success (bad lines are reported on stderr and skipped),
2 on bad usage, an unreadable file, or no valid length at all."""


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
