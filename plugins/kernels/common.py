"""Pieces shared by the Triton kernels: the interpreter switch and its fixed-order dot, the ptxas Triton compiles
with, exact rounding."""

import os
from pathlib import Path

import triton
import triton.language as tl

# The Triton interpreter (TRITON_INTERPRET=1, set before triton is imported) runs the kernels on CPU tensors;
# kernels then route dots through float32 (its int8 products wrap and its low-precision dots are not IEEE).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CAPTURES: list[tuple[int, int]] = []   # (compute capability, SMs) of a launch capture in progress (`launches`)


def capture_arch() -> int | None:
    """The compute capability a launch capture in progress compiles for (None outside one): the launchers' stand-in
    for the device's, whose tensors are then on the CPU."""
    return CAPTURES[-1][0] if CAPTURES else None


def capture_sms() -> int | None:
    """The SMs of the GPU a launch capture in progress stands for (None outside one): what the GEMV's split of K is
    planned for."""
    return CAPTURES[-1][1] if CAPTURES else None

# The CUDA toolkit's own ptxas on a JetPack 6 image (CUDA 12.6). Triton's bundled ptxas (12.9 with Triton 3.9)
# emits PTX ISA 8.8 and cubins the JetPack 6 driver may not load (it reads PTX up to ISA 8.5), so every path that
# compiles kernels (the triton backend, the TensorRT plugins, the kernel self-check and bench) uses the system one
# where it exists; TRITON_PTXAS_PATH set by the user wins. Set here, at the import of every kernel module, before
# Triton compiles anything (Triton reads the variable when it compiles).
SYSTEM_PTXAS = Path("/usr/local/cuda/bin/ptxas")


def use_system_ptxas(ptxas: Path = SYSTEM_PTXAS) -> str | None:
    """Point TRITON_PTXAS_PATH at `ptxas` where it exists and the variable is unset; returns the path in use."""
    if "TRITON_PTXAS_PATH" not in os.environ and ptxas.exists():
        os.environ["TRITON_PTXAS_PATH"] = str(ptxas)
    return os.environ.get("TRITON_PTXAS_PATH")


use_system_ptxas()


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


@triton.jit
def load_row(ptr, mask, CG: tl.constexpr):
    """tl.load(ptr, mask, other=0) as float32; read past L1 (.cg) where CG, for values other programs of the launch
    wrote (an SM's L1 may hold stale lines of them)."""
    if CG:
        return tl.load(ptr, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def row_scale(x_ptr, K, BLOCK_K: tl.constexpr, CG: tl.constexpr):
    """s_x = max|x|/127 (at least 1e-12) of the row of K floats at x_ptr: per-token INT8 activations' scale (CG:
    `load_row`'s)."""
    offs = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        v = load_row(x_ptr + k0 + offs, k0 + offs < K, CG)
        amax = tl.maximum(amax, tl.abs(v))
    return scale_for_max(tl.max(amax, axis=0))


@triton.jit
def scale_of(v):
    """max|v|/127, at least 1e-12, of a block of floats held in registers (0 past the row): `row_scale`'s value."""
    return scale_for_max(tl.max(tl.abs(v), axis=0))


@triton.jit
def scale_for_max(amax):
    """The per-token INT8 scale of a row whose max|x| is amax: amax/127, at least 1e-12."""
    return tl.maximum(tl.math.div_rn(amax, 127.0), 1e-12)
