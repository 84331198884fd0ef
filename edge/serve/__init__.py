"""`bitnest serve`: an OpenAI-compatible HTTP server over one LLM (edge.llm). Its modules import the ASGI stack (the
`serve` extra: starlette, uvicorn); nothing in the runtime imports them: settings (`config.py`), wire format
(`protocol.py`), the checks before a route (`guard.py`), request preparation off the event loop (`prepare.py`),
counters in Prometheus text (`metrics.py`), the engine's one-at-a-time queue (`worker.py`), the HTTP connection's
timeouts and bound (`connection.py`), the routes (`app.py`)."""
