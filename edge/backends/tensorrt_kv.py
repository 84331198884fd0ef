"""How the tensorrt backend binds the step engine's KV plane inputs and outputs: `aliased` (one buffer per plane
bound to both, the plugin writing its entries in place: the engine built with aliased plugin I/O) or `pingpong`
(two buffer sets, a pass reading one and writing the other, swapped each pass: for an engine built without
aliasing, where TensorRT's aliasing build inserted copies of the planes). `PingPong` is the schedule and its rule.

Why ping-pong needs no full-plane copy: the attention plugin writes a pass's entries into its output planes after
copying the last `kv_window` positions before the pass from its input planes (plugins.trt.plugins.catch_up,
kv_window = the profile's largest pass). The output set was the input of the previous pass, so it holds the history
up to that pass's start; every pass starts at or before the previous pass's end (prefill chunks follow each other,
draft slots follow the committed length, verification and rollbacks start at it), so the previous pass's start is
within kv_window of this pass's start and the window carries what the output set lacks. Cost: kv_window positions
per plane per layer per pass, and a second set of KV planes in device memory."""

ALIASED = "aliased"
PINGPONG = "pingpong"
KV_BINDINGS = (ALIASED, PINGPONG)


class PingPong:
    """The buffer set each pass reads (its parity p) and writes (1 - p); the set holding the cache after the last
    pass is `current`. Refuses a pass that starts past the previous pass's end (a gap the catch-up cannot fill)."""

    def __init__(self):
        self.current = 0          # the set the next pass reads
        self.end = 0              # the previous pass's end (positions [0, end) are valid in `current`)

    def next(self, seq_len: int, m: int) -> int:
        """The parity of a pass over positions [seq_len - m, seq_len): read set p, write set 1 - p."""
        if seq_len - m > self.end:
            raise ValueError(f"a ping-pong pass must start at or before the previous pass's end ({self.end}), not at "
                             f"{seq_len - m}")
        p = self.current
        self.current, self.end = 1 - p, seq_len
        return p
