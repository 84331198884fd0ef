"""Pieces shared by the Triton kernels: the interpreter switch and exact rounding."""

import os

import triton
import triton.language as tl

# The Triton interpreter (TRITON_INTERPRET=1, set before triton is imported) runs the kernels on CPU tensors;
# kernels then route dots through float32 (its int8 products wrap and its low-precision dots are not IEEE).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def round_half_even(v):
    """torch.round semantics on float32 (exact for |v| < 2^22)."""
    r = tl.floor(v + 0.5)
    tie = (r - v) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)
