"""The routes of `bitnest serve` (a Starlette app): OpenAI's chat and text completions, whole or as server-sent
events ending in `data: [DONE]`, the model list, health and Prometheus metrics, over one LLM whose generations run
one at a time on the engine worker. A bad request is refused before any work with OpenAI's error body and a 4xx; a
client that leaves ends its generation at the next round; the server serves on after any error."""

import asyncio
import contextlib
import sys
import threading
import time
import traceback
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from edge.errors import BitNestError
from edge.llm import CANCELLED, LLM, Answer
from edge.runtime import encode, load_tokenizer
from edge.serve import protocol
from edge.serve.metrics import CONTENT_TYPE, Metrics
from edge.serve.protocol import CHAT, APIError
from edge.serve.worker import EngineWorker, QueueFull

MAX_BODY = 8 << 20        # bytes of a request body (413 past it)
CLIENT_GONE = 499          # the status a request whose client left is counted under (nginx's convention)
_END = object()


def error_response(e: APIError, headers=None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


class Server:
    """The handlers' shared state: the LLM, a tokenizer of the front's own (the engine thread decodes with the
    runtime's at the same time), the engine worker and the counters."""

    def __init__(self, llm: LLM, max_queue: int, retry_after: int = 1):
        self.llm, self.retry_after = llm, retry_after
        self.tokenizer = load_tokenizer(llm.runtime.ckpt.path)
        self.worker = EngineWorker(max_queue)
        self.metrics = Metrics()
        self.started = int(time.time())

    # -- plain routes -------------------------------------------------------------------------------------
    async def models(self, request: HTTPRequest) -> Response:
        return self._count(request, JSONResponse({"object": "list", "data": [
            {"id": self.llm.name, "object": "model", "created": self.started, "owned_by": "bitnest-edge"}]}))

    async def health(self, request: HTTPRequest) -> Response:
        rt = self.llm.runtime
        return self._count(request, JSONResponse({"status": "ok", "model": self.llm.name, "backend": rt.backend,
                                                  "policy": self.llm.config.policy, "context": self.llm.capacity,
                                                  "queue_length": self.worker.waiting,
                                                  "generation_running": bool(self.worker.running)}))

    async def metrics_text(self, request: HTTPRequest) -> Response:
        return self._count(request, PlainTextResponse(self.metrics.render(self.worker.waiting, self.worker.running),
                                                      media_type=CONTENT_TYPE))

    def _count(self, request: HTTPRequest, response: Response) -> Response:
        self.metrics.request(request.url.path, response.status_code)
        return response

    # -- completions --------------------------------------------------------------------------------------
    async def chat(self, request: HTTPRequest) -> Response:
        return await self._complete(request, protocol.chat_request)

    async def completions(self, request: HTTPRequest) -> Response:
        return await self._complete(request, protocol.completion_request)

    async def _complete(self, request: HTTPRequest, parse) -> Response:
        try:
            req = parse(protocol.parse_json(await request.body()))
            ids, cfg = self._prepare(req)
            if req.stream:
                response = self._stream(request, req, ids, cfg)
            else:
                response = await self._whole(request, req, ids, cfg)
        except QueueFull as e:
            response = error_response(APIError(429, str(e), None, "queue_full", "rate_limit_error"),
                                      {"Retry-After": str(self.retry_after)})
        except APIError as e:
            response = error_response(e)
        except Exception as e:          # a bug: answered in the same shape, and the server serves on
            response = error_response(self._server_error(e))
        return self._count(request, response)

    def _prepare(self, req: protocol.Request):
        """Prompt ids and settings; a prompt that does not fit the context with its max_tokens is refused here,
        before any work on the engine."""
        param = "messages" if req.kind == CHAT else "prompt"
        ids = encode(self.tokenizer, req.messages if req.kind == CHAT else req.prompt, chat=req.kind == CHAT)
        room = self.llm.capacity - len(ids)
        max_tokens = req.max_tokens if req.max_tokens is not None else room
        try:
            self.llm.check_fits(len(ids), max(1, max_tokens))
            cfg = self.llm.settings(max_tokens, req.temperature, req.top_p, req.seed)
        except BitNestError as e:
            raise APIError(400, str(e), param, "context_length_exceeded") from None
        except ValueError as e:
            raise APIError(400, str(e), None, "invalid_value") from None
        return ids, cfg

    def _job(self, ids, cfg, req: protocol.Request, cancel: threading.Event, on_text=None):
        """The generation to run on the engine thread; it counts its answer itself (on the event loop), so one
        whose client left is counted too."""
        loop = asyncio.get_running_loop()

        def job():
            if cancel.is_set():            # its client left while it waited
                return None
            a = self.llm.generate(ids, config=cfg, stop=req.stop, on_text=on_text, cancelled=cancel.is_set)
            loop.call_soon_threadsafe(self._finished, a)
            return a
        return job

    def _finished(self, a: Answer) -> None:
        self.metrics.answered(a)
        stopped = self.llm.energy_failure()
        if stopped:
            print(f"bitnest serve: the power meter stopped ({stopped}); answers go on without J/token",
                  file=sys.stderr)

    def _server_error(self, e: Exception) -> APIError:
        if isinstance(e, (BitNestError, ValueError)):        # the request's settings, found by the engine
            return APIError(400, str(e))
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
        return APIError(500, f"internal error ({type(e).__name__}): {e}", None, "internal_error", "server_error")

    async def _whole(self, request: HTTPRequest, req, ids, cfg) -> Response:
        cancel = threading.Event()
        result = self.worker.submit(self._job(ids, cfg, req, cancel))
        watch = asyncio.ensure_future(_watch_disconnect(request, cancel))
        try:
            a = await result
        finally:
            watch.cancel()
        if a is None or a.finish_reason == CANCELLED:
            return Response(status_code=CLIENT_GONE)
        rid = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}"
        return JSONResponse(protocol.response(rid, int(time.time()), self.llm.name, req, a))

    def _stream(self, request: HTTPRequest, req, ids, cfg) -> Response:
        """Server-sent events; the job is queued (or refused with 429) before the response starts."""
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        push = lambda item: loop.call_soon_threadsafe(deltas.put_nowait, item)
        job = self._job(ids, cfg, req, cancel, on_text=push)

        def job_then_end():
            try:
                return job()
            finally:
                push(_END)

        result = self.worker.submit(job_then_end)
        rid, created = f"{'chatcmpl' if req.kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        event = lambda text, **kw: protocol.sse(protocol.chunk(rid, created, self.llm.name, req, text, **kw))

        async def events():
            try:
                if req.kind == CHAT:
                    yield event(None, role=True)
                while (text := await deltas.get()) is not _END:
                    yield event(text)
                try:
                    a = await result
                except Exception as e:
                    yield protocol.sse(self._server_error(e).body())
                    yield protocol.sse("[DONE]")
                    return
                yield event(None, finish=a.finish_reason, token_ids=a.tokens)
                if req.include_usage:
                    yield protocol.sse(protocol.usage_chunk(rid, created, self.llm.name, req, a))
                yield protocol.sse("[DONE]")
            finally:
                cancel.set()               # a client that left ends the generation at its next round

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _watch_disconnect(request: HTTPRequest, cancel: threading.Event) -> None:
    """Set `cancel` when the client of a whole (not streamed) answer disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def create_app(llm: LLM, max_queue: int = 8, retry_after: int = 1) -> Starlette:
    """The ASGI app over `llm`; at most `max_queue` requests wait while one generates."""
    server = Server(llm, max_queue, retry_after)

    async def http_error(request: HTTPRequest, exc: HTTPException) -> Response:
        e = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", None,
                     "not_found" if exc.status_code == 404 else None)
        return server._count(request, error_response(e))

    async def any_error(request: HTTPRequest, exc: Exception) -> Response:
        return server._count(request, error_response(server._server_error(exc)))

    routes = [Route("/v1/chat/completions", server.chat, methods=["POST"]),
              Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.metrics_text, methods=["GET"])]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.worker.close()

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: any_error},
                    lifespan=lifespan, max_body_size=MAX_BODY)
    app.state.server = server
    return app
