"""What one client may hold of the server: its time to send a request, and the server's share of
connections.

uvicorn closes a keep-alive connection that stays idle (``timeout_keep_alive``), refuses work past
``limit_concurrency`` connections and tasks with a 503, and bounds a request's headers
(``h11_max_incomplete_event_size``). It has no deadline for *reading* a request: a client that
sends its headers one byte at a time (slowloris), or its body that slowly, holds its connection for
as long as it likes. ``ReadTimeoutH11Protocol`` adds one: a request must arrive whole, headers and
body, within ``request_read_timeout`` seconds of its connection opening or of the previous response
ending; else the connection is closed. Streaming a long answer back is not reading, so it has no
deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ServerLimits:
    """The limits ``minillm serve`` sets (flags of the same names), with its defaults."""

    request_read_timeout: float = 30.0  # seconds to send one whole request (headers and body)
    timeout_keep_alive: float = 5.0  # seconds an idle keep-alive connection stays open (uvicorn's default)
    limit_concurrency: int = 1024  # connections and tasks at once; past it, 503
    h11_max_incomplete_event_size: int = 64 * 1024  # bytes of request headers

    def __post_init__(self):
        for name in ("request_read_timeout", "timeout_keep_alive"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        for name in ("limit_concurrency", "h11_max_incomplete_event_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def uvicorn_options(self) -> dict:
        """The options of ``uvicorn.Config`` these limits set."""
        protocol = type(
            "ReadTimeoutH11Protocol", (ReadTimeoutH11Protocol,), {"read_timeout": self.request_read_timeout}
        )
        return {
            "http": protocol,
            "timeout_keep_alive": self.timeout_keep_alive,
            "limit_concurrency": self.limit_concurrency,
            "h11_max_incomplete_event_size": self.h11_max_incomplete_event_size,
        }


class ReadTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for reading each request (see the module docstring)."""

    read_timeout = ServerLimits.request_read_timeout

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._read_deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._read_deadline.cancel()  # the next request on this connection gets a deadline of its own
        if not self.transport.is_closing():
            self._read_deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def connection_lost(self, exc) -> None:
        self._read_deadline.cancel()
        super().connection_lost(exc)

    def _read_timed_out(self) -> None:
        waiting_for_headers = self.cycle is None or self.cycle.response_complete
        if (waiting_for_headers or self.cycle.more_body) and not self.transport.is_closing():
            self.transport.close()  # the app, if it is reading the body, hears of it as a disconnect
