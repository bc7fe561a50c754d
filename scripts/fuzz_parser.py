"""Coverage-guided fuzzing of the exporter's parser with atheris (libFuzzer).

Each input is decoded as UTF-8 and parsed: anything but ParseError, a text read that
breaks a rule of the format, or samples other than prometheus_client's where it reads
the text, is a crash with the input saved (tests/support/parser_oracle.py).
The corpus starts from the real payloads in tests/fixtures. libFuzzer's flags pass through:

    .venv/bin/python scripts/fuzz_parser.py -max_total_time=300
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

# The oracle is the tests' (tests/support/parser_oracle.py): the repository root goes on
# the path for it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
with atheris.instrument_imports():
    from tests.support.parser_oracle import check_parse

FIXTURES = Path(__file__).resolve().parent.parent / "tests/fixtures"


def one_input(data: bytes) -> None:
    check_parse(data.decode("utf-8", errors="replace"))


def main() -> None:
    corpus = Path(tempfile.mkdtemp(prefix="batchscope-fuzz-"))
    for payload in FIXTURES.glob("*.txt"):
        (corpus / payload.name).write_bytes(payload.read_bytes())
    atheris.Setup([sys.argv[0], *sys.argv[1:], str(corpus)], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
