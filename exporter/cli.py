"""`batchscope-exporter`: scrape model servers, derive batching signals, serve them."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import ssl
import sys
from collections.abc import Callable

from aiohttp import web

from batchscope.exporter.alerts.delivery import AlertmanagerDelivery
from batchscope.exporter.alerts.specs import AlertWords
from batchscope.exporter.config.exposure_warnings import exposure_warnings
from batchscope.exporter.config.flags import add_arguments, settings_from_args
from batchscope.exporter.config.settings import ConfigError, Settings
from batchscope.exporter.scrape.fetch import read_secret
from batchscope.exporter.scrape.loop import Exporter, stale_seconds
from batchscope.exporter.serve.app import configure_switch_interval, create_app

log = logging.getLogger("batchscope.exporter")

EPILOG = """examples:
  batchscope-exporter --target http://127.0.0.1:8000/metrics --name llm --engine vllm \\
      --cap 256 --budget-seconds 0.1
  batchscope-exporter --config fleet.yaml --listen 127.0.0.1:9500

Serves /metrics (Prometheus) and the JSON API (/api/v1/signals, /api/v1/advice,
/api/v1/replicas, /api/v1/history, /api/v1/targets; docs/api.md) on --listen, and /health."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchscope-exporter",
        description="Scrape vLLM, peer engines and in-house batchers; export batching signals.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default: info)",
    )
    parser.add_argument(
        "--event-loop",
        default="auto",
        choices=["auto", "uvloop", "asyncio"],
        help="the event loop: uvloop (libuv, in C) or asyncio's own; auto: uvloop where it "
        "is installed (default: auto)",
    )
    return parser


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the exporter runs on: uvloop's, which handles a fleet's scrapes and
    requests on less CPU than asyncio's own, or asyncio's (None), its plain twin.
    ConfigError when uvloop is asked for and not installed."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop uvloop: uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def _web_token(settings: Settings) -> str | None:
    if settings.web_token_env is None and settings.web_token_file is None:
        return None
    return read_secret("web token", settings.web_token_env, settings.web_token_file)


def _tls(settings: Settings) -> ssl.SSLContext | None:
    if settings.tls_cert_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"TLS: cannot load {settings.tls_cert_file}: {err}") from None
    return context


def tune_collector() -> None:
    """Once started: what start-up loaded leaves the cyclic collector's walks, and a young
    collection waits for 50,000 new containers, not 700, so that the fleet's windows,
    replaced a little at every scrape, are not walked in full every few seconds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000)


async def serve(settings: Settings) -> int:
    """Run until SIGINT/SIGTERM; returns the exit code."""
    try:
        token, tls = _web_token(settings), _tls(settings)
    except ConfigError as err:
        print(f"batchscope-exporter: error: {err}", file=sys.stderr)
        return 2
    exporter = Exporter(settings)
    for warning in exposure_warnings(settings, exporter.targets()):
        log.warning("%s", warning)
    host, port = settings.listen_host_port()
    runner = web.AppRunner(create_app(exporter, token), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=tls).start()
    except OSError as err:
        await runner.cleanup()
        print(f"batchscope-exporter: error: cannot listen on {host}:{port}: {err}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "scraping %d target(s) every %g s; serving %s://%s:%d/metrics and /api/v1/ "
        "(signals, advice, history, targets)",
        len(exporter.states),
        settings.interval_seconds,
        "https" if tls else "http",
        host,
        port,
    )
    tune_collector()
    configure_switch_interval()
    tasks = [exporter.run_forever(stop)]
    if settings.alertmanager_url:
        delivery = AlertmanagerDelivery(
            settings.alertmanager_url,
            exporter.current,
            generator_url=f"http://{host}:{port}/api/v1/signals",
            interval_seconds=settings.interval_seconds,
            stale_seconds=stale_seconds(settings),
            keep_seconds=settings.hold_seconds,
            words=AlertWords.from_settings(settings),
        )
        tasks.append(delivery.run_forever(stop))
        log.info("posting alerts to %s", delivery.endpoint)
    try:
        await asyncio.gather(*tasks)
    finally:
        await runner.cleanup()
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = settings_from_args(args)
        factory = loop_factory(args.event_loop)
    except ConfigError as err:
        parser.exit(2, f"batchscope-exporter: error: {err}\n")
    log.info("event loop: %s", "uvloop" if factory is not None else "asyncio")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
