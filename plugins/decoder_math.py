"""The decoder's float math shared bit for bit by the torch backends (edge.model.decoder) and the onnxruntime
implementations of the step graph's float ops (plugins.onnx.ort_ops): batch-invariant row-wise passes,
RMSNorm, the gated SiLU, and causal GQA attention over dequantized K/V. INT8 activation and KV
quantizers sit downstream of these, so an implementation that rounds differently by one ulp can flip
a code and move the logits by the quantization noise (~10%): the CPU ONNX path reuses these functions."""

import math

import torch
import torch.nn.functional as F

from plugins.hadamard import apply_hadamard

# Passes of at most this many tokens (drafting, verification, AR steps) run their float matmuls row by
# row, so a verification pass over γ+1 tokens computes bit for bit what γ+1 single-token steps compute:
# BLAS kernels pick different blockings for different M, and activation rounding (int8, bf16) would
# amplify those last-bit differences into different tokens.
ROWWISE_MAX = 32


def rowwise(fn, x: torch.Tensor) -> torch.Tensor:
    """fn(x) for x [M, ...], computed one row at a time when 1 < M <= ROWWISE_MAX (batch invariance)."""
    if 1 < x.shape[0] <= ROWWISE_MAX:
        return torch.cat([fn(x[i:i + 1]) for i in range(x.shape[0])])
    return fn(x)


def rotate_rows(x: torch.Tensor, r: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """x [M, H] @ r (or @ r^T, taken as a view), row-wise (an online rotation such as R1)."""
    m = r.to(device=x.device, dtype=x.dtype)
    m = m.T if transpose else m
    return rowwise(lambda row: row @ m, x)


def hadamard_rows(x: torch.Tensor, n: int, factors=None) -> torch.Tensor:
    """x [M, n] @ H_n row-wise (the online R4 before down_proj), H_n the Kronecker product of `factors` (a
    checkpoint's record; None: plugins.hadamard's legacy rule)."""
    return rowwise(lambda row: apply_hadamard(row, n, factors), x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in the input's dtype."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gated product silu(gate) * up."""
    return F.silu(gate) * up


def gated_r4(gate: torch.Tensor, up: torch.Tensor, r4_size=None, r4_factors=None) -> torch.Tensor:
    """down_proj's input [M, I]: silu(gate) * up, rotated row-wise by the R4 Hadamard of `r4_factors` where `r4_size`
    is set (None: no R4)."""
    g = silu_mul(gate, up)
    return g if r4_size is None else hadamard_rows(g, r4_size, r4_factors)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q [Hq, T, D] at positions [start, start + T) over k, v [Hkv, S, D] at positions [0, S), causal, GQA.
    Decode-sized passes attend one query at a time over exactly the keys an AR step would see."""
    t, s = q.shape[1], k.shape[1]
    k, v = k.to(q.dtype), v.to(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if t <= ROWWISE_MAX and start + t == s:
        return torch.cat([F.scaled_dot_product_attention(q[:, i:i + 1], k[:, :start + i + 1], v[:, :start + i + 1],
                                                         enable_gqa=True, scale=scale) for i in range(t)], dim=1)
    mask = torch.arange(s).unsqueeze(0) <= (start + torch.arange(t)).unsqueeze(1)   # [T, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=scale)


def attention_mixed(q: torch.Tensor, kv4: torch.Tensor, kv8: torch.Tensor, froms: list[int], start: int) -> torch.Tensor:
    """`attention` where query i reads KV4 before position froms[i] and KV8 from it on (elastic KV): q [Hq, T, D] at
    positions [start, start + T); kv4 [2, Hkv, A, D] the KV4 values of positions [0, A), A >= froms[-1]; kv8
    [2, Hkv, S - froms[0], D] the KV8 values of positions [froms[0], S). Decode-sized passes attend one query at a
    time over exactly the keys a one-token pass at its position would see."""
    t, lo = q.shape[1], froms[0]
    s = lo + kv8.shape[2]
    kv4, kv8 = kv4.to(q.dtype), kv8.to(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if t <= ROWWISE_MAX and start + t == s:
        rows = []
        for i, f in enumerate(froms):
            kv = torch.cat((kv4[:, :, :f], kv8[:, :, f - lo:start + i + 1 - lo]), dim=2)   # [2, Hkv, start+i+1, D]
            rows.append(F.scaled_dot_product_attention(q[:, i:i + 1], kv[0], kv[1], enable_gqa=True, scale=scale))
        return torch.cat(rows, dim=1)
    a = kv4.shape[2]
    kv = torch.cat((kv4, kv8), dim=2)                                        # [2, Hkv, A + S - lo, D]
    f = torch.tensor(froms).unsqueeze(1)                                     # [T, 1]
    rows = (start + torch.arange(t)).unsqueeze(1)                            # [T, 1]
    p4, p8 = torch.arange(a).unsqueeze(0), (lo + torch.arange(s - lo)).unsqueeze(0)
    mask = torch.cat((p4 < f, (p8 >= f) & (p8 <= rows)), dim=1)              # [T, A + S - lo]
    return F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, enable_gqa=True, scale=scale)
