"""Pieces shared by the Triton kernels: the interpreter switch and its fixed-order dot, the ptxas Triton compiles
with, programmatic dependent launch and the weights' L2 prefetch before its wait, exact rounding."""

import contextlib
import functools
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

try:                                  # Triton 3.3 on (3.6, 3.8 and 3.9 were checked); older: launches stay plain
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

# The Triton interpreter (TRITON_INTERPRET=1, set before triton is imported) runs the kernels on CPU tensors;
# kernels then route dots through float32 (its int8 products wrap and its low-precision dots are not IEEE).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRET:                         # two of the interpreter's costs that compute nothing for us, avoided (`interp`)
    from plugins.kernels.interp import fast_helper_calls, skip_discarded_overflow_checks
    fast_helper_calls()
    skip_discarded_overflow_checks()
CAPTURES: list[tuple[int, int]] = []   # (compute capability, SMs) of a launch capture in progress (`launches`)


def capture_arch() -> int | None:
    """The compute capability a launch capture in progress compiles for (None outside one): the launchers' stand-in
    for the device's, whose tensors are then on the CPU."""
    return CAPTURES[-1][0] if CAPTURES else None


def capture_sms() -> int | None:
    """The SMs of the GPU a launch capture in progress stands for (None outside one): what the GEMV's split of K is
    planned for."""
    return CAPTURES[-1][1] if CAPTURES else None


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def device_cc(dev: torch.device) -> int | None:
    """The compute capability a launch on `dev` compiles for (87: sm_87): the CUDA device's; under a launch capture
    its architecture's; None elsewhere (the interpreter's CPU tensors)."""
    if dev.type == "cuda":
        return _capability(torch.cuda.current_device() if dev.index is None else dev.index)
    return capture_arch()


# Programmatic dependent launch (PDL, Hopper on: sm_90+). A decode pass is a chain of ~10 launches a layer, most of
# them microseconds long on a large GPU, so the gap between two launches (the next grid's launch and its programs'
# start, a few microseconds in a CUDA graph) is a real share of a step there. A launch with PDL may start while the launch before
# it runs, once every program of that one has passed `dependent_launch`: each kernel's first statement waits for the
# launch before it to complete and its writes to be visible (griddepcontrol.wait) before it touches global memory,
# then lets the next one start (griddepcontrol.launch_dependents). What overlaps is the next launch's set-up and its
# programs' scheduling, not its work: every kernel still reads what the one before it wrote, and a launch without
# the attribute (torch's, a TensorRT engine's) keeps the plain order. Orin (sm_87) has no PDL: nothing changes there.
# BITNEST_PDL=0 turns it off (`bitnest device-check` times the CUDA-graph passes both ways on such a GPU).
PDL_MIN_CC = 90
PDL_ENV = "BITNEST_PDL"
# With PDL a weight-streaming kernel (the decode GEMV) may ask L2 for its first weight bytes before its wait
# (`prefetch_l2`): the planes are written by no launch, so nothing it prefetches can be stale, and a prefetch loads
# no value into a register; the loads after the wait then find those lines in L2 instead of waiting on DRAM while
# the launch before it drains. BITNEST_PDL_PREFETCH=0 turns the prefetch off (the device check's `graphs_no_prefetch`).
PREFETCH_ENV = "BITNEST_PDL_PREFETCH"


def pdl(dev: torch.device | str, prefetch: bool = False) -> dict:
    """The launch arguments of programmatic dependent launch on `dev`: {"PDL": True, "launch_pdl": True} (the kernel's
    `dependent_launch` and the launch attribute) on a GPU from sm_90 on (a launch capture for one too), else {} (the
    kernels' PDL defaults to False). `prefetch`: the kernel takes a PREFETCH constant (its weights' L2 prefetch before
    the wait), True with PDL unless PREFETCH_ENV is "0"."""
    if INTERPRET or gdc_wait is None or os.environ.get(PDL_ENV) == "0" or (device_cc(torch.device(dev)) or 0) < \
            PDL_MIN_CC:
        return {}
    return {"PDL": True, "launch_pdl": True} | ({"PREFETCH": True} if prefetch and os.environ.get(PREFETCH_ENV) != "0"
                                                else {})


@contextlib.contextmanager
def env_off(name: str, off: bool = True):
    """Within it (where `off`), os.environ[name] is "0" (PDL_ENV: launches without programmatic dependent launch;
    PREFETCH_ENV: PDL launches without the prefetch): a comparison's other side. The variable is put back after."""
    before = os.environ.get(name)
    if off:
        os.environ[name] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@triton.jit
def dependent_launch(PDL: tl.constexpr):
    """A kernel's first statement: with PDL, wait until the launch before this one has completed and its writes are
    visible, then let the launch after this one start (its programs wait in their own `dependent_launch`)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptr):
    """Ask L2 for the line of each address of `ptr` (PTX prefetch.global.L2, SASS CCTL.E.PF2): no value is loaded,
    nothing waits on it. Before a kernel's `dependent_launch`, only for bytes no launch writes (weights). Compiled
    code only: the interpreter has no inline PTX."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptr], dtype=tl.int32,
                              is_pure=False, pack=1)

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
