"""The exporter's own alerts, posted to Alertmanager's v2 API by an asyncio task.

Its own task with its own timeouts: an Alertmanager that is down or slow delays only
this task, never a scrape. What to post is decided by exporter/alerts/book.py (pure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

import aiohttp

from batchscope.exporter.alerts.book import (
    KEEP_SECONDS,
    STALE_SECONDS,
    AlertBook,
    delivered,
    payload,
    step,
)
from batchscope.exporter.alerts.specs import AlertWords
from batchscope.exporter.core.evaluate import TargetSignals

log = logging.getLogger("batchscope.alertmanager")

POST_TIMEOUT_SECONDS = 5.0
# Retries after a failed post wait 1, 2, 4 ... seconds, at most this long.
MAX_BACKOFF_SECONDS = 60.0


def alerts_endpoint(base_url: str) -> str:
    """Alertmanager's v2 alerts endpoint under its base URL."""
    return base_url.rstrip("/") + "/api/v2/alerts"


class AlertmanagerDelivery:
    """Evaluates the alerts every `interval_seconds` and posts what changed.

    Unsent alerts stay queued (the latest state of each) until a post succeeds; retries
    back off exponentially. `holds` overrides an alert's hold by name; `stale_seconds`:
    how long a target's conditions outlast scrapes that could not read it, and
    `keep_seconds` how much longer a fired saturation alert does (`step`);
    `words`: the configured numbers the alerts' texts state.
    """

    def __init__(
        self,
        base_url: str,
        source: Callable[[], Iterable[TargetSignals]],
        *,
        generator_url: str,
        interval_seconds: float,
        clock: Callable[[], float] = time.time,
        holds: Mapping[str, float] | None = None,
        stale_seconds: float = STALE_SECONDS,
        keep_seconds: float = KEEP_SECONDS,
        words: AlertWords | None = None,
    ) -> None:
        self.endpoint = alerts_endpoint(base_url)
        self.source = source
        self.generator_url = generator_url
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.holds = holds
        self.stale_seconds = stale_seconds
        self.keep_seconds = keep_seconds
        self.words = words or AlertWords(holds=holds or {})
        self.book = AlertBook()
        self.backoff = 0.0
        self.retry_at = 0.0

    async def deliver_once(self, session: aiohttp.ClientSession) -> None:
        """One evaluation, and a post of the queued alerts unless a retry is not due yet."""
        self.book = step(
            self.book,
            self.source(),
            self.clock(),
            self.holds,
            self.stale_seconds,
            self.keep_seconds,
        )
        if not self.book.unsent or time.monotonic() < self.retry_at:
            return
        body = [
            payload(alert, self.generator_url, self.words) for alert in self.book.unsent.values()
        ]
        try:
            async with session.post(self.endpoint, json=body) as response:
                if response.status >= 300:
                    raise aiohttp.ClientResponseError(
                        response.request_info,
                        (),
                        status=response.status,
                        message=(await response.text())[:200],
                    )
        except (aiohttp.ClientError, TimeoutError) as err:
            self.backoff = min(max(1.0, 2 * self.backoff), MAX_BACKOFF_SECONDS)
            self.retry_at = time.monotonic() + self.backoff
            log.warning(
                "alertmanager %s: %d alert(s) not posted, retry in %g s: %s",
                self.endpoint,
                len(body),
                self.backoff,
                err,
            )
            return
        self.book = delivered(self.book)
        self.backoff = 0.0
        log.info("alertmanager: posted %d alert(s)", len(body))

    async def run_forever(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                try:
                    await self.deliver_once(session)
                except Exception:  # a bug here must not end alerting
                    log.exception("alert delivery failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_seconds)
