"""`batchscope-demo-server`: a torch model server whose batching behaviour is known."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import torch
import uvicorn

from batchscope.demo_server.devices import DEVICE_CHOICES
from batchscope.demo_server.embedding.batcher_settings import MODES as EMBED_BATCHING_MODES
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.generation.scheduler import ATTENTION_CHOICES, BATCHING_MODES
from batchscope.demo_server.http.app import create_app
from batchscope.demo_server.http.server import MAX_NUM_SEQS_LIMIT, ServerConfig

DESCRIPTION = """\
A model server for checking batching signals against the truth. Tiny torch models with
random weights (drawn from --seed; nothing is downloaded) behind OpenAI-style endpoints:
POST /v1/completions (generation, static or continuous batching), POST /v1/embeddings
(fixed or adaptive dynamic batching), GET /health, GET /metrics (vLLM's metric names plus
batchscope_demo_* truth series), GET|POST /admin/config (127.0.0.1 only: change the
batch cap and the embedding batch settings without a restart).
"""

EPILOG = """\
examples:
  batchscope-demo-server --batching static --max-num-seqs 8
  batchscope-demo-server --device sim:h200 --embed-batching adaptive --latency-budget-ms 20
  curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
       -d '{"prompt": "hi", "max_tokens": 32, "ignore_eos": true}'

--device sim:h200 runs the models on the CPU and pads every forward to the cost measured
on an NVIDIA H200 for its batch size; /health, /metrics and the logs say it is simulated.
SIGTERM (or Ctrl-C) stops admitting, finishes in-flight requests, and exits 0.
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line of batchscope-demo-server."""
    defaults = ServerConfig()
    parser = argparse.ArgumentParser(
        prog="batchscope-demo-server",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_server_arguments(parser, defaults)
    _add_generation_arguments(parser, defaults)
    _add_embedding_arguments(parser, defaults)
    return parser


def _add_server_arguments(parser: argparse.ArgumentParser, defaults: ServerConfig) -> None:
    server = parser.add_argument_group("server")
    server.add_argument("--host", default=defaults.host, help="bind address (default %(default)s)")
    server.add_argument("--port", type=int, default=defaults.port, help="default %(default)s")
    server.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default=defaults.device,
        help="auto: CUDA when available, else CPU; sim:h200: simulated H200 (default %(default)s)",
    )
    server.add_argument(
        "--sim-slowdown",
        type=float,
        default=defaults.sim_slowdown,
        metavar="N",
        help="with --device sim:h200: simulate a device N times slower than the H200, for a "
        "CPU that cannot keep the H200's pace (its overruns count in /metrics) "
        "(default %(default)g)",
    )
    server.add_argument("--model-name", default=defaults.model_name, help="default %(default)s")
    server.add_argument("--seed", type=int, default=defaults.seed, help="weights and sampling")
    server.add_argument(
        "--max-queue",
        type=_positive_int,
        default=defaults.max_queue,
        help="waiting requests (and embedding items) beyond this get 429 (default %(default)s)",
    )
    admin = server.add_mutually_exclusive_group()
    admin.add_argument(
        "--admin-token-env",
        metavar="NAME",
        help="environment variable holding a token /admin/config requires (as a bearer "
        "token) besides coming from 127.0.0.1",
    )
    admin.add_argument("--admin-token-file", metavar="PATH", help="that token from a file")
    server.add_argument(
        "--request-log",
        metavar="PATH",
        help="append one JSON line per finished generation request (output_tokens, "
        "queue_time, latency, ...), readable by batchscope-static-util",
    )
    server.add_argument(
        "--torch-threads",
        type=_positive_int,
        default=1,
        help="torch intra-op threads; tiny models run fastest on one (default %(default)s)",
    )
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])


def _add_generation_arguments(parser: argparse.ArgumentParser, defaults: ServerConfig) -> None:
    generation = parser.add_argument_group("generation (/v1/completions)")
    generation.add_argument(
        "--batching",
        choices=BATCHING_MODES,
        default=defaults.batching,
        help="static: a group runs until its longest request ends; continuous: finished "
        "requests leave and waiting ones join every step (default %(default)s)",
    )
    generation.add_argument(
        "--attention",
        choices=ATTENTION_CHOICES,
        default=defaults.attention,
        help="decode attention on the CPU: ragged reads each row's own cache length (a small "
        "C kernel, built with the machine's cc on first use); padded attends every row as far "
        "as the longest; auto: ragged when the kernel builds (default %(default)s)",
    )
    generation.add_argument(
        "--max-num-seqs",
        type=_positive_int,
        default=defaults.max_num_seqs,
        help=f"batch slots, at most {MAX_NUM_SEQS_LIMIT} (default %(default)s)",
    )
    generation.add_argument(
        "--max-num-batched-tokens",
        type=_positive_int,
        default=defaults.max_num_batched_tokens,
        help="tokens one step may carry, at least --max-num-seqs; a longer prefill is "
        "chunked over steps, as vLLM's chunked prefill does (default: no budget, a prompt "
        "prefills in the step it is admitted)",
    )
    generation.add_argument(
        "--kv-cache-tokens",
        type=_positive_int,
        default=defaults.kv_cache_tokens,
        help="KV cache capacity in tokens; when full, requests are preempted (default %(default)s)",
    )


def _add_embedding_arguments(parser: argparse.ArgumentParser, defaults: ServerConfig) -> None:
    embedding = parser.add_argument_group("embeddings (/v1/embeddings)")
    embedding.add_argument(
        "--embed-batching",
        choices=EMBED_BATCHING_MODES,
        default=defaults.embedding.mode,
        help="fixed: fire at --max-batch-size or --max-wait-ms; adaptive: the smallest "
        "batch that keeps up with arrivals, within --latency-budget-ms (default %(default)s)",
    )
    embedding.add_argument(
        "--max-batch-size",
        type=_positive_int,
        default=defaults.embedding.max_batch_size,
        help="default %(default)s",
    )
    embedding.add_argument(
        "--max-wait-ms",
        type=_non_negative_float,
        default=defaults.embedding.as_ms()["max_wait_ms"],
        help="fixed mode, milliseconds (default %(default)s)",
    )
    embedding.add_argument(
        "--latency-budget-ms",
        type=_positive_float,
        default=defaults.embedding.as_ms()["latency_budget_ms"],
        help="adaptive mode, milliseconds (default %(default)s)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, serve until SIGTERM/SIGINT, return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_num_seqs > MAX_NUM_SEQS_LIMIT:
        parser.error(f"--max-num-seqs must be at most {MAX_NUM_SEQS_LIMIT}")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    torch.set_num_threads(args.torch_threads)
    try:
        admin_token = _admin_token(args.admin_token_env, args.admin_token_file)
    except ValueError as error:
        parser.error(str(error))
    config = ServerConfig(
        host=args.host,
        port=args.port,
        batching=args.batching,
        attention=args.attention,
        max_num_seqs=args.max_num_seqs,
        kv_cache_tokens=args.kv_cache_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_queue=args.max_queue,
        device=args.device,
        sim_slowdown=args.sim_slowdown,
        embedding=BatcherSettings(mode=args.embed_batching).with_ms(
            max_batch_size=args.max_batch_size,
            max_wait_ms=args.max_wait_ms,
            latency_budget_ms=args.latency_budget_ms,
        ),
        request_log=args.request_log,
        model_name=args.model_name,
        seed=args.seed,
        admin_token=admin_token,
    )
    try:
        app = create_app(config)
    except ValueError as error:
        parser.error(str(error))
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _exit_cleanly)
    # While serving, uvicorn takes SIGTERM/SIGINT: it stops accepting, waits for in-flight
    # requests, runs the lifespan shutdown (draining the scheduler and the batcher), then
    # re-raises the signal to the handler above.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _admin_token(env: str | None, path: str | None) -> str | None:
    """The admin token from the environment variable or file; ValueError naming where
    (never the token) when it is unset, empty or unreadable."""
    if env is not None:
        token, where = os.environ.get(env, "").strip(), f"environment variable {env}"
    elif path is not None:
        try:
            token, where = Path(path).read_text(encoding="utf-8").strip(), f"file {path}"
        except (OSError, UnicodeDecodeError):
            raise ValueError(f"--admin-token-file: cannot read {path}") from None
    else:
        return None
    if not token:
        raise ValueError(f"the admin token in {where} is empty")
    return token


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """A stop signal outside uvicorn's serving (before it, or re-raised after its graceful
    shutdown): nothing is in flight, so exit with status 0."""
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
