"""What `bitnest serve` checks before a route runs, as ASGI middleware answering in OpenAI's error shape: the Host
header (421: a DNS-rebinding page sends a name the server does not answer to), the API key (401), a JSON body
(415: a browser sends text/plain cross-origin without asking first), and the body itself, read with a size limit
from the context (413) and a time limit (408); a client that leaves mid-upload is let go without an answer or a
traceback."""

import asyncio
import hmac
import json
from typing import Callable, Optional

from edge.serve.config import ServeConfig
from edge.serve.protocol import APIError

UNGUARDED = ("/health",)          # answered without the API key (health probes, load balancers)
DRAIN = 16 << 20                  # bytes of a refused body still read (and dropped) so its client gets the 413


def _header(scope, name: bytes) -> Optional[str]:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


async def send_error(send, e: APIError, headers: Optional[dict] = None, close: bool = False) -> None:
    """An error in OpenAI's shape, straight through ASGI (`close`: the connection closes after it)."""
    body = json.dumps(e.body()).encode()
    extra = {**(headers or {}), **({"connection": "close"} if close else {})}
    await send({"type": "http.response.start", "status": e.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                + [(k.lower().encode(), str(v).encode()) for k, v in extra.items()]})
    await send({"type": "http.response.body", "body": body})


class HostGuard:
    """421 for a Host the server does not answer to (ServeConfig.host_allowed)."""

    def __init__(self, app, config: ServeConfig):
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not self.config.host_allowed(_header(scope, b"host")):
            return await send_error(send, APIError(
                421, f"this server does not answer to Host {_header(scope, b'host')!r} (bitnest serve --allowed-host "
                     "names the hosts it answers to)", None, "invalid_host"))
        await self.app(scope, receive, send)


class RequestGuard:
    """The API key on every route but UNGUARDED; for a POST, a JSON content type and the whole body, read here under
    `body_limit()` bytes (None: no limit known yet, the body is left to the route) and `config.body_timeout`
    seconds, then handed to the route as one message (later receives, a disconnect, go through)."""

    def __init__(self, app, config: ServeConfig, body_limit: Callable[[], Optional[int]]):
        self.app, self.config, self.body_limit = app, config, body_limit
        self.key = config.api_key.encode() if config.api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.key is not None and scope["path"] not in UNGUARDED and scope["method"] != "OPTIONS":
            given = _header(scope, b"authorization") or ""
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.key):
                return await send_error(send, APIError(
                    401, "a missing or wrong API key: send the header Authorization: Bearer KEY", None,
                    "invalid_api_key"), {"WWW-Authenticate": "Bearer"})
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        kind = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return await send_error(send, APIError(
                415, f"the body must be JSON sent as Content-Type: application/json, got {kind or 'none'!r}", None,
                "unsupported_media_type"))
        limit = self.body_limit()
        if limit is None:
            return await self.app(scope, receive, send)
        try:
            body = await self._read(scope, receive, limit)
        except APIError as e:
            return await send_error(send, e, close=e.close)
        if body is None:                  # the client left mid-upload: nobody to answer
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, scope, receive, limit: int) -> Optional[bytes]:
        """The body, or None if the client left. One past `limit` is still read, and dropped, up to DRAIN bytes so
        that the client, still sending, can read the 413 (a connection closed on unread bytes is reset, and the
        answer with it); past DRAIN, or past the time limit, the 413 closes the connection."""
        length = _header(scope, b"content-length")
        too_large = lambda drained: APIError(
            413, f"the body is larger than {limit} bytes, more than any prompt that fits the context needs", None,
            "request_too_large", close=not drained)
        if length is not None and length.isdigit() and int(length) > max(limit, DRAIN):
            raise too_large(False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.body_timeout
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                if size > limit:
                    raise too_large(False) from None
                raise APIError(408, f"the body did not arrive within {self.config.body_timeout:g} s", None,
                               "request_timeout", close=True) from None
            if message["type"] == "http.disconnect":
                return None
            size += len(message.get("body", b""))
            if size <= limit:
                chunks.append(message.get("body", b""))
            elif size > DRAIN:
                raise too_large(False)
            if not message.get("more_body", False):
                if size > limit:
                    raise too_large(True)
                return b"".join(chunks)


def _replay(body: bytes, receive):
    """A receive that gives `body` once, then whatever the connection says next (a disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay
