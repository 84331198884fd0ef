"""The decode GEMV's launch parameters and its access pattern, measured on a CUDA GPU (what the device check's fixed
launch cannot show: which choice gets the planes to stream at the copy bandwidth).

    python scripts/gemv_sweep.py [--repeats 5] [--shapes 8192x28672,28672x8192] [--out FILE] [--json] [--dry]

Two kinds of rows, all at shapes given as K x N, each launch on its own copy of the planes (kernel_bench.ring: no
launch finds its weights in L2), each as a fraction of a device-to-device copy measured in the same run:
- `probe`: the planes only read, no arithmetic, in three access patterns: `row_per_thread` (each thread walks one
  row of canonical planes in 16-byte chunks: a warp's load touches 32 rows), `tiled` (the same threads on the
  warp-tiled planes, plugins.kernels.tiling: a warp's load reads 512 contiguous bytes) and `coalesced` (a warp
  reads 512 contiguous bytes of one canonical row). They bound what a kernel of that pattern can reach here.
- `decode`: `plugins.kernels.gemv_decode.decode_gemv_kernel` itself (with its activation quantization and split
  reduction, as the launchers run it) on tiled planes at every combination of warps, row tiles per thread and
  split-K factor (programs per SM of `gemv.plan_split`, scaled), and on canonical planes at the launcher's own
  choice; `default` marks the launcher's choice.
"""

import json
import os
import sys

import torch
import triton
import triton.language as tl

from edge.analysis import kernel_bench as kb
from edge.atomic import write_atomic
from edge.errors import BitNestError
from plugins.kernels.tiling import tile_planes

SHAPES = [(8192, 28672), (28672, 8192), (4096, 11008)]   # (K, N): beyond L2, then Llama-2-7B's gate/up
TOKENS = (1, 5)
WARPS = (2, 4, 8)
ROWS = (1, 2)
SPLIT_SCALES = (0.5, 1.0, 2.0, 4.0)     # x the programs per SM that gemv.plan_split aims at


@triton.jit
def _row_per_thread_probe(p_ptr, q_ptr, out_ptr, N, K_WORDS, WORDS_PER_SPLIT, TWO: tl.constexpr,
                          BLOCK_S: tl.constexpr, TILED: tl.constexpr):
    """XOR of every word of a thread's row range (16-byte chunks, one row per thread): the decode kernel's loads, on
    canonical planes or (TILED) the warp-tiled ones (chunk j of row n at word ((n // 32) * K/32 + j) * 128 +
    (n % 32) * 4)."""
    n = tl.minimum(tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S), N - 1)
    w0 = tl.program_id(1) * WORDS_PER_SPLIT
    if TILED:
        ptr = (((n // 32) * (K_WORDS // 4) + w0 // 4) * 128 + (n % 32) * 4)[:, None] + tl.arange(0, 4)[None, :]
    else:
        ptr = (n * K_WORDS)[:, None] + w0 + tl.arange(0, 4)[None, :]                   # [BS, 4]
    acc = tl.zeros([BLOCK_S, 4], tl.int32)
    for _ in range(0, tl.minimum(WORDS_PER_SPLIT, K_WORDS - w0), 4):
        acc ^= tl.load(p_ptr + ptr)
        if TWO:
            acc ^= tl.load(q_ptr + ptr)
        ptr += 128 if TILED else 4
    tl.store(out_ptr + tl.program_id(1) * N + n, tl.xor_sum(acc, axis=1))


@triton.jit
def _coalesced_probe(p_ptr, q_ptr, out_ptr, N, K_WORDS, WORDS_PER_SPLIT, TWO: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_W: tl.constexpr):
    """XOR of every word of a row tile, BLOCK_W contiguous words of each row per step (a warp reads 512 bytes)."""
    n = tl.minimum(tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
    w0 = tl.program_id(1) * WORDS_PER_SPLIT
    ptr = (n * K_WORDS)[:, None] + w0 + tl.arange(0, BLOCK_W)[None, :]                 # [BN, BW]
    acc = tl.zeros([BLOCK_N, BLOCK_W], tl.int32)
    for _ in range(0, tl.minimum(WORDS_PER_SPLIT, K_WORDS - w0), BLOCK_W):
        acc ^= tl.load(p_ptr + ptr)
        if TWO:
            acc ^= tl.load(q_ptr + ptr)
        ptr += BLOCK_W
    tl.store(out_ptr + tl.program_id(1) * N + n, tl.xor_sum(acc, axis=1))


def probe_rows(k, n, sets, copy_bw, repeats, launches, sms, dev="cuda", timer=kb.time_graph) -> list[dict]:
    """The read probes at every pattern, warps and split scale (`gemv.plan_split` over 512-byte units of K)."""
    from plugins.kernels import gemv
    rows = []
    k_words = k // 8
    for two, view in ((False, "draft"), (True, "target")):
        need = (2 if two else 1) * n * k // 2
        for pattern in ("row_per_thread", "tiled", "coalesced"):
            for warps in WARPS:
                block = warps if pattern == "coalesced" else 32 * warps
                for scale in SPLIT_SCALES:
                    split, per = gemv.plan_split(n, k, 1024, sms, block, 4 * scale)  # units of 512 bytes
                    per *= 128                                                    # words per split
                    out = torch.empty(split, n, dtype=torch.int32, device=dev)
                    grid = (triton.cdiv(n, block), split)
                    if pattern != "coalesced":   # `tiled` reads the ring's planes in the tiled order: the same
                        fn = kb.Cycle(lambda p, q, s: _row_per_thread_probe[grid](      # bytes (N % 32 == 0)
                            p.view(torch.int32), q.view(torch.int32), out, n, k_words, per, TWO=two, BLOCK_S=block,
                            TILED=pattern == "tiled", num_warps=warps), sets)
                    else:
                        fn = kb.Cycle(lambda p, q, s: _coalesced_probe[grid](
                            p.view(torch.int32), q.view(torch.int32), out, n, k_words, per, TWO=two, BLOCK_N=block,
                            BLOCK_W=128, num_warps=warps), sets)
                    sec = timer(fn, repeats, launches)
                    rows.append({"kind": "probe", "pattern": pattern, "K": k, "N": n, "view": view, "warps": warps,
                                 "split": split, "split_scale": scale, "bytes": need, "us": sec * 1e6,
                                 "fraction_of_copy": need / sec / copy_bw})
    return rows


def _configs(m: int):
    """(layout, warps, rows, split scale) of each decode launch swept: every combination on the tiled
    planes, the launcher's own on canonical ones."""
    from plugins.kernels import gemv
    for warps in WARPS:
        for rows in ROWS:
            for scale in SPLIT_SCALES:
                yield "tiled", warps, rows, scale
    yield "canonical", gemv.DECODE_WARPS, gemv.decode_rows(m), 1.0


def decode_rows(k, n, sets, tiled, copy_bw, repeats, launches, sms, dev="cuda", timer=kb.time_graph) -> list[dict]:
    """The decode kernel at each `_configs` launch; `sets` the canonical ring, `tiled` the same planes tiled."""
    from plugins.kernels import gemv
    g = 128 if k % 128 == 0 else 64
    rows = []
    default_split = gemv.plan_split(n, k, g, sms)
    for m in TOKENS:
        x = torch.randn(m, k, device=dev).half()
        y = torch.empty(m, n, dtype=torch.float32, device=dev)
        for view, planes in (("draft", 1), ("target", 2)):
            need = planes * n * k // 2 + n * (k // g) * 2 + m * k * 2 + m * n * 4
            target = view == "target"
            for layout, warps, rows_per, scale in _configs(m):
                split, per = gemv.plan_split(n, k, g, sms, rows_per * 32 * warps, 4 * scale) \
                    if layout == "tiled" else default_split

                def launch(b, r, s, split=split, per=per, warps=warps, rows_per=rows_per, layout=layout):
                    gemv._launch_decode(x, b, r if target else None, s, None, y, target, None, split, per, n=n, g=g,
                                        tiled=layout == "tiled", warps=warps, rows=rows_per)   # as the launchers do
                ring = [(t.base, t.refine, t.scale) for t in tiled] if layout == "tiled" else sets
                sec = timer(kb.Cycle(launch, ring), repeats, launches)
                default = warps == gemv.DECODE_WARPS and rows_per == gemv.decode_rows(m) and \
                    (split, per) == default_split
                rows.append({"kind": "decode", "layout": layout, "K": k, "N": n, "M": m, "view": view,
                             "warps": warps, "rows": rows_per, "split": split, "split_scale": scale,
                             "default": default, "bytes": need, "us": sec * 1e6,
                             "fraction_of_copy": need / sec / copy_bw})
    return rows


def run(shapes, repeats: int, dry: bool = False, save=None) -> dict:
    """Every row at every shape; `save(result)` after each shape (a timeout keeps the shapes done). `dry`: the
    Triton interpreter on the CPU (TRITON_INTERPRET=1), host timer, the same launches (what a test runs: the code
    path, its figures meaningless)."""
    if dry and os.environ.get("TRITON_INTERPRET") != "1":
        raise BitNestError("--dry runs the kernels in the Triton interpreter: set TRITON_INTERPRET=1 before Python starts")
    if dry:
        dev, timer, sms, l2 = "cpu", kb.time_host, 8, 0
    elif not torch.cuda.is_available():
        raise BitNestError("gemv_sweep.py needs a CUDA GPU (none found): run it on the device, or --dry here")
    else:
        dev, timer, sms, l2 = "cuda", kb.time_graph, torch.cuda.get_device_properties(0).multi_processor_count, \
            kb.l2_bytes("cuda")
    copy_bw = kb.copy_bandwidth(repeats, 1 << 20 if dry else 512 << 20, dev, timer)
    out = {"device": torch.cuda.get_device_name() if not dry else "cpu (interpreter)", "triton": triton.__version__,
           "sms": sms, "l2_bytes": l2, "copy_GBps": copy_bw / 1e9, "rows": []}
    for k, n in shapes:
        copies = kb.ring(n * k, l2)
        launches = max(kb.LAUNCHES, copies)
        sets = [(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev),
                 torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev),
                 (torch.rand(n, k // (128 if k % 128 == 0 else 64), device=dev) * 1e-2).half())
                for _ in range(copies)]
        tiled = [tile_planes(*planes) for planes in sets]
        out["rows"] += probe_rows(k, n, sets, copy_bw, repeats, launches, sms, dev, timer)
        out["rows"] += decode_rows(k, n, sets, tiled, copy_bw, repeats, launches, sms, dev, timer)
        print(f"gemv_sweep: {k}x{n} done", file=sys.stderr, flush=True)
        del sets, tiled
        out["best"] = best(out["rows"])
        if save:
            save(out)
        if not dry:
            torch.cuda.empty_cache()
    return out


def best(rows: list[dict]) -> list[dict]:
    """The fastest row per (kind, pattern, shape, M, view), and the default launch's beside it."""
    keys = {}
    for r in rows:
        key = (r["kind"], r.get("pattern") or r.get("layout"), r["K"], r["N"], r.get("M"), r["view"])
        keys.setdefault(key, []).append(r)
    out = []
    for key, rs in keys.items():
        top = max(rs, key=lambda r: r["fraction_of_copy"])
        d = next((r for r in rs if r.get("default")), None)
        out.append({"key": list(key), "best": top, "default_fraction": d["fraction_of_copy"] if d else None})
    return out


def sweep(shapes: str, repeats: int, out: str | None = None, dry: bool = False) -> dict:
    """The sweep at `shapes` ("KxN,KxN"), written (atomically, after each shape) to `out` where given; the result
    with its `best` rows."""
    try:
        dims = [tuple(int(v) for v in s.split("x")) for s in shapes.split(",")]
    except ValueError:
        raise BitNestError(f"--shapes {shapes!r}: give K x N pairs such as 8192x28672,28672x8192") from None
    if any(len(d) != 2 or min(d) < 1 for d in dims):
        raise BitNestError(f"--shapes {shapes!r}: give K x N pairs such as 8192x28672,28672x8192")
    bad = [f"{k}x{n}" for k, n in dims if n % 32 or k % 1024]
    if bad:
        raise BitNestError(f"--shapes: {bad[0]} does not fit the sweep: N must be a multiple of 32 and K of 1024")
    save = (lambda r: write_atomic(json.dumps(r, indent=1).encode(), out)) if out else None
    return run(dims, repeats, dry, save)


def summary_lines(result: dict) -> list[str]:
    """One line per `best` row: the fastest configuration and the launcher's own."""
    lines = []
    for b in result["best"]:
        t, d = b["best"], b["default_fraction"]
        lines.append(f"{' '.join(str(v) for v in b['key'] if v is not None):40} best {100 * t['fraction_of_copy']:5.1f}% "
                     f"(warps {t['warps']} rows {t.get('rows')} split {t['split']}) default "
                     f"{'-' if d is None else format(100 * d, '.1f') + '%'}")
    return lines
