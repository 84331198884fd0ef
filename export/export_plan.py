"""The export's memory plan, made before any work: the peak resident bytes of a streamed export from the model's
shapes and the export options (one block's weights, the calibration streams, the Hessians, GPTQ's working set, the
head's row blocks), checked against the memory the host has available."""

from dataclasses import dataclass

from edge.errors import BitNestError
from edge.model.arch import ModelConfig

F32 = 4
# The process before any weight is read: the interpreter, torch, transformers' tokenizer and the native libraries
# (measured: `python -c "import torch, transformers"` plus a tokenizer, 0.55-0.7 GB resident on x86-64 Linux).
BASELINE_BYTES = 800 << 20
HEAD_BLOCK_ROWS = 16384          # rows of the head (and the embedding) nested or copied at a time


@dataclass(frozen=True)
class ExportPlan:
    """Peak resident bytes of each phase of a streamed export, and their maximum."""

    baseline: int
    streams: int        # calibration activations carried from block to block, [S, T, H] float32 per view
    block: int          # the largest block phase: its weights, quantized copies, Hessians and GPTQ's working set
    head: int           # the head phase: one block of rows under GPTQ, and the head's Hessians
    embedding: int      # the embedding phase: one block of rows read, converted and written

    @property
    def peak(self) -> int:
        return self.baseline + self.streams + max(self.block, self.head, self.embedding)

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "streams": self.streams, "block": self.block, "head": self.head,
                "embedding": self.embedding, "peak": self.peak}


def _gptq_working(n: int, k: int) -> int:
    """GPTQ on one [N, K] weight: the weight, its permuted copy, codes and the result (float32), a block's error, and
    the prepared Hessian (its factor, with one more K x K while it is made)."""
    return 4 * n * k * F32 + 2 * k * k * F32


def plan_export(cfg: ModelConfig, samples: int, seq_len: int, views: int, sequential: bool, head_nested: bool,
                head_block_rows: int = HEAD_BLOCK_ROWS, baseline: int = BASELINE_BYTES) -> ExportPlan:
    """The plan of a streamed export of `cfg` with `samples` x `seq_len` calibration tokens through `views` streams
    (1, or 2 with GPTQ refinement); `sequential`: GPTQ (Hessians and streams), else RTN-style nesting alone."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = cfg.linear_shapes()
    params = sum(n * k for n, k in shapes.values())
    largest = max(n * k for n, k in shapes.values())
    bias = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim if cfg.attention_bias else 0
    tokens = samples * seq_len
    streams = views * tokens * h * F32 if sequential else 0
    # one block: its float32 tensors, one linear in float64 while it is rotated (twice: input and product), codes
    weights = (params + bias + 2 * h) * F32 + 2 * largest * 8 + params * 2
    if sequential:
        attn_in = cfg.num_heads * cfg.head_dim
        hessians = views * (2 * h * h + attn_in * attn_in + i * i) * F32          # q/k/v, o, gate/up, down inputs
        quantized = views * params * F32                                          # each view's dequantized block
        gptq = max(_gptq_working(n, k) for n, k in shapes.values())
        # one sample's block pass: its activations and attention scores (float32)
        sample = seq_len * (4 * h + 3 * i) * F32 + cfg.num_heads * seq_len * seq_len * F32 * 2
        block = weights + hessians + quantized + gptq + sample
    else:
        block = weights + max(4 * n * k * F32 for n, k in shapes.values())
    rows = min(head_block_rows, cfg.vocab_size)
    head = rows * h * F32 * 2                                                     # a block read, and its float16 copy
    if head_nested:
        head_h = views * h * h * F32 if sequential else 0
        head = max(head, head_h + (_gptq_working(rows, h) if sequential else 4 * rows * h * F32) + rows * h * 2)
    embedding = rows * h * F32 * 2
    return ExportPlan(baseline, streams, block, head, embedding)


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what the kernel can give without swapping), or None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_plan(plan: ExportPlan, available: int | None) -> None:
    """One-line refusal where the plan's peak exceeds the memory available, naming what lowers it."""
    if available is None or plan.peak <= available:
        return
    gib = lambda b: f"{b / (1 << 30):.2f} GiB"
    biggest = max(("the calibration streams", plan.streams), ("a block's GPTQ", plan.block), ("the head", plan.head),
                  key=lambda kv: kv[1])[0]
    raise BitNestError(f"the export needs {gib(plan.peak)} of memory at its peak (most for {biggest}) and this host "
                       f"has {gib(available)} available: lower --calib-samples or --calib-seq-len (the streams are "
                       f"{gib(plan.streams)}), --head-block-rows, or use --method rtn; nothing was written")
