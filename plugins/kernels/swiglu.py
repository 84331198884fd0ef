"""SwiGLU's gated product, the online R4 Hadamard and down_proj's INT8 activations in one Triton launch, for the
decode passes of the `triton` backend (docs/kernels.md, the whole step).

Between gate/up's GEMV and down_proj's a decoder block computes g = silu(gate) * up [M, I], rotates it by R4 = the
Kronecker product of the checkpoint's recorded factors (plugins.hadamard.apply_hadamard: with factors (h, p), g's
row read as [h, p] becomes H_h^T [h, p] H_p) and quantizes it per token for down_proj. In torch that is SiLU, the
product, two matmuls, their copies and a concatenation for every token of the pass (plugins.decoder_math.rowwise),
then the quantization: ~20 launches a layer for a 5-token verification pass. Here it is one:

- program (m, s) owns token m's rows [s*C, (s+1)*C) of the [h, p] view and computes them whole: the dense factor
  H_h over all h rows of g (g made from gate and up as each block of rows is read: each program reads token m's
  whole gate and up rows, from L2 after the first), then H_p along each row in registers, and stores its C*p
  values of the result;
- each program then raises token m's running max|y| by the max of what it stored and counts itself in on token m's
  counter (gpu-scope atomics after a barrier, as the decode GEMV's split-K reduction does); the last to arrive
  takes the max and quantizes the whole row in one pass (`gemv_decode.last_quantizes`, read past L1) into the
  decode layout at down_proj's group size, as `quantize_decode` of the result would, bit for bit, and zeroes the
  counter and the max for the next launch.

Without R4 the rows are plain chunks of g. A layout of three or more factors (a legacy manifest's) is not served
here: the backend applies it in torch. Numerics: float32 throughout; the Hadamard sums run in a fixed order that
depends only on (h, p), not on M or the token, so a verification pass computes what single-token steps compute
(the rows differ from torch's BLAS matmuls by float32 rounding, ~1e-7 relative).
"""

import torch
import triton
import triton.language as tl

from plugins.hadamard import check_factors, factor_on
from plugins.kernels.common import dependent_launch, pdl
from plugins.kernels.gemv import quantize_decode_buffers, split_counters
from plugins.kernels.gemv_decode import DECODE_MAX_M, MAX_SLOTS, last_quantizes, tail_block

WARPS = 8            # a program's warps: a step's floats spread over 256 threads
STEP_FLOATS = 20480  # floats a step of the dense-factor loop holds, its broadcast product [C, KB, P] and its gate and
#                      up rows [KB, P]: 80 a thread. Few, wide steps: each waits on L2 for its rows (11 steps of 32
#                      rows at Llama-2-7B's (344, 32) in 4 warps, 6 of 64 in 8; at 4 warps and 64 rows Qwen2.5-1.5B's
#                      (140, 64) spilled on sm_87: its gate/up rows are twice 7B's a row)
LOAD = 4096          # floats of the dense factor's product a step of the H_p loop holds
ROW_FLOATS = 256     # floats of the result a program owns (C rows of p): more programs at the small factors
MAX_FACTORS = 2      # R4 layouts served: none, (p,), (h, p)


@triton.jit
def _gated(gate_row, up_row, at, live):
    """silu(gate) * up at offsets `at` of a token's rows (0 where not live)."""
    gv = tl.load(gate_row + at, mask=live, other=0.0)
    uv = tl.load(up_row + at, mask=live, other=0.0)
    return tl.math.div_rn(gv, 1.0 + tl.exp(-gv)) * uv


@triton.jit
def swiglu_decode_kernel(gate_ptr, up_ptr, h1_ptr, h2_ptr, out_ptr, xq_ptr, xsum_ptr, sx_ptr, count_ptr, ROWS,
                         stride_g, stride_u, M: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                         C: tl.constexpr, KB: tl.constexpr, JB: tl.constexpr, DENSE1: tl.constexpr,
                         DENSE2: tl.constexpr, G: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """Program (m, s): rows i = s*C + [0, C) of token m's g viewed as [ROWS, P] (module docstring), out [M, ROWS*P]
    float32; h1 [ROWS, ROWS] applied where DENSE1 (y[i] = sum_k h1[k, i] g[k]), h2 [P, P] along each row where
    DENSE2 (y[i, j] = sum_q y[i, q] h2[q, j]); the last program of token m writes its decode activations."""
    dependent_launch(PDL)
    m = tl.program_id(0)
    n = ROWS * P
    gate_row, up_row = gate_ptr + m * stride_g, up_ptr + m * stride_u
    i = tl.program_id(1) * C + tl.arange(0, C)                                    # [C] the program's rows
    q = tl.arange(0, P_PAD)
    q_live = q < P
    if DENSE1:
        acc = tl.zeros([C, P_PAD], tl.float32)
        kk = tl.arange(0, KB)
        for k0 in range(0, ROWS, KB):
            k = k0 + kk                                                           # [KB] rows of g read
            v = _gated(gate_row, up_row, k[:, None] * P + q[None, :], (k[:, None] < ROWS) & q_live[None, :])
            hk = tl.load(h1_ptr + k[None, :] * ROWS + i[:, None], mask=(k[None, :] < ROWS) & (i[:, None] < ROWS),
                         other=0.0)                                               # [C, KB]: h1[k, i]
            acc += tl.sum(hk[:, :, None] * v[None, :, :], axis=1)                 # [C, P_PAD]
    else:
        acc = _gated(gate_row, up_row, i[:, None] * P + q[None, :], (i[:, None] < ROWS) & q_live[None, :])
    out_row = out_ptr + m * n
    if DENSE2:
        amax = tl.zeros([C], tl.float32)
        for j0 in range(0, P_PAD, JB):
            j = j0 + tl.arange(0, JB)
            h2 = tl.load(h2_ptr + q[:, None] * P + j[None, :], mask=q_live[:, None] & (j[None, :] < P), other=0.0)
            y = tl.sum(acc[:, :, None] * h2[None, :, :], axis=1)                  # [C, JB]
            live = (i[:, None] < ROWS) & (j[None, :] < P)
            tl.store(out_row + i[:, None] * P + j[None, :], y, mask=live)
            amax = tl.maximum(amax, tl.max(tl.where(live, tl.abs(y), 0.0), axis=1))
        amax = tl.max(amax, axis=0)
    else:
        live = (i[:, None] < ROWS) & q_live[None, :]
        tl.store(out_row + i[:, None] * P + q[None, :], acc, mask=live)
        amax = tl.max(tl.max(tl.where(live, tl.abs(acc), 0.0), axis=1), axis=0)
    last_quantizes(out_row, amax, count_ptr, xq_ptr, xsum_ptr, sx_ptr, m, tl.num_programs(1), n, M, G, BLOCK_K)


def _floor_pow2(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def plan(n: int, factors, g: int) -> dict:
    """The launch's view of a row of n values as [ROWS, P] and its tiling, for R4 `factors` (() for none: rows of
    one group g) and group size g; ValueError where the layout is not served here (three or more factors)."""
    if len(factors) > MAX_FACTORS:
        raise ValueError(f"swiglu_decode serves R4 layouts of at most {MAX_FACTORS} factors, not {list(factors)}")
    p = factors[-1] if factors else g
    p_pad = triton.next_power_of_2(p)
    rows_pad = triton.next_power_of_2(n // p)
    c = max(1, min(rows_pad, ROW_FLOATS // p_pad))                                # rows a program computes
    kb = min(rows_pad, _floor_pow2(STEP_FLOATS // (p_pad * (c + 2))))            # rows of gate/up a step reads
    return {"ROWS": n // p, "P": p, "P_PAD": p_pad, "C": c, "KB": kb,
            "JB": max(1, min(p_pad, LOAD // (c * p_pad))), "DENSE1": len(factors) == 2, "DENSE2": len(factors) >= 1}


def swiglu_decode(gate: torch.Tensor, up: torch.Tensor, factors, g: int) -> tuple:
    """gate, up float32 [M <= DECODE_MAX_M, I] (unit column stride; column views of one stacked output serve) ->
    (y float32 [M, I], (x_q words, group sums, s_x)): y = silu(gate) * up rotated by the Hadamard of `factors`
    (plugins.hadamard's order-product layout, None or () for none) and y's decode-layout INT8 activations at group
    size g, what `gemv.quantize_decode(y, g)` gives, bit for bit."""
    m, n = gate.shape
    if up.shape != (m, n) or gate.dtype != torch.float32 or up.dtype != torch.float32 or gate.stride(1) != 1 \
            or up.stride(1) != 1 or m > DECODE_MAX_M or n % g:
        raise ValueError(f"swiglu_decode: gate {tuple(gate.shape)}, up {tuple(up.shape)}, group {g} do not fit "
                         f"(float32 [M <= {DECODE_MAX_M}, I] with unit column stride, I a multiple of the group)")
    factors = check_factors(n, tuple(factors)) if factors else ()
    cfg = plan(n, factors, g)
    h1 = factor_on(factors[0], torch.float32, gate.device) if cfg["DENSE1"] else gate    # (unread where not applied)
    h2 = factor_on(factors[-1], torch.float32, gate.device) if cfg["DENSE2"] else gate
    out = torch.empty(m, n, dtype=torch.float32, device=gate.device)
    xq, xsum, sx = quantize_decode_buffers(m, n, g, gate.device)
    grid = (m, triton.cdiv(cfg["ROWS"], cfg["C"]))
    counters = split_counters(gate.device, MAX_SLOTS + m)                             # tokens' counters, maxima
    swiglu_decode_kernel[grid](gate, up, h1, h2, out, xq.view(torch.int8), xsum, sx, counters, cfg.pop("ROWS"),
                               gate.stride(0), up.stride(0), M=m, G=g, BLOCK_K=tail_block(n, g),
                               num_warps=WARPS, enable_fp_fusion=False, **pdl(gate.device), **cfg)
    return out, (xq, xsum, sx)
