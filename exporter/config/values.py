"""The checks on every configuration value, whichever source gave it (YAML, a flag, a
file_sd label), and the redaction of URLs for messages.

Each check takes the value as given and returns it checked (a URL without a path gains
/metrics), or raises `Invalid` whose text says what is wrong; the caller adds where the
value came from. A URL's query may hold keys (`__param_*`): `redacted_url` and
`redact_url_in` keep them out of what is shown.
"""

from __future__ import annotations

import ipaddress
import math
import re
from urllib.parse import urlsplit, urlunsplit

from batchscope.exporter.config.line_numbered import as_written, wrong_type
from batchscope.exporter.engines import engine_choices, latency_kinds

DEFAULT_LISTEN_HOST = "127.0.0.1"


class Invalid(Exception):
    """A value failed its check; the caller says where the value came from."""


def _wrong_type(value: object, expected: str) -> Invalid:
    return Invalid(wrong_type(value, expected))


def finite_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type(value, "a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise Invalid(f"must be a finite number (got {as_written(value)})")
    return number


def positive(value: object) -> float:
    number = finite_number(value)
    if number <= 0:
        raise Invalid(f"must be > 0 (got {as_written(value)})")
    return number


def cap(value: object) -> float:
    """A batch cap: a whole number of sequences, at least 1 (256 and 256.0 alike)."""
    number = positive(value)
    if not number.is_integer():
        raise Invalid(f"must be a whole number >= 1 (got {as_written(value)})")
    return number


def non_negative(value: object) -> float:
    number = finite_number(value)
    if number < 0:
        raise Invalid(f"must be >= 0 (got {as_written(value)})")
    return number


def quantile(value: object) -> float:
    number = finite_number(value)
    if not 0 < number < 1:
        raise Invalid(f"must be between 0 and 1, both excluded (got {as_written(value)})")
    return number


def scale(value: object) -> float:
    number = finite_number(value)
    if not 0 < number <= 1:
        raise Invalid(f"must be > 0 and <= 1 (got {as_written(value)})")
    return number


def threshold(value: object) -> float:
    number = finite_number(value)
    if not 0 < number <= 10:
        raise Invalid(f"must be > 0 and <= 10 (got {as_written(value)})")
    return number


def count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(value, "a whole number")
    if value < 1:
        raise Invalid(f"must be >= 1 (got {value})")
    return value


# Never zero replicas: a model scaled to zero has no series left to scale it back up.
NO_ZERO = "a model scaled to zero has no pods, so no series to scale it back up"


def min_replicas(value: object) -> int:
    """A count, whose 0 is refused saying why."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise Invalid(f"must be >= 1: {NO_ZERO} (got {value})")
    return count(value)


def whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(value, "a whole number")
    if value < 0:
        raise Invalid(f"must be >= 0 (got {value})")
    return value


def shard(value: object) -> str:
    given = text(value)
    index, slash, count = given.partition("/")
    if not (slash and index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise Invalid(f"must be K/N with 0 <= K < N, e.g. 0/4 (got {given!r})")
    return f"{int(index)}/{int(count)}"


def text(value: object) -> str:
    if not isinstance(value, str):
        raise _wrong_type(value, "a string")
    if not value.strip():
        raise Invalid("must not be empty")
    return value


def name(value: object) -> str:
    given = text(value)
    if any(not c.isprintable() for c in given):
        raise Invalid(f"must be printable text without line breaks (got {given!r})")
    return given


# --replica-count: auto counts unless the exporter sees a shard of the fleet.
REPLICA_COUNTS = ("auto", "on", "off")


def replica_count(value: object) -> str:
    return one_of(value, REPLICA_COUNTS)


def one_of(value: object, options: tuple[str, ...]) -> str:
    given = text(value)
    if given not in options:
        raise Invalid(f"must be one of {', '.join(options)} (got {given!r})")
    return given


def engine(value: object) -> str:
    return one_of(value, engine_choices())


def histogram(value: object) -> str:
    return one_of(value, latency_kinds())


def url(value: object) -> str:
    """A scrape URL: an http(s) URL with a host and no credentials; no path means /metrics."""
    given = http_url(value)
    parts = urlsplit(given)
    return given if parts.path else urlunsplit(parts._replace(path="/metrics"))


def http_url(value: object) -> str:
    """An http(s) URL with a host and no credentials, as given."""
    given = text(value)
    # A URL with '@' may carry a password: it is never echoed back.
    got = "" if "@" in given else f" (got {given!r})"
    if any(c.isspace() for c in given):
        raise Invalid(f"must not contain spaces{got}")
    try:
        parts = urlsplit(given)
        parts.port  # noqa: B018 - reading the port validates it
    except ValueError:
        raise Invalid(f"is not a valid URL{got}") from None
    if "@" in parts.netloc:
        raise Invalid(
            "must not contain credentials; use auth: with token_env/token_file "
            "or password_env/password_file"
        )
    if parts.scheme.lower() not in ("http", "https"):
        raise Invalid(f"must be an http:// or https:// URL{got}")
    if not parts.hostname:
        raise Invalid(f"has no host{got}")
    return given


def redacted_url(url: str) -> str:
    """The URL with every query value replaced: `__param_*` values may hold keys."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    names = [pair.split("=", 1)[0] for pair in parts.query.split("&")]
    return urlunsplit(parts._replace(query="&".join(f"{n}=REDACTED" for n in names)))


def redact_url_in(text: str, url: str) -> str:
    """`text` (an error message) with the URL and its query shown as `redacted_url` does."""
    query = urlsplit(url).query
    if not query:
        return text
    redacted = redacted_url(url)
    return text.replace(url, redacted).replace(query, urlsplit(redacted).query)


def split_host_port(text: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT, port 0-65535; an empty host is returned as ''."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Invalid(f"has an invalid IPv6 address in brackets (got {text!r})") from None
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            raise Invalid(f"needs brackets around an IPv6 address, e.g. [::1]:9500 (got {text!r})")
    if not sep or any(c.isspace() or c in "/@?#[]" for c in host):
        raise Invalid(f"must be HOST:PORT, e.g. 127.0.0.1:9500 (got {text!r})")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise Invalid(f"needs a port from 0 to 65535 (got {text!r})")
    return host, int(port)


def listen(value: object) -> str:
    """HOST:PORT to bind; ':PORT' binds 127.0.0.1, not every interface."""
    host, port = split_host_port(text(value))
    host = host or DEFAULT_LISTEN_HOST
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name(value: object) -> str:
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        # Not echoed: a token pasted here by mistake must not reach a log.
        raise Invalid(
            "must be the name of an environment variable (letters, digits, _), not the secret"
        )
    return value


def username(value: object) -> str:
    given = name(value)
    if ":" in given:
        raise Invalid(
            f"must not contain ':' (basic auth separates it from the password there) (got {given!r})"
        )
    return given
