"""`batchscope-dashboard`: the Streamlit app on an exporter, or with its own exporter inside."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from batchscope.dashboard.client import DEFAULT_EXPORTER, EXPORTER_ENV, PROMETHEUS_ENV
from batchscope.dashboard.embedded import EmbeddedExporter
from batchscope.exporter.config.flags import add_arguments, settings_from_args
from batchscope.exporter.config.settings import ConfigError

APP = Path(__file__).resolve().parent / "app.py"
PROG = "batchscope-dashboard"

EPILOG = f"""examples:
  {PROG}                                   # the exporter at {DEFAULT_EXPORTER}
  {PROG} --exporter http://10.0.0.5:9500 --prometheus http://127.0.0.1:9090
  {PROG} --target http://127.0.0.1:8000/metrics --cap 256 --budget-seconds 2

With --target (or --config) the exporter's scrape loop runs inside the dashboard's
process: no second process to start."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Streamlit dashboard: is batching doing its job on each server?",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = parser.add_argument_group("dashboard")
    group.add_argument(
        "--exporter", metavar="URL", help=f"the exporter to read (default: {DEFAULT_EXPORTER})"
    )
    group.add_argument(
        "--prometheus",
        metavar="URL",
        help="a Prometheus that scrapes the exporter, for longer history",
    )
    group.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    group.add_argument("--port", type=int, default=8501, help="port (default: %(default)s)")
    add_arguments(parser)
    return parser


def streamlit_args(host: str, port: int) -> list[str]:
    """`streamlit run` on the app, headless, on host:port, no usage statistics, no deploy button."""
    return [
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.address={host}",
        f"--server.port={port}",
        "--server.fileWatcherType=none",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=minimal",
    ]


def start_embedded(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """Start the exporter inside this process; its API's URL."""
    if args.exporter:
        parser.error(
            "--exporter reads another exporter; --target/--config run one here: give one of them"
        )
    try:
        settings = settings_from_args(args)
    except ConfigError as err:
        parser.error(str(err))
    # Without --listen the API takes any free local port: only this app reads it.
    host, port = settings.listen_host_port() if args.listen else ("127.0.0.1", 0)
    embedded = EmbeddedExporter(settings, host, port)
    try:
        url = embedded.start()
    except OSError as err:
        parser.exit(1, f"{PROG}: error: cannot listen on {host}:{port}: {err}\n")
    print(
        f"{PROG}: scraping {len(settings.targets)} target(s) in this process; "
        f"exporter API and /metrics at {url}",
        flush=True,
    )
    return url


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.target or args.config:
        exporter = start_embedded(args, parser)
    else:
        exporter = args.exporter or DEFAULT_EXPORTER
    os.environ[EXPORTER_ENV] = exporter
    if args.prometheus:
        os.environ[PROMETHEUS_ENV] = args.prometheus
    print(f"{PROG}: open http://{args.host}:{args.port} (reading {exporter})", flush=True)
    from streamlit.web import cli as streamlit_cli

    return (
        streamlit_cli.main(
            streamlit_args(args.host, args.port), prog_name="streamlit", standalone_mode=False
        )
        or 0
    )


if __name__ == "__main__":
    sys.exit(main())
