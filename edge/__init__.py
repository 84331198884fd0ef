"""BitNest Edge device runtime: checkpoint reader, decoder, nested KV cache, backends and decoding policies.

`from edge import LLM` is the Python API (edge.llm), imported on first use: `import edge` loads nothing heavy."""


def __getattr__(name: str):
    if name in ("LLM", "Answer", "Stream"):
        from edge import llm
        return getattr(llm, name)
    raise AttributeError(f"module 'edge' has no attribute {name!r}")
