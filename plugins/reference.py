"""Pure-torch reference semantics of the BitNest ops (the oracle every kernel and plugin is tested against)."""

from typing import Optional

import torch

from plugins.contracts import REFINE_DIVISOR, check_view
from plugins.nesting import dequantize_codes, quantize_activations
from plugins.packing import unpack_nibbles


def dual_plane_linear(
    x: torch.Tensor,
    base: torch.Tensor,
    refine: Optional[torch.Tensor],
    scale: torch.Tensor,
    view: str,
    offset: Optional[torch.Tensor] = None,
    act_int8: bool = False,
) -> torch.Tensor:
    """y[M, N] = x[M, K] @ W_view^T from the packed planes (docs/contracts.md, ops).

    base, refine: uint8 [N, K/2]; scale (and optional offset): float16 [N, K/G].
    The draft view reads `base` and `scale` only (and never touches `refine`, which may be None);
    the target view reads both planes. With `act_int8`, x is quantized per token to INT8 and each
    group's integer dot product is exact before the group scale is applied (W4A8 / W8A8).
    Computed in float64 so it is the oracle for float32 kernels.
    """
    check_view(view)
    m, k = x.shape
    n = base.shape[0]
    if base.shape != (n, k // 2) or k % scale.shape[1] or scale.shape[0] != n:
        raise ValueError(f"plane shapes {tuple(base.shape)}, scale {tuple(scale.shape)} do not fit x of K={k}")
    g = k // scale.shape[1]
    codes = unpack_nibbles(base).double()                                      # [N, K]
    step = scale.double()                                                      # [N, K/G]
    if view == "target":
        if refine is None:
            raise ValueError("the target view needs the refinement plane")
        codes = REFINE_DIVISOR * codes + unpack_nibbles(refine).double()
        step = step / REFINE_DIVISOR
    if act_int8:
        xq, sx = quantize_activations(x)
        xs, xscale = xq.double(), sx.double()                                  # [M, K], [M, 1]
    else:
        xs, xscale = x.double(), None
    # Per-group dot products: [M, 1, K/G, G] * [1, N, K/G, G] summed over G -> [M, N, K/G]
    partial = torch.einsum("mcg,ncg->mnc", xs.reshape(m, k // g, g), codes.reshape(n, k // g, g))
    y = (partial * step.unsqueeze(0)).sum(-1)                                  # [M, N]
    if offset is not None:
        xsum = xs.reshape(m, k // g, g).sum(-1)                                # [M, K/G]
        y = y + xsum @ offset.double().T
    if xscale is not None:
        y = y * xscale
    return y


def dequantized_weight(base, refine, scale, view, offset=None) -> torch.Tensor:
    """float32 W_view [N, K] from packed planes: the draft reads base + scale only."""
    qr = unpack_nibbles(refine) if view == "target" else None
    return dequantize_codes(unpack_nibbles(base), qr, scale, view, offset)


def nested_embedding(ids: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                     offset: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 rows [T, K] of a nested linear's target view (16 q4 + qr) s/16 (+ offset) for ids [T]: the input
    embedding of a checkpoint whose tied head is nested (docs/contracts.md, weights: embedding `head_target`).
    Reads only the T looked-up rows of both planes and their scales."""
    off = None if offset is None else offset[ids]
    return dequantize_codes(unpack_nibbles(base[ids]), unpack_nibbles(refine[ids]), scale[ids], "target", off)


def nested_kv_attention(
    q: torch.Tensor,
    base: torch.Tensor,
    refine: torch.Tensor,
    scale: torch.Tensor,
    main_len: int,
    kv8_from: int,
    scratch: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
    scratch_len: int = 0,
    window: int = 0,
) -> torch.Tensor:
    """out[Hq, T, D] = causal GQA attention of q over one layer's nested KV cache (docs/contracts.md, KV cache and ops).

    q: float [Hq, T, D]. base, refine: uint8 [2, Hkv, C, D/2] (K then V), scale: float16 [2, Hkv, C].
    The sequence is main positions [0, main_len) followed by `scratch_len` slots of the optional
    `scratch` planes (same layout; draft-time entries), S = main_len + scratch_len in all. The T queries
    are its last T positions: query i sees keys [0, S - T + i]. Positions before `kv8_from` are read at
    KV4 (base plane only), positions from it on at KV8 (one integer encodes every KV view: kv8 -> 0,
    kv4 -> S, recent-N -> max(0, S - N)). Softmax scale 1/sqrt(D). Computed in float64: the oracle.
    Elastic KV (docs/memory.md): the main `refine` may be a ring of R <= C slots (position p's refinement in slot
    p mod R), and with `window` W > 0 query i also reads KV4 before its own position + 1 - W (per query, not per pass).
    """
    hq, t, d = q.shape
    hkv = base.shape[1]
    if hq % hkv or base.shape[-1] * 2 != d:
        raise ValueError(f"q [{hq}, {t}, {d}] does not fit KV planes {tuple(base.shape)}")
    s = main_len + scratch_len
    if t > s:
        raise ValueError(f"{t} queries but only {s} cached positions")
    ring = torch.arange(main_len) % refine.shape[-2]                                    # refinement slots
    planes = [(base[..., :main_len, :], refine.index_select(-2, ring), scale[..., :main_len])]
    if scratch_len:
        sb, sr, ss = scratch
        planes.append((sb[..., :scratch_len, :], sr[..., :scratch_len, :], ss[..., :scratch_len]))
    qr_all = torch.cat([unpack_nibbles(r).double() for _, r, _ in planes], dim=-2)      # [2, Hkv, S, D]
    q4_all = torch.cat([unpack_nibbles(b).double() for b, _, _ in planes], dim=-2)      # [2, Hkv, S, D]
    s_all = torch.cat([sc.double() for _, _, sc in planes], dim=-1).unsqueeze(-1)       # [2, Hkv, S, 1]
    rows = s - t + torch.arange(t)                                                      # [T] query positions
    first8 = torch.full_like(rows, kv8_from) if not window else torch.clamp(rows + 1 - window, min=kv8_from)
    kv8 = torch.arange(s).unsqueeze(0) >= first8.unsqueeze(1)                            # [T, S] read at KV8
    views = []
    for kv in ((REFINE_DIVISOR * q4_all + qr_all) * (s_all / REFINE_DIVISOR), q4_all * s_all):   # KV8, KV4
        views.append((kv[0].repeat_interleave(hq // hkv, 0), kv[1].repeat_interleave(hq // hkv, 0)))  # [Hq, S, D]
    (k8, v8), (k4, v4) = views
    scores = torch.where(kv8, q.double() @ k8.transpose(1, 2), q.double() @ k4.transpose(1, 2)) / d ** 0.5  # [Hq, T, S]
    visible = torch.arange(s).unsqueeze(0) <= rows.unsqueeze(1)                          # [T, S]
    p = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)              # [Hq, T, S]
    return torch.where(kv8, p, 0) @ v8 + torch.where(kv8, 0, p) @ v4                    # [Hq, T, D]


def dual_plane_linear_int8(x: torch.Tensor, base: torch.Tensor, refine: Optional[torch.Tensor], scale: torch.Tensor,
                           offset: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 y [M, N] = dual_plane_linear(..., act_int8=True) computed fast: the target view where `refine`
    is given, else the draft view. Each group's integer dot product is exact in float32 (|x_q| <= 127,
    |code| <= 136, G <= 128 gives partial sums < 2^24) before it is scaled, so rows do not depend on M."""
    m, k = x.shape
    n, c = scale.shape
    g = k // c
    codes = unpack_nibbles(base).to(torch.int16)                            # [N, K]
    step = scale.float()                                                    # [N, C]
    if refine is not None:
        codes = codes * REFINE_DIVISOR + unpack_nibbles(refine)
        step = step / REFINE_DIVISOR
    xq, sx = quantize_activations(x)                                        # [M, K] int8, [M, 1]
    xg = xq.float().view(m, c, g).transpose(0, 1)                           # [C, M, G]
    partial = torch.bmm(xg, codes.float().view(n, c, g).permute(1, 2, 0))  # [C, M, N], exact integers
    y = (partial * step.T.unsqueeze(1)).sum(0)                              # [M, N]
    if offset is not None:
        xsum = xg.sum(-1).T                                                 # [M, C], exact integers
        y = y + (xsum.unsqueeze(-1) * offset.float().T.unsqueeze(0)).sum(1)
    return y * sx
