"""The names and constants every op and backend agrees on, defined once: the nested weight and KV formats
(docs/contracts.md), the weight views and their codes, the KV reads, and the op names."""

from dataclasses import dataclass

FORMAT_VERSION = 2          # 2: sharded (an index and one shard per stage); 1: one model.safetensors, still read

# Signed 4-bit code range of both planes.
Q4_MIN, Q4_MAX = -8, 7
# Refinement codes where the base code is Q4_MIN (paper eq. 9): keeps 16*q4+qr >= -128.
QR_MIN_AT_BASE_MIN = 0
# One refinement step is this fraction of the base step.
REFINE_DIVISOR = 16
# Per-token symmetric INT8 activations: s_x = max|x| / ACT_QMAX.
ACT_QMAX = 127
# KV quantization (docs/contracts.md, KV cache): s = max|x| / KV_QMAX.
KV_QMAX = 7
# Preferred weight group size; the largest power of two dividing K is used where it does not divide.
DEFAULT_GROUP_SIZE = 128

# Weight views: the draft reads the base plane only, the target both planes. Codes travel in step graphs.
DRAFT, TARGET = "draft", "target"
VIEWS = (DRAFT, TARGET)
VIEW_CODES = {DRAFT: 0, TARGET: 1}
CODE_VIEWS = {c: v for v, c in VIEW_CODES.items()}
# KV reads of the nested cache: every position at KV8, every position at KV4, or KV8 for the recent N only.
KV_READS = ("kv4", "kv8", "recent")


@dataclass(frozen=True)
class OpName:
    """One op's names: `python` names the pure-torch reference (plugins.reference), the Triton launcher
    (plugins.kernels) and the native op `bitnest::<python>`; `graph` names its ONNX node type in `DOMAIN`
    and its TensorRT plugin."""

    python: str
    graph: str


DOMAIN = "bitnest"
DOMAIN_VERSION = 1
DUAL_PLANE_LINEAR = OpName("dual_plane_linear", "DualPlaneGemv")
NESTED_KV_ATTENTION = OpName("nested_kv_attention", "NestedKvAttention")
OPS = (DUAL_PLANE_LINEAR, NESTED_KV_ATTENTION)


def check_view(view: str) -> str:
    """Return `view` if it names a weight view, else raise ValueError with the accepted names."""
    if view not in VIEWS:
        raise ValueError(f"unknown weight view {view!r}: use one of {', '.join(VIEWS)}")
    return view


def view_code(view: str) -> int:
    """The integer a step graph's `view` input carries for `view`."""
    return VIEW_CODES[check_view(view)]


def group_size_for(k: int, preferred: int = DEFAULT_GROUP_SIZE) -> int:
    """Group size for a row of length `k`: `preferred` where it divides k, else the largest power
    of two below it that does (docs/contracts.md, weights)."""
    if k <= 0 or preferred <= 0:
        raise ValueError(f"group size needs positive K and preferred size, got K={k}, G={preferred}")
    if k % preferred == 0:
        return preferred
    g = 1
    while g * 2 <= preferred and k % (g * 2) == 0:
        g *= 2
    return g


def bits_per_weight(group_size: int, has_offset: bool = False) -> float:
    """Stored bits per weight of a nested linear: two 4-bit planes plus a float16 scale (and offset) per group."""
    return 8.0 + (32.0 if has_offset else 16.0) / group_size
