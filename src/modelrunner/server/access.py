"""What the request recorder (server/recorder.py) and the request metrics (server/request_metrics.py) are
told of a request, as frozen records: its head when an engine starts answering it, then its access line
when it is over. server/lifecycle.py makes both from its exchange; neither reader needs the exchange."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestHead:
    method: str
    path: str
    api: str  # its API family (server/errors.api_family)
    request_id: str  # its X-Request-Id
    user_agent: str
    started: float  # monotonic time of its first byte


@dataclass(frozen=True)
class Access:
    """A finished request, as its access line says it."""

    head: RequestHead
    model: str | None  # as it was asked for
    status: int  # 499 for a client that left unanswered, 0 when nothing was answered
    bytes_out: int
    ttfb_ms: float | None
    duration_ms: float
    outcome: str  # complete, incomplete, client_left or aborted

    def fields(self) -> dict[str, object]:
        """The fields of the access line."""
        return {
            "method": self.head.method,
            "path": self.head.path[:200],
            "api": self.head.api,
            "model": self.model[:200] if self.model else None,
            "status": self.status,
            "bytes": self.bytes_out,
            "ttfb_ms": self.ttfb_ms,
            "duration_ms": self.duration_ms,
            "outcome": self.outcome,
        }
