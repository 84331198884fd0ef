"""The engine room: what every backend implements and every decode policy drives.

`interface` (the Engine a backend subclasses: prefill, verification passes, KV commits), `step_engine` (engines
running a recorded decoder-step graph: ONNX Runtime, TensorRT), `kv_cache` (the nested KV8/KV4 cache), `stats` (decode
counters and weight bytes per pass), `cost_table` and `costs` (an engine's measured pass costs, cached). It imports
the model and plugins below it and nothing above: backends (edge.backends) and decode policies (edge.decode) are peers
on top of it."""

MAX_PROPOSALS = 16      # γ's ceiling: the most draft proposals one speculative round may hold


def draft_slots(gamma: int) -> int:
    """The KV cache's scratch slots for rounds of up to `gamma` proposals: the γ draft-time entries and the pending
    token's (0 where nothing is drafted ahead). The one place γ becomes a slot count."""
    return gamma + 1 if gamma > 0 else 0
