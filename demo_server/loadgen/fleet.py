"""A fleet: the base URLs one load test offers its arrivals to, and which one each goes to.

`choose_replica` is the policy, pure: `round-robin` sends the n-th request to URL n mod N;
`least-outstanding` sends it to the URL with the fewest requests sent and not yet
answered, ties going round robin (nginx's `least_conn` picks the same way), so an idle
fleet is loaded evenly and a slow replica gets fewer requests as its backlog grows.
`Balancer` keeps one step's counts and asks the policy; one URL is a fleet of one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BALANCE_POLICIES = ("round-robin", "least-outstanding")
DEFAULT_URL = "http://127.0.0.1:8000"


def choose_replica(policy: str, outstanding: Sequence[int], turn: int) -> int:
    """The index of the URL the `turn`-th request (0 first) goes to, given each URL's
    requests `outstanding` (sent, not answered)."""
    count = len(outstanding)
    if count == 0:
        raise ValueError("a fleet needs at least one URL")
    if policy == "round-robin":
        return turn % count
    if policy != "least-outstanding":
        raise ValueError(f"balance must be one of {BALANCE_POLICIES}, got {policy!r}")
    # The fewest outstanding; among those, the first counting from where round robin stands.
    return min(range(count), key=lambda index: (outstanding[index], (index - turn) % count))


def split_urls(values: Iterable[str]) -> tuple[str, ...]:
    """Base URLs from repeated or comma-separated values, in order, trailing slashes
    dropped; ValueError for an empty one or one given twice (its results would merge)."""
    given = list(values)
    urls = [url.strip().rstrip("/") for value in given for url in value.split(",")]
    if any(not url for url in urls):
        raise ValueError(f"an empty base URL in {given!r}")
    repeated = sorted({url for url in urls if urls.count(url) > 1})
    if repeated:
        raise ValueError(f"base URL given more than once: {', '.join(repeated)}")
    return tuple(urls)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The base URLs a test loads and the policy that spreads its requests over them."""

    urls: tuple[str, ...]
    balance: str = "round-robin"

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("a fleet needs at least one URL")
        if self.balance not in BALANCE_POLICIES:
            raise ValueError(f"balance must be one of {BALANCE_POLICIES}, got {self.balance!r}")

    @classmethod
    def of(cls, target: str | Fleet) -> Fleet:
        """`target` as a fleet: one base URL is a fleet of one."""
        return target if isinstance(target, Fleet) else cls(split_urls([target]))


class Balancer:
    """One step's requests outstanding per URL, and the policy's choice for the next."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.outstanding = [0] * len(fleet.urls)
        self.turn = 0

    def take(self) -> int:
        """The URL index the next request goes to, counted outstanding until `release`."""
        index = choose_replica(self.fleet.balance, self.outstanding, self.turn)
        self.turn += 1
        self.outstanding[index] += 1
        return index

    def release(self, index: int) -> None:
        """The request sent to URL `index` has answered (or failed)."""
        self.outstanding[index] -= 1
