"""The HTTP/1.1 connection of `bitnest serve`: uvicorn's h11 protocol with what it lacks for a server left running
on a network: a time limit on a request's headers (a client that sends them a byte at a time, or half of them, is
dropped with 408 instead of holding its connection for ever) and a bound on open connections (past it a new one gets
503 in OpenAI's shape and is closed). Used whatever uvicorn would pick (httptools has neither)."""

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def _raw_response(status: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
            "connection: close\r\n\r\n").encode() + data


def _error(message: str, code: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def protocol_class(header_timeout: float, max_connections: int) -> type:
    """An H11Protocol whose requests' headers must arrive within `header_timeout` seconds of the connection opening
    (or of its first byte after a finished request), and of which at most `max_connections` are open at once."""

    class BoundedH11(H11Protocol):
        _header_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(_raw_response("503 Service Unavailable", _error(
                    f"the server holds {max_connections} connections already: retry later", "too_many_connections",
                    "server_error")))
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                if self._header_timer is None:         # the first bytes of a next request
                    self._arm()
            else:
                self._disarm()                          # its headers are in (or the connection is done)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.write(_raw_response("408 Request Timeout", _error(
                    f"the request's headers did not arrive within {header_timeout:g} s", "request_timeout",
                    "invalid_request_error")))
                self.transport.close()

    return BoundedH11
