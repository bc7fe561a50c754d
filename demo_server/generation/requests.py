"""A generation request as the scheduler holds it, and what it gives back.

`check_request` refuses what can never be served (the model's length, the KV cache);
`RequestState` is a request's state from its arrival to its end; `completion_result` turns
that state into the `CompletionResult` its future resolves with. Pure but for the clocks
a new state reads.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]
TokenCallback = Callable[[int], None]


class InvalidRequest(ValueError):
    """A request the scheduler can never serve; `param` names the offending field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class CompletionResult:
    """A finished request. Times are seconds; `arrival_unix` is wall-clock time.

    `queue_time`: arrival to first admission; `ttft`: arrival to first token; `latency`:
    arrival to finish; `token_gaps`: time between consecutive output tokens.
    """

    request_id: str
    prompt_tokens: int
    output: tuple[int, ...]
    max_tokens: int
    finish_reason: FinishReason
    arrival_unix: float
    queue_time: float
    ttft: float | None
    latency: float
    prefill_time: float | None
    decode_time: float | None
    preemptions: int
    token_gaps: tuple[float, ...]

    @property
    def output_tokens(self) -> int:
        return len(self.output)

    def log_record(self) -> dict[str, object]:
        """The request-log line (JSON-ready); `output_tokens` is what batchscope-static-util
        reads."""
        return {
            "id": self.request_id,
            "arrival": round(self.arrival_unix, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "max_tokens": self.max_tokens,
            "finish_reason": self.finish_reason,
            "queue_time": round(self.queue_time, 6),
            "ttft": None if self.ttft is None else round(self.ttft, 6),
            "latency": round(self.latency, 6),
            "preemptions": self.preemptions,
        }


@dataclass(eq=False)
class RequestState:
    """A request's state in the scheduler: its tokens so far, where it stands in the batch
    and the times its result is built from."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    on_token: TokenCallback | None
    future: Future[CompletionResult]
    arrival: float = field(default_factory=time.perf_counter)
    arrival_unix: float = field(default_factory=time.time)
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    first_admitted: float | None = None
    admission: int = 0  # order of the latest admission: the preemption victim is the largest
    kv_tokens: int = 0  # positions of this request's cache written (or reserved, prefilling)
    needs_prefill: bool = True
    # Context tokens prefilled so far in chunks (a token budget): the context is computed
    # in the step of its last chunk, when the request produces its first token.
    prefilled: int = 0
    preemptions: int = 0
    finish_reason: FinishReason | None = None

    @property
    def length(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt) + len(self.output)

    @property
    def pending_prefill(self) -> int:
        """Tokens it still needs to produce its first token, the rest of its context and
        the token itself (0 once it decodes)."""
        return self.length - self.prefilled if self.needs_prefill else 0

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class Finished:
    """A finished request's result and the future it resolves, to announce unlocked."""

    future: Future[CompletionResult]
    result: CompletionResult


@dataclass(frozen=True)
class RequestHandle:
    """What `Scheduler.submit` returns: the id (for `cancel`) and the result's future."""

    request_id: str
    future: Future[CompletionResult]


def check_request(
    prompt_tokens: int, max_tokens: int, max_model_len: int, kv_cache_tokens: int
) -> None:
    """Raise InvalidRequest (naming the field) for a request that can never be served: an
    empty prompt, no output asked, or more tokens than the model or the KV cache holds."""
    if prompt_tokens < 1:
        raise InvalidRequest("prompt", "prompt must hold at least one token")
    if max_tokens < 1:
        raise InvalidRequest("max_tokens", "max_tokens must be at least 1")
    if prompt_tokens >= max_model_len:
        raise InvalidRequest(
            "prompt",
            f"prompt is {prompt_tokens} tokens; the model's maximum length is "
            f"{max_model_len}, output included",
        )
    total = prompt_tokens + max_tokens
    if total > max_model_len:
        raise InvalidRequest(
            "max_tokens",
            f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is "
            f"{total}, more than the model's maximum length {max_model_len}",
        )
    if total > kv_cache_tokens:
        raise InvalidRequest(
            "max_tokens",
            f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is "
            f"{total}, more than the KV cache holds ({kv_cache_tokens} tokens)",
        )


def completion_result(seq: RequestState, reason: FinishReason, now: float) -> CompletionResult:
    """What `seq` gave, finished at `now` (perf_counter seconds) for `reason`."""
    first_token = seq.token_times[0] if seq.token_times else None
    return CompletionResult(
        request_id=seq.request_id,
        prompt_tokens=len(seq.prompt),
        output=tuple(seq.output),
        max_tokens=seq.max_tokens,
        finish_reason=reason,
        arrival_unix=seq.arrival_unix,
        queue_time=(seq.first_admitted or now) - seq.arrival,
        ttft=None if first_token is None else first_token - seq.arrival,
        latency=now - seq.arrival,
        prefill_time=None
        if first_token is None or seq.first_admitted is None
        else first_token - seq.first_admitted,
        decode_time=None if first_token is None else now - first_token,
        preemptions=seq.preemptions,
        token_gaps=tuple(b - a for a, b in itertools.pairwise(seq.token_times)),
    )
