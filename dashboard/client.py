"""Reading the exporter's JSON API over HTTP, with errors that say what to check."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

# How the command line tells the app (a Streamlit script) where to read from.
EXPORTER_ENV = "BATCHSCOPE_EXPORTER_URL"
PROMETHEUS_ENV = "BATCHSCOPE_PROMETHEUS_URL"
DEFAULT_EXPORTER = "http://127.0.0.1:9500"
SUPPORTED_API_MAJOR = 1
TIMEOUT_SECONDS = 5.0


class SourceError(Exception):
    """The exporter (or Prometheus) could not be read; the message says what to check."""


def check_api_version(doc: dict, url: str) -> dict:
    """`doc` unchanged when its `api_version` is one this dashboard reads (or absent).

    Raises SourceError naming both versions for an unknown major version.
    """
    version = doc.get("api_version")
    if version is None:
        return doc
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        raise SourceError(f"{url} answered with api_version {version!r}, not a number") from None
    if major != SUPPORTED_API_MAJOR:
        raise SourceError(
            f"{url} speaks API version {version}; this dashboard reads version "
            f"{SUPPORTED_API_MAJOR}. Run the dashboard and the exporter from the same "
            "batchscope release."
        )
    return doc


def get_json(url: str, timeout: float = TIMEOUT_SECONDS, flag: str = "--exporter") -> dict:
    """The JSON object at `url`; SourceError in words for every way it can fail.

    `flag` names the option that set the URL, for the message when it cannot be reached.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as err:
        detail = err.read(300).decode("utf-8", "replace").strip()
        raise SourceError(f"{url} answered HTTP {err.code}: {detail or err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise SourceError(
            f"cannot reach {url} ({reason}). Check that the server runs, that the URL "
            f"and port are right ({flag}), and the server's log."
        ) from None
    try:
        doc = json.loads(body)
    except ValueError as err:
        raise SourceError(f"{url} did not answer JSON ({err}): is it the exporter?") from None
    if not isinstance(doc, dict):
        raise SourceError(f"{url} answered JSON that is not an object: is it the exporter?")
    return check_api_version(doc, url)


def api_url(base: str, path: str, **query: str) -> str:
    """`base` (the exporter's root URL) joined with an API path and query."""
    url = base.rstrip("/") + path
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


def signals(base: str) -> dict:
    return get_json(api_url(base, "/api/v1/signals"))


def fleet_summary(base: str) -> dict:
    """Each target's row of a fleet overview (`/api/v1/signals?view=summary`)."""
    return get_json(api_url(base, "/api/v1/signals", view="summary"))


def target_signals(base: str, target: str) -> dict | None:
    """One configured target's full signals, or None before its first scrape."""
    targets = get_json(api_url(base, "/api/v1/signals", target=target))["targets"]
    return targets[0] if targets else None


def replicas(base: str) -> dict:
    """Every model's replica count (`/api/v1/replicas`)."""
    return get_json(api_url(base, "/api/v1/replicas"))


# More points than any history keeps: the exporter answers each target's whole history.
ALL_POINTS = 1_000_000


def history(base: str, target: str | None = None) -> dict:
    """One target's history ({"target", "points"}) or, without a target, every target's
    ({"targets": name -> points}, gathered from the exporter's pages of targets)."""
    if target is not None:
        return get_json(api_url(base, "/api/v1/history", target=target))
    first = get_json(api_url(base, "/api/v1/history", points=str(ALL_POINTS)))
    targets = dict(first["targets"])
    for page in range(1, first["pages"]):
        body = get_json(api_url(base, "/api/v1/history", points=str(ALL_POINTS), page=str(page)))
        targets.update(body["targets"])
    return {**first, "targets": targets}
