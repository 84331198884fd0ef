"""`bitnest serve` (scripts/serve.py): an OpenAI-compatible HTTP server over one nested checkpoint, loaded once
(docs/serve.md): chat and text completions, streamed or whole, with speculation and energy figures in every usage."""

import argparse
import sys

from edge.backends import check_backend
from edge.cli.common import run_cli
from edge.cli.llm_options import add_llm_arguments, llm_config, make_llm
from edge.cli.options import checkpoint_arg
from edge.errors import BitNestError


def _port(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {v}")
    return v


def _queue(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {v}")
    return v


def parser(prog: str = "serve.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    add_llm_arguments(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    g.add_argument("--port", type=_port, default=8080, help="0: a free port (the line on stderr names it)")
    g.add_argument("--max-queue", type=_queue, default=8, help="requests that may wait while one generates; "
                   "past them a request is refused with 429 and Retry-After")
    g.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (info: one line per request)")
    return p


def serve(a) -> dict:
    try:
        import uvicorn

        from edge.serve.app import create_app
    except ImportError as e:
        raise BitNestError(f"bitnest serve needs the serve extra ({e.name} is missing): pip install -e .[serve]") \
            from None
    llm = make_llm(a, llm_config(a))
    try:
        app = create_app(llm, a.max_queue)
        config = uvicorn.Config(app, host=a.host, port=a.port, log_level=a.log_level, timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)

        def announce():        # once the socket listens: the address it got (a free port with --port 0)
            for s in server.servers:
                for sock in s.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"bitnest serve: {llm.name} on http://{host}:{port} ({llm.runtime.backend} backend, "
                          f"{llm.config.policy} policy, context {llm.capacity})", file=sys.stderr, flush=True)

        import asyncio

        async def run():
            task = asyncio.ensure_future(server.serve())
            while not server.started and not task.done():
                await asyncio.sleep(0.05)
            if server.started:
                announce()
            await task

        asyncio.run(run())
        if not server.started:
            raise BitNestError(f"could not listen on {a.host}:{a.port} (in use, or not an address of this machine)")
    finally:
        llm.close()
    return {"served": llm.name, "requests": sum(app.state.server.metrics.requests.values())}


def main(argv=None, default_checkpoint=None) -> int:
    a = parser().parse_args(argv)

    def body():
        check_backend(a.backend)
        llm_config(a)                                   # bad options fail before a checkpoint is made or read
        a.checkpoint = checkpoint_arg(a, default_checkpoint)
        return serve(a)

    return run_cli(body, False, "serve.py", echo=False)
