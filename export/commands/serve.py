"""`bitnest serve` (scripts/serve.py): an OpenAI-compatible HTTP server over one nested checkpoint, loaded once
(docs/serve.md): chat and text completions, streamed or whole, with speculation and energy figures in every usage."""

import argparse
import asyncio
import os
import signal
import socket
import sys
import threading

from edge.argtypes import Parser, count, positive
from edge.backends import check_backend
from edge.options.run import run_cli
from edge.options.llm_args import add_llm_arguments, llm_config, make_llm
from edge.options.groups import checkpoint_arg
from edge.errors import BitNestError
from export.commands import default_checkpoint


def parser(prog: str = "serve.py") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=__doc__)
    add_llm_arguments(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface; with no "
                   "API key that lets anyone who reaches the port generate: one warning line says so)")
    g.add_argument("--port", type=count(0, 65535), default=8080, help="0: a free port (the line on stderr names it)")
    g.add_argument("--max-queue", type=count(0), default=8, help="requests that may wait while one generates; "
                   "past them a request is refused with 429 and Retry-After")
    g.add_argument("--api-key", help=f"require Authorization: Bearer KEY on every route but /health (401 without "
                   f"it); default: ${API_KEY_ENV}, which keeps the key out of the process list")
    g.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name to answer besides localhost, 127.0.0.1, ::1 and --host (with 0.0.0.0: also "
                   "this machine's name and any IP address); others get 421. Repeat it; '*' answers any")
    g.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a browser origin allowed to call the API, e.g. http://localhost:3000 (repeat it; none by "
                   "default)")
    g.add_argument("--max-tokens", type=count(1), help="cap on every request's new tokens (default: what the "
                   "context leaves after the prompt)")
    g.add_argument("--time-limit", type=positive(), metavar="S", help="seconds a generation may run: it then "
                   "ends with finish_reason length and usage.bitnest.time_limited true (default: none)")
    g.add_argument("--header-timeout", type=positive(), default=10.0, metavar="S",
                   help="seconds for a request's headers to arrive (then 408 and the connection closes)")
    g.add_argument("--body-timeout", type=positive(), default=30.0, metavar="S",
                   help="seconds for a request's body to arrive (then 408)")
    g.add_argument("--keep-alive", type=positive(), default=5.0, metavar="S",
                   help="seconds an idle connection stays open between requests")
    g.add_argument("--sse-ping", type=positive(), default=15.0, metavar="S",
                   help="seconds a stream may go without a byte (queued, or in a long prefill) before an SSE comment "
                   "line is sent, so proxies' idle timeouts keep it")
    g.add_argument("--max-connections", type=count(1), default=64,
                   help="connections open at once; one more gets 503 and is closed")
    g.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (info: one line per request)")
    return p


API_KEY_ENV = "BITNEST_API_KEY"


def serve_config(a):
    """The server's settings from the options (the key from $BITNEST_API_KEY unless --api-key gives one)."""
    from edge.serve.config import ServeConfig, default_hosts
    return ServeConfig(max_queue=a.max_queue, api_key=a.api_key or os.environ.get(API_KEY_ENV) or None,
                       allowed_hosts=default_hosts(a.host) + tuple(a.allowed_host),
                       cors_origins=tuple(a.cors_origin), max_tokens=a.max_tokens, time_limit=a.time_limit,
                       header_timeout=a.header_timeout, body_timeout=a.body_timeout, keep_alive=a.keep_alive,
                       max_connections=a.max_connections, sse_ping=a.sse_ping)


class _Stopped(Exception):
    """SIGTERM, raised once uvicorn has shut down gracefully (it raises the signal again after its shutdown)."""


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or a one-line error saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        raise BitNestError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(a) -> dict:
    """Listen, answer at once (/health 503 while the model loads on the engine thread), serve until SIGINT (exit
    130) or SIGTERM (a graceful stop: running generations end at their next round, exit 0)."""
    try:
        import uvicorn

        from edge.serve.app import Server, create_app
        from edge.serve.config import is_loopback
        from edge.serve.connection import protocol_class
    except ImportError as e:
        raise BitNestError(f"bitnest serve needs the serve extra ({e.name} is missing): pip install -e .[serve]") \
            from None
    config = serve_config(a)
    sock = _listen(a.host, a.port)                      # a taken port fails before the model loads
    try:
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"

        def ready(llm):
            print(f"bitnest serve: {llm.name} ready on {url} ({llm.backend} backend, {llm.config.policy} "
                  f"policy, context {llm.capacity}, queue {a.max_queue})", file=sys.stderr, flush=True)

        server = Server(config, lambda: make_llm(a, llm_config(a)), ready, lambda e: setattr(uv, "should_exit", True))
        uv = _uvicorn(server, uvicorn.Config(
            create_app(server), log_level=a.log_level, timeout_graceful_shutdown=5, timeout_keep_alive=a.keep_alive,
            http=protocol_class(config.header_timeout, config.max_connections)))
        if config.api_key is None and not is_loopback(a.host):
            print(f"bitnest serve: warning: {a.host} is reachable from other machines and no API key is set: anyone "
                  f"who reaches port {port} can generate (set ${API_KEY_ENV} or --api-key)", file=sys.stderr)
        print(f"bitnest serve: loading {a.checkpoint} on {url} (/health answers 503 until it is ready)",
              file=sys.stderr, flush=True)
        try:
            _serve_until_stopped(uv, sock)
        finally:
            if server.llm is not None:
                server.llm.close()
    finally:
        sock.close()
    if server.load_error is not None:
        raise server.load_error
    if server.llm is None:
        print("bitnest serve: stopped while the model loaded", file=sys.stderr)
    return {"served": server.llm.name if server.llm is not None else None,
            "requests": sum(server.metrics.requests.values())}


def _uvicorn(server, config):
    """uvicorn's server that, told to exit (SIGTERM, SIGINT), first ends every queued and running generation of
    `server` (edge.serve.app.Server): their clients get 503 at once and the graceful shutdown does not wait on them."""
    import uvicorn

    class Stopping(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if server.loop is not None:
                server.loop.call_soon_threadsafe(server.stop)
            super().handle_exit(sig, frame)
    return Stopping(config)


def _serve_until_stopped(server, sock: socket.socket) -> None:
    """uvicorn on `sock`; SIGTERM ends it gracefully (uvicorn raises the signal again once shut down: here that
    raises _Stopped, caught, so the LLM closes and the exit code is 0)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except _Stopped:
        print("bitnest serve: stopped (SIGTERM)", file=sys.stderr)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _stop(signum, frame):
    raise _Stopped()


def main(argv=None) -> int:
    a = parser().parse_args(argv)

    def body():
        check_backend(a.backend)
        llm_config(a)                                   # bad options fail before a checkpoint is made or read
        serve_config(a)
        a.checkpoint = checkpoint_arg(a, default_checkpoint)
        return serve(a)

    return run_cli(body, False, "serve.py", echo=False)
