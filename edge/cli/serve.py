"""`bitnest serve` (scripts/serve.py): an OpenAI-compatible HTTP server over one nested checkpoint, loaded once
(docs/serve.md): chat and text completions, streamed or whole, with speculation and energy figures in every usage."""

import argparse
import asyncio
import signal
import socket
import sys
import threading

from edge.argtypes import Parser, count
from edge.backends import check_backend
from edge.cli.common import run_cli
from edge.cli.llm_options import add_llm_arguments, llm_config, make_llm
from edge.cli.options import checkpoint_arg
from edge.errors import BitNestError


def parser(prog: str = "serve.py") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=__doc__)
    add_llm_arguments(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    g.add_argument("--port", type=count(0, 65535), default=8080, help="0: a free port (the line on stderr names it)")
    g.add_argument("--max-queue", type=count(0), default=8, help="requests that may wait while one generates; "
                   "past them a request is refused with 429 and Retry-After")
    g.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (info: one line per request)")
    return p


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
    """Load the LLM, listen, serve until SIGINT (exit 130) or SIGTERM (a graceful stop, exit 0)."""
    try:
        import uvicorn

        from edge.serve.app import create_app
    except ImportError as e:
        raise BitNestError(f"bitnest serve needs the serve extra ({e.name} is missing): pip install -e .[serve]") \
            from None
    sock = _listen(a.host, a.port)                      # a taken port fails before the model loads
    try:
        llm = make_llm(a, llm_config(a))
        try:
            app = create_app(llm, a.max_queue)
            server = uvicorn.Server(uvicorn.Config(app, log_level=a.log_level, timeout_graceful_shutdown=5))
            host, port = sock.getsockname()[:2]
            print(f"bitnest serve: {llm.name} on http://{host}:{port} ({llm.runtime.backend} backend, "
                  f"{llm.config.policy} policy, context {llm.capacity}, queue {a.max_queue})", file=sys.stderr,
                  flush=True)
            _serve_until_stopped(server, sock)
        finally:
            llm.close()
    finally:
        sock.close()
    return {"served": llm.name, "requests": sum(app.state.server.metrics.requests.values())}


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


def main(argv=None, default_checkpoint=None) -> int:
    a = parser().parse_args(argv)

    def body():
        check_backend(a.backend)
        llm_config(a)                                   # bad options fail before a checkpoint is made or read
        a.checkpoint = checkpoint_arg(a, default_checkpoint)
        return serve(a)

    return run_cli(body, False, "serve.py", echo=False)
