"""`--exporter URL --target NAME`: a running batchscope exporter's evaluations of one of
its targets, read from its /api/v1/signals?target=NAME during each step of a sweep.

Where --watch runs the exporter's evaluator in-process, this reads the one already
running (the one a dashboard and alerts read): every POLL_INTERVAL_S from the end of the
warm-up to the step's end, each evaluation the exporter made within the step taken once
(by its time `t`), as a `batching.BatchingReading`. The evaluations, and so their
number, are the exporter's: one per its `--interval`. So are the rates' window (its
`--window-seconds`, which may reach back into earlier steps; the `batching` object's
`window_seconds` says how long) and the cap and engine (its target's settings).

An exporter that does not answer (down, slower than POLL_TIMEOUT_S), answers an error
(an unknown target, a missing token) or answers something that is not the API's JSON
gives a gap, not a reading: a step with no reading records no `batching` object. Each
kind of failure is warned about once a sweep, and the sweep goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp

from batchscope.demo_server.loadgen.batching import (
    BatchingReading,
    NotSignals,
    reading_of_api_target,
)
from batchscope.demo_server.loadgen.watch import WATCH_TARGET_KEYS
from batchscope.exporter.config.flags import target_flag_values
from batchscope.exporter.scrape.fetch import read_secret
from batchscope.exporter.serve.api_json import API_VERSION

EXPORTER_ORIGIN = "--exporter"
SIGNALS_PATH = "/api/v1/signals"
POLL_INTERVAL_S = 1.0
# Longer than an exporter's usual answer of one target (milliseconds), shorter than
# two polls: a slow exporter costs a gap, not a stalled step.
POLL_TIMEOUT_S = 2.0
# The most of an error answer a warning quotes.
QUOTED_CHARS = 200


class UsageError(ValueError):
    """A flag combination or value the loadgen refuses; `str()` is the message."""


def add_exporter_arguments(parser: argparse.ArgumentParser) -> None:
    """--exporter, --target and where the exporter's bearer token lives."""
    group = parser.add_argument_group(
        "server signals (a running exporter's API; instead of --watch)"
    )
    group.add_argument(
        "--exporter",
        metavar="URL",
        help="a running batchscope exporter's base URL, e.g. http://127.0.0.1:9500: read "
        "its /api/v1/signals?target=NAME every second of each step and record the "
        "target's batching signals in the step's `batching` object (the evaluations, "
        "the rates' window, the cap and the engine are the exporter's own)",
    )
    group.add_argument(
        "--target",
        metavar="NAME",
        help="with --exporter: the exporter's name for the server under load (its "
        "/api/v1/targets lists them)",
    )
    token = group.add_mutually_exclusive_group()
    token.add_argument(
        "--exporter-token-file",
        metavar="PATH",
        help="with --exporter: file holding the bearer token the exporter requires "
        "(its --web-token-file)",
    )
    token.add_argument(
        "--exporter-token-env",
        metavar="NAME",
        help="with --exporter: environment variable holding that token",
    )


def exporter_base_url(text: str) -> str:
    """The exporter's base URL, without a trailing slash; raises UsageError for one
    that is not http(s)://HOST[:PORT][/PREFIX] (never echoing credentials)."""
    try:
        parts = urlsplit(text)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        parts, port_ok = None, False
    if parts is not None and (parts.username is not None or parts.password is not None):
        raise UsageError(
            "--exporter: the URL must not contain credentials; give the token with "
            "--exporter-token-file or --exporter-token-env"
        )
    if (
        parts is None
        or not port_ok
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
    ):
        raise UsageError(
            f"--exporter: expected the exporter's base URL, e.g. http://127.0.0.1:9500, "
            f"got {text!r}"
        )
    return text.rstrip("/")


def exporter_signals(args: argparse.Namespace) -> ExporterSignals | None:
    """The running exporter the command line names, or None without --exporter. Raises
    UsageError for flags that do not go together or a bad URL, ConfigError for a token
    that cannot be read."""
    token_given = args.exporter_token_file is not None or args.exporter_token_env is not None
    if args.exporter is None:
        if args.target is not None or token_given:
            raise UsageError("--target and --exporter-token-* go with --exporter URL")
        return None
    if args.watch is not None:
        raise UsageError(
            "--watch and --exporter are two ways to read the server's signals: give one"
        )
    if args.target is None:
        raise UsageError(
            "--exporter needs --target NAME, the exporter's name for the server under load "
            "(its /api/v1/targets lists them)"
        )
    judged = [flag for _, flag in target_flag_values(args, WATCH_TARGET_KEYS).values()]
    if judged:
        raise UsageError(
            f"{', '.join(judged)} judge(s) the --watch server; with --exporter the "
            "exporter's own settings for the target hold"
        )
    base = exporter_base_url(args.exporter)
    token = None
    if token_given:
        token = read_secret("exporter token", args.exporter_token_env, args.exporter_token_file)
    return ExporterSignals(base, args.target, token)


class Evaluation(NamedTuple):
    """The exporter's latest evaluation of the target, as one answer says it."""

    t: float
    # How long before the answer the exporter made it (its clock on both sides).
    age_seconds: float
    reading: BatchingReading | None


def evaluation_of_body(body: Any, target: str) -> Evaluation | None:
    """The target's latest evaluation in a /api/v1/signals?target=NAME body; None before
    the exporter's first scrape of it. Raises NotSignals for another shape."""
    if not isinstance(body, Mapping):
        raise NotSignals("the body is not a JSON object")
    if body.get("api_version") != API_VERSION:
        raise NotSignals(f"api_version is {body.get('api_version')!r}, not {API_VERSION}")
    targets = body.get("targets")
    generated_at = body.get("generated_at")
    if not isinstance(targets, list) or not isinstance(generated_at, int | float):
        raise NotSignals("no targets list or generated_at")
    for entry in targets:
        if isinstance(entry, Mapping) and entry.get("target") == target:
            t = entry.get("t")
            if isinstance(t, bool) or not isinstance(t, int | float):
                raise NotSignals(f"target {target!r} has no time t")
            return Evaluation(float(t), generated_at - t, reading_of_api_target(entry))
    return None


class StepEvaluations:
    """The readings of one step's polls, oldest first: each evaluation the exporter made
    since `started` once, and a None for each poll that failed. Pure: the times are
    passed in, on the caller's clock."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.readings: list[BatchingReading | None] = []
        self._last_t: float | None = None

    def polled(self, asked_at: float, evaluation: Evaluation | None) -> None:
        """A poll sent at `asked_at` read `evaluation` (None: none yet). Counted when it
        was made since the start (`age_seconds` before the answer, which came after
        `asked_at`: a little early, never late) and is not the one counted last."""
        if evaluation is None or asked_at - evaluation.age_seconds < self.started:
            return
        if self._last_t is not None and evaluation.t <= self._last_t:
            return
        self._last_t = evaluation.t
        self.readings.append(evaluation.reading)

    def failed(self) -> None:
        """A poll that read nothing: a gap."""
        self.readings.append(None)


class PollFailed(Exception):
    """A poll that read nothing: `kind` groups the warnings, `str()` says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _warn_to_stderr(message: str) -> None:
    print(f"batchscope-loadgen: warning: {message}", file=sys.stderr)


class ExporterSignals:
    """--exporter as a step's source of readings: one target of a running exporter."""

    source = EXPORTER_ORIGIN

    def __init__(
        self,
        base_url: str,
        target: str,
        token: str | None = None,
        warn: Callable[[str], None] = _warn_to_stderr,
        timeout_s: float = POLL_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.target = target
        self._headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self._warn = warn
        self.warned: set[str] = set()

    async def read_step(
        self, window_seconds: float, stop: asyncio.Event
    ) -> list[BatchingReading | None]:
        """The readings of the evaluations the exporter makes from now until `stop` is
        set (polled every POLL_INTERVAL_S, and once more at the stop), oldest first; a
        None for each poll that failed or evaluation that did not read the server.
        `window_seconds` is the step's; the exporter keeps its own window."""
        loop = asyncio.get_running_loop()
        step = StepEvaluations(loop.time())
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, headers=self._headers) as session:
            due = step.started
            while True:
                asked_at = loop.time()
                try:
                    step.polled(asked_at, await self._poll(session))
                except PollFailed as failed:
                    self._warn_once(failed)
                    step.failed()
                if stop.is_set():
                    return step.readings
                due = max(due + POLL_INTERVAL_S, loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), due - loop.time())

    async def _poll(self, session: aiohttp.ClientSession) -> Evaluation | None:
        url = f"{self.base_url}{SIGNALS_PATH}"
        try:
            async with session.get(url, params={"target": self.target}) as response:
                status, text = response.status, await response.text(errors="replace")
        except TimeoutError:
            raise PollFailed(
                "timeout", f"the exporter did not answer within {self.timeout_s:g} s"
            ) from None
        except aiohttp.ClientError as err:
            raise PollFailed("connection", f"cannot reach the exporter: {err}") from None
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if status != 200:
            said = body.get("error") if isinstance(body, dict) else None
            quoted = str(said if said is not None else text)[:QUOTED_CHARS]
            raise PollFailed(f"status {status}", f"the exporter answered {status}: {quoted}")
        if body is None:
            raise PollFailed(
                "json", "the exporter's answer is not JSON (is --exporter its base URL?)"
            )
        try:
            return evaluation_of_body(body, self.target)
        except NotSignals as err:
            raise PollFailed(
                "shape", f"the exporter's answer is not /api/v1/signals': {err}"
            ) from None

    def _warn_once(self, failed: PollFailed) -> None:
        if failed.kind not in self.warned:
            self.warned.add(failed.kind)
            self._warn(
                f"--exporter {self.base_url} --target {self.target}: {failed}; a step "
                "without an evaluation read records no batching"
            )
