"""Kernel self-check: every Triton kernel against the pure-torch references on given planes (a checkpoint's, read
by the caller: `python -m edge.checks.kernels`) or random RTN-nested ones, on the GPU where there is one, else in
the Triton interpreter (the caller sets TRITON_INTERPRET=1 before starting Python).

GEMV: the given linears (two of layer 0 for a checkpoint: both group sizes of the default model) at M = 1 and 5,
both views, INT8 and float16 activations; with INT8 activations the warp-tiled launch (the `triton` backend's) equal
to the canonical one bit for bit. Attention and the KV write: the model's head shapes over fresh random
K/V quantized into the nested format, at a context that is not a multiple of the kernel's chunk, KV8, KV4 and
Recent-N.
"""

import os

import torch

from plugins import reference
from plugins.kernels.tiling import tile_planes
from plugins.kv import quantize_kv
from plugins.nesting import nest_rtn
from plugins.packing import pack_nibbles

LIMITS = {"int8": 1e-5, "float16": 2e-3, "attention": 5e-5}


def _rel(got, want) -> float:
    return ((got.double().cpu() - want.double()).norm() / want.norm()).item()


RANDOM_HEADS = (9, 3, 64)   # (Hq, Hkv, D) of the default model, used with the random planes


def random_linears() -> list[tuple]:
    """[(name, base, refine, scale, offset)] of two random RTN-nested linears of the default model's shapes."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for name, (n, k) in (("random[576x576]", (576, 576)), ("random[576x1536]", (576, 1536))):
        c = nest_rtn(torch.randn(n, k, generator=gen) * 0.05, 128 if k % 128 == 0 else 64)
        out.append((name, pack_nibbles(c.q4), pack_nibbles(c.qr), c.scale, c.offset))
    return out


def run_checks(linears: list[tuple] | None = None, heads: tuple[int, int, int] = RANDOM_HEADS,
               weights: str = "random (RTN-nested)") -> dict:
    """All checks on `linears` [(name, base, refine, scale, offset)] (default: random ones) and attention heads
    (Hq, Hkv, D); raises ImportError where triton is missing, RuntimeError where no device can run it."""
    import triton  # noqa: F401

    from plugins import kernels
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if not interp and not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU and TRITON_INTERPRET is not 1")
    dev = "cpu" if interp else "cuda"
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    checks = []

    def add(name, err, limit):
        checks.append({"name": name, "max_rel_err": err, "limit": limit, "passed": bool(err < limit)})

    hq, hkv, d = heads
    for name, base, refine, scale, offset in linears or random_linears():
        planes = [t if t is None else t.to(dev) for t in (base, refine, scale, offset)]
        for m in (1, 5):
            x = torch.randn(m, base.shape[1] * 2, generator=gen)
            for view in ("draft", "target"):
                for act in ("int8", "float16"):
                    want = reference.dual_plane_linear(x, base, refine, scale, view, offset, act_int8=act == "int8")
                    got = kernels.dual_plane_linear(x.to(dev), planes[0], planes[1] if view == "target" else None,
                                                    planes[2], view, planes[3], act=act)
                    add(f"dual_plane_linear {name} M={m} {view} {act}", _rel(got, want), LIMITS[act])
                    if act == "int8":         # the `triton` backend's warp-tiled planes: the same rows, bit for bit
                        tiled = kernels.dual_plane_linear_tiled(x.to(dev), tile_planes(*planes), view)
                        same = torch.equal(tiled, got)
                        checks.append({"name": f"dual_plane_linear_tiled {name} M={m} {view} equals canonical",
                                       "max_rel_err": 0.0 if same else _rel(tiled, got.cpu()), "limit": 0.0,
                                       "passed": same})
    seq, cap, t = 300, 304, 5
    kv = quantize_kv(torch.randn(2, hkv, cap, d, generator=gen))
    q = torch.randn(hq, t, d, generator=gen)
    for label, kv8_from in (("kv8", 0), ("kv4", seq), ("recent-64", seq - 64)):
        want = reference.nested_kv_attention(q, *kv, seq, kv8_from)
        got = kernels.nested_kv_attention(q.to(dev), *(p.to(dev) for p in kv), seq, kv8_from)
        add(f"nested_kv_attention Hq={hq} Hkv={hkv} D={d} S={seq} T={t} {label}", _rel(got, want),
            LIMITS["attention"])
    k, v = torch.randn(hkv, t, d, generator=gen), torch.randn(hkv, t, d, generator=gen)
    planes = [torch.zeros(2, hkv, 16, d // 2, dtype=torch.uint8, device=dev) for _ in range(2)]
    scales = torch.zeros(2, hkv, 16, dtype=torch.float16, device=dev)
    kernels.write_kv(k.to(dev), v.to(dev), planes[0], planes[1], scales, 3)
    wb, wr, ws = quantize_kv(torch.stack((k, v)))
    exact = all(torch.equal(a[:, :, 3:3 + t].cpu(), b) for a, b in ((planes[0], wb), (planes[1], wr), (scales, ws)))
    checks.append({"name": "write_kv bit-exact", "max_rel_err": 0.0 if exact else None, "limit": 0.0,
                   "passed": exact})
    return {"passed": all(c["passed"] for c in checks), "device": "interpreter" if interp else "cuda",
            "weights": weights, "checks": checks, "reason": None}

