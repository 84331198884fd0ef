"""Pieces shared by the Triton kernels: the interpreter switch, the interpreter's fixed-order dot and exact rounding."""

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


@triton.jit
def interp_dot(a, b):
    """a [BM, C] @ b [C, BN] in float32 for the interpreter, as a broadcast product summed over C.
    Every output element is reduced in the same order whatever its row, the other rows and the CPU: the
    interpreter's `tl.dot` is numpy's matmul, whose BLAS picks kernels by CPU and shape, and OpenBLAS's AVX2
    (Haswell/Zen) sgemm gives a row a result that depends on its position in the block (1e-7..2e-6 apart), which
    would make a verification pass differ from single-token steps on some machines and not on others."""
    return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)    # [BM, BN]
