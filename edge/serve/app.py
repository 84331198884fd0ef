"""The routes of `bitnest serve` (a Starlette app): OpenAI's chat and text completions, whole or as server-sent
events ending in `data: [DONE]`, the model list, health and Prometheus metrics, over one LLM that loads on the
engine thread while the routes already answer (503 until it is ready) and whose generations then run one at a time
there. A bad request is refused before any work with OpenAI's error body and a 4xx (guard.py, prepare.py); a client
that leaves, or a server told to stop, ends its generation at the next round; the server serves on after any error.
"""

import asyncio
import contextlib
import sys
import threading
import time
import traceback
import uuid
from dataclasses import replace
from typing import Callable, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Match, Route

from edge.llm import CANCELLED, LENGTH, LLM, Answer
from edge.model.tokenizer import load_tokenizer
from edge.serve import protocol
from edge.serve.config import ServeConfig
from edge.serve.guard import HostGuard, RequestGuard
from edge.serve.metrics import CONTENT_TYPE, UNMATCHED, Metrics
from edge.serve.prepare import Prepared, Preparer
from edge.serve.protocol import CHAT, APIError, Served
from edge.serve.worker import EngineWorker, QueueFull

CLIENT_GONE = 499          # the status a request whose client left is counted under (nginx's convention)
_END = object()


def error_response(e: APIError, headers=None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, None, code, "server_error")


def server_error(e: Exception) -> APIError:
    """A fault of the server itself (the request was checked before any work): its traceback goes to the server's log
    under an incident id, and the client gets a 500 that names the id and nothing of the fault (its message may hold
    paths, prompts or the model's internals)."""
    incident = uuid.uuid4().hex[:12]
    print(f"bitnest serve: internal error {incident}:", file=sys.stderr)
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    return APIError(500, f"internal error {incident}: the server's log holds its details", None, "internal_error",
                    "server_error")


class Server:
    """The handlers' shared state: the LLM (None while it loads), the preparer with a tokenizer of the front's own
    (the engine thread decodes with the runtime's at the same time), the engine worker, the counters, and the cancel
    events of the generations queued or running (`stop()` sets them all)."""

    def __init__(self, config: ServeConfig, load: Callable[[], LLM],
                 on_ready: Callable[[LLM], None] = lambda llm: None,
                 on_failure: Callable[[BaseException], None] = lambda e: None):
        self.config, self._load, self.on_ready, self.on_failure = config, load, on_ready, on_failure
        self.llm: Optional[LLM] = None
        self.preparer: Optional[Preparer] = None
        self.load_error: Optional[BaseException] = None
        self.worker = EngineWorker(config.max_queue)
        self.metrics = Metrics()
        self.started = int(time.time())
        self.stopping = False
        self.active: set[threading.Event] = set()
        self.loop: Optional[asyncio.AbstractEventLoop] = None     # the event loop, once it runs (stop() goes there)

    # -- life -----------------------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load the LLM and the preparer on the engine thread; then `on_ready(llm)`, or on an error `on_failure`."""
        self.loop = asyncio.get_running_loop()
        def job():
            llm = self._load()
            if self.stopping:                       # stopped while it loaded: nobody will use it
                llm.close()
                return None, None
            try:
                return llm, Preparer(llm, load_tokenizer(llm.ckpt.path), self.config.max_tokens)
            except BaseException:
                llm.close()
                raise
        try:
            llm, preparer = await self.worker.load(job)
        except Exception as e:
            self.load_error = e
            self.on_failure(e)
            return
        self.llm, self.preparer = llm, preparer
        if llm is not None:
            self.on_ready(llm)

    def stop(self) -> None:
        """The server is going down (SIGTERM): every queued or running generation ends at its next round, and their
        clients and new requests get 503."""
        self.stopping = True
        for cancel in list(self.active):
            cancel.set()

    def close(self) -> None:
        """End the workers: the engine's once its cancelled generation ends (not while the model still loads: the
        process exits without it)."""
        self.worker.close(wait=self.llm is not None)
        if self.preparer is not None:
            self.preparer.close()

    def _unavailable(self) -> Optional[APIError]:
        if self.stopping:
            return unavailable("the server is shutting down", "server_shutting_down")
        if self.llm is None:
            return unavailable("the model is loading: retry in a few seconds", "model_loading")
        return None

    # -- plain routes -------------------------------------------------------------------------------------------
    def _model(self) -> dict:
        return {"id": self.llm.name, "object": "model", "created": self.started, "owned_by": "bitnest-edge"}

    async def models(self, request: HTTPRequest) -> Response:
        if (e := self._unavailable()) is not None:
            return error_response(e)
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: HTTPRequest) -> Response:
        if (e := self._unavailable()) is not None:
            return error_response(e)
        name = request.path_params["model"]
        if name != self.llm.name:
            return error_response(APIError(404, f"the model {name!r} does not exist: this server has "
                                                f"{self.llm.name!r}", "model", "model_not_found"))
        return JSONResponse(self._model())

    async def health(self, request: HTTPRequest) -> Response:
        if self.llm is None or self.stopping:
            return JSONResponse({"status": "stopping" if self.stopping else "loading"}, status_code=503)
        rt = self.llm.runtime
        return JSONResponse({"status": "ok", "model": self.llm.name, "backend": rt.backend,
                             "policy": self.llm.config.policy, "context": self.llm.capacity,
                             "queue_length": self.worker.waiting, "generation_running": bool(self.worker.running)})

    async def metrics_text(self, request: HTTPRequest) -> Response:
        return PlainTextResponse(self.metrics.render(self.worker.waiting, self.worker.running),
                                 media_type=CONTENT_TYPE)

    # -- completions --------------------------------------------------------------------------------------------
    async def chat(self, request: HTTPRequest) -> Response:
        return await self._complete(request, protocol.chat_request)

    async def completions(self, request: HTTPRequest) -> Response:
        return await self._complete(request, protocol.completion_request)

    async def _complete(self, request: HTTPRequest, parse) -> Response:
        arrived = time.monotonic()
        try:
            if (e := self._unavailable()) is not None:
                raise e
            p = await self.preparer.prepare(await request.body(), parse)
            if (e := self._unavailable()) is not None:       # told to stop while it was prepared
                raise e
            if p.req.stream:
                return self._stream(request, p, arrived)
            return await self._whole(request, p, arrived)
        except QueueFull as e:
            return error_response(APIError(429, str(e), None, "queue_full", "rate_limit_error"),
                                  {"Retry-After": str(self.config.retry_after)})
        except APIError as e:
            return error_response(e, {"Retry-After": "5"} if e.status == 503 else None)
        except Exception as e:          # a bug: answered in the same shape, and the server serves on
            return error_response(server_error(e))

    def _job(self, p: Prepared, cancel: threading.Event, arrived: float, on_text=None):
        """The generation to run on the engine thread: None if it was cancelled while it waited, else the answer and
        what the server adds to it. A generation past --time-limit ends at its next round with finish reason
        `length`. It counts its answer itself (on the event loop), so one whose client left is counted too."""
        loop = asyncio.get_running_loop()
        limit = self.config.time_limit

        def job():
            if cancel.is_set():            # its client left while it waited, or the server stops
                return None
            started = time.monotonic()
            over = (lambda: False) if limit is None else (lambda: time.monotonic() - started > limit)
            a = self.llm.generate(p.ids, config=p.cfg, stop=p.req.stop, on_text=on_text,
                                  cancelled=lambda: cancel.is_set() or over())
            limited = a.finish_reason == CANCELLED and not cancel.is_set()
            if limited:
                a = replace(a, finish_reason=LENGTH)
            served = Served(started - arrived, limited)
            loop.call_soon_threadsafe(self._finished, a, served, time.monotonic() - arrived)
            return a, served
        return job

    def _finished(self, a: Answer, served: Served, seconds: float) -> None:
        self.metrics.answered(a, served.queue_seconds, seconds)
        stopped = self.llm.energy_failure()
        if stopped:
            print(f"bitnest serve: the power meter stopped ({stopped}); answers go on without J/token",
                  file=sys.stderr)


    def _gone(self) -> Response:
        """The answer of a generation that ended without its client: 503 if the server stops, else nobody listens."""
        if self.stopping:
            return error_response(unavailable("the server is shutting down", "server_shutting_down"))
        return Response(status_code=CLIENT_GONE)

    async def _whole(self, request: HTTPRequest, p: Prepared, arrived: float) -> Response:
        cancel = threading.Event()
        result = self.worker.submit(self._job(p, cancel, arrived))
        self.active.add(cancel)
        watch = asyncio.ensure_future(_watch_disconnect(request, cancel))
        try:
            out = await result
        except BaseException:          # cancelled (the server stopping) or failed: the generation ends too
            cancel.set()
            raise
        finally:
            watch.cancel()
            self.active.discard(cancel)
        if out is None or out[0].finish_reason == CANCELLED:
            return self._gone()
        a, served = out
        rid = f"{'chatcmpl' if p.req.kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}"
        return JSONResponse(protocol.response(rid, int(time.time()), self.llm.name, p.req, a, served))

    def _stream(self, request: HTTPRequest, p: Prepared, arrived: float) -> Response:
        """Server-sent events; the job is queued (or refused with 429) before the response starts."""
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        push = lambda item: loop.call_soon_threadsafe(deltas.put_nowait, item)
        job = self._job(p, cancel, arrived, on_text=push)

        def job_then_end():
            try:
                return job()
            finally:
                push(_END)

        result = self.worker.submit(job_then_end)
        self.active.add(cancel)
        req, name = p.req, self.llm.name
        rid, created = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        event = lambda text, **kw: protocol.sse(protocol.chunk(rid, created, name, req, text, **kw))

        async def events():
            getter = None                  # the pending read of the next delta, kept across pings (none is lost)
            try:
                if req.kind == CHAT:
                    yield event(None, role=True)
                while True:
                    getter = getter or asyncio.ensure_future(deltas.get())
                    if not (await asyncio.wait({getter}, timeout=self.config.sse_ping))[0]:
                        yield protocol.SSE_PING        # nothing for sse_ping seconds: a comment keeps proxies open
                        continue
                    text, getter = getter.result(), None
                    if text is _END:
                        break
                    yield event(text)
                try:
                    out = await result
                except Exception as e:
                    yield protocol.sse(server_error(e).body())
                    yield protocol.sse("[DONE]")
                    return
                if out is None or out[0].finish_reason == CANCELLED:
                    if self.stopping:
                        yield protocol.sse(unavailable("the server is shutting down", "server_shutting_down").body())
                        yield protocol.sse("[DONE]")
                    return
                a, served = out
                yield event(None, finish=a.finish_reason, token_ids=a.tokens, timed=protocol.timings(a, served))
                if req.include_usage:
                    yield protocol.sse(protocol.usage_chunk(rid, created, name, req, a, served))
                yield protocol.sse("[DONE]")
            finally:
                if getter is not None:
                    getter.cancel()
                cancel.set()               # a client that left ends the generation at its next round
                self.active.discard(cancel)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _watch_disconnect(request: HTTPRequest, cancel: threading.Event) -> None:
    """Set `cancel` when the client of a whole (not streamed) answer disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


class CountRequests:
    """Outermost middleware: every answered request counted by its route's template (UNMATCHED for a path no route
    has: the series stay bounded whatever paths clients send) and status (CLIENT_GONE where nothing was sent)."""

    def __init__(self, app, metrics: Metrics, routes: list[Route]):
        self.app, self.metrics, self.routes = app, metrics, routes

    def route(self, scope) -> str:
        for r in self.routes:
            if r.matches(scope)[0] != Match.NONE:
                return r.path
        return UNMATCHED

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = CLIENT_GONE

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.request(self.route(scope), status)


def create_app(server: Server):
    """The ASGI app over `server`: Host check, CORS (with config.cors_origins), key, content type and body, then the
    routes; every request counted. The lifespan starts the model's loading and closes the workers at the end."""
    async def http_error(request: HTTPRequest, exc: HTTPException) -> Response:
        e = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", None,
                     "not_found" if exc.status_code == 404 else None)
        return error_response(e, exc.headers)

    async def any_error(request: HTTPRequest, exc: Exception) -> Response:
        return error_response(server_error(exc))

    routes = [Route("/v1/chat/completions", server.chat, methods=["POST"]),
              Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/v1/models/{model}", server.model, methods=["GET"]),
              Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.metrics_text, methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loading = asyncio.ensure_future(server.load())
        yield
        server.stop()
        loading.cancel()
        server.close()

    config = server.config
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: any_error},
                    lifespan=lifespan)
    app = RequestGuard(app, config, lambda: server.preparer.max_body if server.preparer is not None else None)
    if config.cors_origins:
        app = CORSMiddleware(app, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                             allow_headers=["Authorization", "Content-Type"])
    return CountRequests(HostGuard(app, config), server.metrics, routes)
