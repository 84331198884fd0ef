"""`bitnest serve`: an OpenAI-compatible HTTP server over one LLM (edge.llm). Its modules import the ASGI stack (the
`serve` extra: starlette, uvicorn); nothing in the runtime imports them: wire format (`protocol.py`), counters in
Prometheus text (`metrics.py`), the engine's one-at-a-time queue (`worker.py`), the routes (`app.py`)."""
