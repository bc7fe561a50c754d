"""batchscope.exporter.length_log: the reader the CLI and the upload page share, chunk by chunk."""

from __future__ import annotations

import csv
import io
import json

import pytest

from batchscope.exporter import length_log
from batchscope.exporter.length_log import FileReport, InputError, parse_length, read_lengths


@pytest.fixture
def chunks_of_four(monkeypatch) -> None:
    monkeypatch.setattr(length_log, "CHUNK_LINES", 4)
    monkeypatch.setattr(length_log, "CHUNK_ROWS", 4)


def read(text: str, field_name: str | None = None) -> tuple[list[list[int]], list[int], FileReport]:
    """The chunks read from `text`, the progress calls, and the report."""
    report = FileReport("log")
    calls: list[int] = []
    chunks = list(read_lengths(io.StringIO(text), report, field_name, calls.append))
    return chunks, calls, report


def test_plain_numbers_come_in_chunks_with_lines_read_after_each(chunks_of_four) -> None:
    text = "# lengths\n" + "".join(f"{n}\n" for n in range(1, 11))
    chunks, calls, report = read(text)
    assert chunks == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert calls == [5, 9, 11]
    assert (report.format, report.lengths, report.bad_lines) == ("plain numbers", 10, 0)


def test_a_bad_line_in_a_later_chunk_is_named_by_its_file_line(chunks_of_four) -> None:
    chunks, calls, report = read("1\n2\n3\n4\n5\nsix\n-7\n8\n")
    assert chunks == [[1, 2, 3, 4], [5, 8]]
    assert calls == [4, 8]
    assert report.bad_lines == 2
    assert report.examples == ["line 6: 'six' is not a number", "line 7: -7 is negative"]


def test_json_lines_in_chunks(chunks_of_four) -> None:
    text = "".join(json.dumps({"output_tokens": n}) + "\n" for n in (3, 5, 8, 11, 4, 14))
    chunks, calls, report = read(text)
    assert chunks == [[3, 5, 8, 11], [4, 14]]
    assert calls == [4, 6]
    assert (report.format, report.field, report.lengths) == ("JSON lines", "output_tokens", 6)


def test_csv_rows_in_chunks_counting_the_header(chunks_of_four) -> None:
    text = "id,output_len\n" + "".join(f"r{n},{n}\n" for n in range(1, 7))
    chunks, calls, report = read(text)
    assert chunks == [[1, 2, 3, 4], [5, 6]]
    assert calls == [5, 7]
    assert (report.format, report.field, report.lengths) == ("CSV", "output_len", 6)


def test_a_json_document_reports_its_lines_once_parsed() -> None:
    text = '{\n  "output_lens": [12, 0, 30],\n  "completed": 2\n}'
    chunks, calls, report = read(text)
    assert chunks == [[12, 30]]
    assert calls == [4]
    assert (report.format, report.failed_requests, report.lengths) == ("vLLM bench result", 1, 2)


def test_without_progress_the_same_lengths_are_read() -> None:
    report = FileReport("log")
    chunks = list(read_lengths(io.StringIO("3\n5\n8\n"), report, None))
    assert chunks == [[3, 5, 8]]
    assert report.lengths == 3


def test_a_csv_without_a_length_column_is_an_input_error() -> None:
    with pytest.raises(InputError) as caught:
        read("id,prompt\n1,hello\n")
    assert str(caught.value) == (
        "log: no output-length column in the header (columns: id, prompt); name one with --field"
    )


def test_parse_length_accepts_integral_numbers_and_refuses_the_rest() -> None:
    assert [parse_length(v) for v in (12, "7", " 30 ", 12.0, "4.0")] == [12, 7, 30, 12, 4]
    for value, reason in [
        ("x" * 50, "'" + "x" * 36 + "... is not a number"),
        (True, "True is not a number"),
        (1.5, "1.5 is not a whole number of tokens"),
        (-3, "-3 is negative"),
    ]:
        with pytest.raises(ValueError) as caught:
            parse_length(value)
        assert str(caught.value) == reason


def test_a_csv_row_over_lines_keeps_the_file_line_numbers() -> None:
    chunks, calls, report = read('id,prompt,output_len\n1,"a\nb",5\n2,c,x\n3,d,9\n')
    assert chunks == [[5, 9]]
    assert report.examples == ["line 4: 'x' is not a number"]
    assert calls == [4]  # three rows after the header: the quoted line break counts once


def test_a_row_the_csv_reader_refuses_is_counted_and_reading_goes_on() -> None:
    limit = csv.field_size_limit()
    csv.field_size_limit(10)
    try:
        chunks, _, report = read("id,output_len\n1,5\n" + "x" * 20 + ",6\n3,7\n")
    finally:
        csv.field_size_limit(limit)
    assert chunks == [[5, 7]]
    assert report.examples == ["line 3: not CSV (field larger than field limit (10))"]
