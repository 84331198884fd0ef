"""The settings of `bitnest serve` as typed data: the queue, the key, the hosts and origins it answers, its caps and
timeouts (checked once, here), and the Host names a bind address accepts by default."""

import ipaddress
import socket
from dataclasses import dataclass
from typing import Optional

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine."""
    if host == "localhost":
        return True
    return is_ip(host) and ipaddress.ip_address(host).is_loopback


def default_hosts(bind: str) -> tuple[str, ...]:
    """The Host names a server bound to `bind` answers unless told (--allowed-host): the loopback names and the bound
    address; bound to every interface, also this machine's name (and NAME.local) and any IP address (a DNS
    rebinding page always sends a domain name: `ip` stands for every IP literal)."""
    names = [*LOOPBACK_NAMES]
    if bind in WILDCARDS:
        host = socket.gethostname().lower()
        names += [host, f"{host}.local", "ip"]
    elif bind.lower() not in names:
        names.append(bind.lower())
    return tuple(names)


@dataclass(frozen=True)
class ServeConfig:
    """`max_queue` requests may wait while one generates (then 429 with Retry-After `retry_after`). `api_key`: the
    Bearer token every route but /health requires (None: none). `allowed_hosts`: Host header names answered (`*`:
    any; `ip`: any IP literal), else 421. `cors_origins`: browser origins allowed to call (none by default).
    `max_tokens`: a cap on every request's new tokens; `time_limit`: seconds a generation may run (it then ends with
    finish reason `length`). Timeouts in seconds: `header_timeout` for a request's headers, `body_timeout` for its
    body, `keep_alive` for an idle connection between requests; `max_connections` open at once (503 past them).
    `sse_ping`: seconds a stream may go without a byte (queued behind other generations, or in a long prompt's
    prefill) before the server sends an SSE comment, so a proxy's idle timeout does not cut it."""

    max_queue: int = 8
    retry_after: int = 1
    api_key: Optional[str] = None
    allowed_hosts: tuple[str, ...] = LOOPBACK_NAMES
    cors_origins: tuple[str, ...] = ()
    max_tokens: Optional[int] = None
    time_limit: Optional[float] = None
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive: float = 5.0
    max_connections: int = 64
    sse_ping: float = 15.0

    def __post_init__(self):
        if self.max_queue < 0 or self.retry_after < 0:
            raise ValueError("the queue bound and Retry-After must be at least 0")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key must not be empty")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("--max-tokens must be at least 1")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError("--time-limit must be more than 0 seconds")
        if min(self.header_timeout, self.body_timeout, self.keep_alive, self.sse_ping) <= 0 or self.max_connections < 1:
            raise ValueError("timeouts must be more than 0 seconds and the connection limit at least 1")
        object.__setattr__(self, "allowed_hosts", tuple(h.lower() for h in self.allowed_hosts))

    def host_allowed(self, host: Optional[str]) -> bool:
        """Whether a request whose Host header is `host` (port and brackets allowed) is answered; none: yes (HTTP/1.0,
        which no browser sends)."""
        if host is None or "*" in self.allowed_hosts:
            return True
        name = host.strip().lower()
        if name.startswith("["):                       # [::1]:8080
            name = name[1:].split("]", 1)[0]
        elif name.count(":") == 1:                     # name:8080 (an IPv6 address without brackets has several)
            name = name.split(":", 1)[0]
        return name in self.allowed_hosts or "ip" in self.allowed_hosts and is_ip(name)
