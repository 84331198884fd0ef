"""Kernel bandwidth on a CUDA GPU: effective bandwidth of each Triton kernel at decode shapes, as a fraction of the
device's measured copy bandwidth (both taken in the same run).

    python scripts/bench_kernels.py [--repeats 7] [--contexts 4096,8192,16384,32768] [--out FILE] [--json]

Prefill (`prefill_rows`): a chunk of 256 tokens through the tensor-core kernel against the decode kernel in passes
of 8, at Llama-2-7B's and Qwen2.5-1.5B's shapes.

GEMV: K x N = 4096 x 4096, 4096 x 11008 and 11008 x 4096 (Llama-7B q/o, gate/up and down), the shapes beyond any
L2 (8192 x 28672 and 28672 x 8192: 117-235 MB of planes a matrix) and the real shapes of Qwen2.5-1.5B and Llama-3-8B,
M = 1, 5 and 8, draft (W4A8: base + scales) and target (W8A8: both planes): the decode kernel on the warp-tiled planes
the `triton` backend holds (`dual_plane_linear_tiled`) and on canonical ones (INT8 activations, the TensorRT plugins'
layout), and the float16-activation variant (the tensor-core kernel; not in the device check); cuBLAS float16
x @ W^T of the same shape is timed beside it. Every timed launch reads its own copy of the planes from a ring of copies that
together exceed twice the device's L2, so no launch finds its weights in L2 (`ring`), and each row gives the
copy bandwidth of the same bytes in the same run beside the 512 MiB copy that every fraction is of. Attention: Llama-2-7B heads (32 x 128, MHA) and a GQA 32/8 layout, T = 1 and
5, KV8 and KV4, over each context. "bytes" are the bytes the format requires (planes, scales, activations in,
result out); each time is the median over repeats of a CUDA-graph replay of 20 launches (launch overhead excluded),
and the copy bandwidth is a device-to-device copy of 512 MiB counted as read + write.
"""

import json
import math
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from edge.errors import BitNestError

GEMV_SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]   # (K, N): Llama-2-7B
BEYOND_L2 = [(8192, 28672), (28672, 8192)]                  # each matrix's planes > 2x any GPU's L2 (Hopper: 50 MB)
REAL_SHAPES = {"qwen2.5-1.5b": [(1536, 1536), (1536, 256), (1536, 8960), (8960, 1536)],
               "llama-3-8b": [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096)]}
DEVICE_CHECK_SHAPES = BEYOND_L2 + [s for shapes in REAL_SHAPES.values() for s in shapes]
GEMV_TOKENS = (1, 5, 8)
PREFILL_SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (1536, 8960), (8960, 1536)]   # Llama-2-7B, Qwen2.5-1.5B
PREFILL_TOKENS = 256                 # the triton backend's prefill chunk
ATTENTION_LAYOUTS = [("llama2-7b mha", 32, 32, 128), ("gqa 32/8", 32, 8, 128)]   # (name, Hq, Hkv, D)
# (name, Hq, Hkv, D, context: where the chunk ends, queries): a whole chunk at 4K, and a short one at 16K (few
# programs stream the whole context: where the split kernel may still win)
PREFILL_ATTENTION_CASES = [("llama2-7b mha", 32, 32, 128, 4096, 256), ("qwen2.5-1.5b gqa 12/2", 12, 2, 128, 4096, 256),
                           ("qwen2.5-1.5b gqa 12/2", 12, 2, 128, 16384, 32)]
LAUNCHES = 20


def time_graph(fn, repeats: int, launches: int = LAUNCHES) -> float:
    """Median seconds per call of `fn` over `repeats` replays of a CUDA graph holding `launches` calls."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()                                              # warm-up on the capture stream (compiles, allocates)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / launches)
    return statistics.median(times)


class _HostData(TorchDispatchMode):
    """Refuses what a CUDA graph cannot capture: a tensor made from host data (`torch.tensor`, a copy from the CPU
    on a GPU) or a value read back to the host (`.item()`)."""
    REFUSED = {torch.ops.aten.lift_fresh.default: "makes a tensor from host data (a host-to-device copy on a GPU)",
               torch.ops.aten._local_scalar_dense.default: "reads a value back to the host"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.REFUSED:
            raise BitNestError(f"a timed kernel call {self.REFUSED[func]}: a CUDA graph cannot capture it; make its "
                               "inputs (lengths included: the `_at` launchers) before timing")
        return func(*args, **(kwargs or {}))


def time_host(fn, repeats: int, launches: int = LAUNCHES) -> float:
    """Median seconds per call of `fn` timed on the host (the CPU / the Triton interpreter: the dry run's timer).
    Its first call runs as `time_graph` would capture it: one that could not be captured raises here too."""
    with _HostData():
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(repeats: int, nbytes: int = 512 << 20, device: str = "cuda", timer=time_graph) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timer(lambda: dst.copy_(src), repeats)


def l2_bytes(device: str) -> int:
    """The device's L2 cache in bytes (0 on the CPU: the dry run)."""
    if device != "cuda":
        return 0
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)


def ring(nbytes: int, l2: int, launches: int = LAUNCHES) -> int:
    """Copies of an `nbytes` operand so that those one CUDA graph of `launches` calls touches exceed twice the L2
    (each call reads the next copy): at least 1; where even `launches` copies would not, the caller times more
    launches (`max(launches, copies)`)."""
    return max(1, -(-2 * l2 // max(nbytes, 1)) + 1) if l2 else 1


class Cycle:
    """A callable over a ring of operand sets: each call runs `fn` on the next set."""

    def __init__(self, fn, sets):
        self.fn, self.sets, self.i = fn, sets, 0

    def __call__(self):
        out = self.fn(*self.sets[self.i % len(self.sets)])
        self.i += 1
        return out


def _row(kernel, k, n, m, view, act, need, sec, copy_bw, **extra) -> dict:
    return {"kernel": kernel, "K": k, "N": n, "M": m, "view": view, "act": act, "bytes": need, "us": sec * 1e6,
            "GBps": need / sec / 1e9, "fraction_of_copy": need / sec / copy_bw, **extra}


def gemv_rows(repeats: int, copy_bw: float, shapes=GEMV_SHAPES, device: str = "cuda", timer=time_graph,
              acts=("int8", "float16"), tokens=GEMV_TOKENS, rows: list | None = None) -> list[dict]:
    """One row per (shape, M, view, activations) of the canonical launch, one per (shape, M, view) of the tiled
    launch the `triton` backend runs (`dual_plane_linear_tiled`, INT8 activations) and a cuBLAS float16 row per
    (shape, M), each launch on its own copy of the operands (`ring`); `copy_same_GBps`: a device copy of the
    target's plane bytes, same ring. Rows are appended to `rows` (returned) as each is measured."""
    from plugins.kernels import dual_plane_linear, dual_plane_linear_tiled
    from plugins.kernels.tiling import tile_planes
    rows, l2 = [] if rows is None else rows, l2_bytes(device)
    for k, n in shapes:
        g = 128 if k % 128 == 0 else 64
        plane = n * k // 2
        copies = ring(2 * plane, l2)
        launches = max(LAUNCHES, copies) if device == "cuda" else LAUNCHES
        sets = [(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device),
                 torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device),
                 (torch.rand(n, k // g, device=device) * 1e-2).half()) for _ in range(copies)]
        tiled = [(tile_planes(b, r, s),) for b, r, s in sets]              # the backend's layout, same ring
        dst = [torch.empty(2 * plane, dtype=torch.uint8, device=device) for _ in range(copies)]
        copy_sets = [(torch.cat((b.view(-1), r.view(-1))), d) for (b, r, _), d in zip(sets, dst)]
        copy_same = 2 * 2 * plane / timer(Cycle(lambda src, d: d.copy_(src), copy_sets), repeats, launches)
        del copy_sets, dst
        for m in tokens:
            x = torch.randn(m, k, device=device).half()
            out = torch.empty(m, n, dtype=torch.float32, device=device)
            for view, planes in (("draft", 1), ("target", 2)):
                need = planes * plane + n * (k // g) * 2 + m * k * 2 + m * n * 4
                for act in acts:
                    fn = Cycle(lambda b, r, s: dual_plane_linear(x, b, r, s, view, out=out, act=act), sets)
                    sec = timer(fn, repeats, launches)
                    rows.append(_row("dual_plane_linear", k, n, m, view, act, need, sec, copy_bw,
                                     copy_same_GBps=copy_same / 1e9, ring=copies, beyond_l2=plane > l2 > 0))
                fn = Cycle(lambda t: dual_plane_linear_tiled(x, t, view, out=out), tiled)
                rows.append(_row("dual_plane_linear_tiled", k, n, m, view, "int8", need, timer(fn, repeats, launches),
                                 copy_bw, copy_same_GBps=copy_same / 1e9, ring=copies, beyond_l2=plane > l2 > 0))
        del sets, tiled
        w16 = [torch.randn(n, k, device=device).half() for _ in range(ring(2 * n * k, l2))]
        for m in tokens[:1]:
            x = torch.randn(m, k, device=device).half()
            sec = timer(Cycle(lambda w: x @ w.T, [(w,) for w in w16]), repeats, max(launches, len(w16)))
            rows.append(_row("cublas_fp16", k, n, m, "fp16", "float16", n * k * 2 + m * k * 2 + m * n * 2, sec,
                             copy_bw, ring=len(w16)))
        del w16
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def prefill_rows(repeats: int, shapes=PREFILL_SHAPES, device: str = "cuda", timer=time_graph,
                 tokens: int = PREFILL_TOKENS) -> list[dict]:
    """One row per (shape, view) of a prefill chunk of `tokens` through the tiled planes (`dual_plane_linear_tiled`):
    the tensor-core kernel (gemv.PREFILL_GEMM, the backend's path) and the decode kernel in passes of DECODE_MAX_M
    tokens (what ran before it), their times, the speed-up, the GEMM's int8 tera-operations a second (2 M N K,
    twice that for the target's two planes) and whether both paths gave the same bits here (`identical`: what
    tests/test_tiled_gemv.py holds in the interpreter)."""
    from plugins.kernels import dual_plane_linear_tiled, gemv
    from plugins.kernels.tiling import tile_planes
    rows = []
    for k, n in shapes:
        g = 128 if k % 128 == 0 else 64
        planes = tile_planes(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device),
                             torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device),
                             (torch.rand(n, k // g, device=device) * 1e-2).half())
        x = torch.randn(tokens, k, device=device)
        out = torch.empty(tokens, n, dtype=torch.float32, device=device)
        for view, nplanes in (("draft", 1), ("target", 2)):
            sec, y, before = {}, {}, gemv.PREFILL_GEMM
            for path, gemm in (("gemm", True), ("decode", False)):
                gemv.PREFILL_GEMM = gemm
                try:
                    y[path] = dual_plane_linear_tiled(x, planes, view)
                    sec[path] = timer(lambda: dual_plane_linear_tiled(x, planes, view, out=out), repeats)
                finally:
                    gemv.PREFILL_GEMM = before
            rows.append({"kernel": "prefill", "K": k, "N": n, "M": tokens, "view": view, "gemm_us": sec["gemm"] * 1e6,
                         "decode_us": sec["decode"] * 1e6, "speedup": sec["decode"] / sec["gemm"],
                         "gemm_TOPS": 2 * nplanes * tokens * n * k / sec["gemm"] / 1e12,
                         "identical": bool(torch.equal(y["gemm"], y["decode"]))})
    return rows


def prefill_attention_rows(repeats: int, cases=PREFILL_ATTENTION_CASES, device: str = "cuda",
                           timer=time_graph) -> list[dict]:
    """One row per case: the attention of a prefill chunk of `tokens` queries ending at `context` positions (KV8)
    on the prefill kernel (`attention_prefill`: query tiles over their causal range, no partials; the backend's path)
    against the split kernel the chunks ran on before (attention.SPLIT_QUERIES raised for it): times, speed-up and
    the two outputs' relative difference (`close`: within the interpreter tests' tolerance of the reference, 5e-5;
    the two sum the softmax in other orders, so not bit for bit), the prefill kernel's programs (a chunk of few
    queries at a long context is few programs) and its GB/s over one read of the context's KV8 planes and scales."""
    from plugins.kernels import attention, nested_kv_attention_at
    from plugins.kernels.attention_prefill import prefill_grid
    rows = []
    for layout, hq, hkv, d, context, tokens in cases:
        base = torch.randint(0, 256, (2, hkv, context, d // 2), dtype=torch.uint8, device=device)
        refine = torch.randint(0, 256, base.shape, dtype=torch.uint8, device=device)
        scale = (torch.rand(2, hkv, context, device=device) * 0.1).half()
        length = torch.tensor([context], dtype=torch.int32, device=device)
        kv8 = torch.zeros(1, dtype=torch.int32, device=device)
        q = torch.randn(hq, tokens, d, device=device)
        out = torch.empty(hq, tokens, d, device=device)
        sec, y, before = {}, {}, attention.SPLIT_QUERIES
        for path, split in (("prefill", before), ("split", tokens)):
            attention.SPLIT_QUERIES = split
            try:
                y[path] = nested_kv_attention_at(q, base, refine, scale, length, length, kv8).clone()
                sec[path] = timer(lambda: nested_kv_attention_at(q, base, refine, scale, length, length, kv8, out=out),
                                  repeats)
            finally:
                attention.SPLIT_QUERIES = before
        diff = ((y["prefill"] - y["split"]).double().norm() / y["split"].double().norm()).item()
        rows.append({"kernel": "prefill_attention", "layout": layout, "context": context, "T": tokens,
                     "prefill_us": sec["prefill"] * 1e6, "split_us": sec["split"] * 1e6,
                     "speedup": sec["split"] / sec["prefill"], "rel_diff": diff, "close": diff < 5e-5,
                     "programs": math.prod(prefill_grid(hkv, hq // hkv, d, tokens)),
                     "prefill_GBps": (2 * base.numel() + 2 * scale.numel()) / sec["prefill"] / 1e9})
    return rows


def attention_rows(repeats: int, copy_bw: float, contexts: list[int], layouts=ATTENTION_LAYOUTS, device: str = "cuda",
                   timer=time_graph, rows: list | None = None) -> list[dict]:
    from plugins.kernels import nested_kv_attention_at
    rows = [] if rows is None else rows          # appended to as each is measured
    for layout, hq, hkv, d in layouts:
        for s in contexts:
            base = torch.randint(0, 256, (2, hkv, s, d // 2), dtype=torch.uint8, device=device)
            refine = torch.randint(0, 256, base.shape, dtype=torch.uint8, device=device)
            scale = (torch.rand(2, hkv, s, device=device) * 0.1).half()
            # lengths in device scalars made before timing: a CUDA graph cannot capture a host-to-device copy
            length = torch.tensor([s], dtype=torch.int32, device=device)
            kv8_from = {"kv8": torch.zeros(1, dtype=torch.int32, device=device), "kv4": length}
            for t in (1, 5):
                q = torch.randn(hq, t, d, device=device)
                out = torch.empty(hq, t, d, device=device)
                for view, planes in (("kv8", 2), ("kv4", 1)):
                    sec = timer(lambda b=base, r=refine, sc=scale:          # bound: the planes are deleted below
                                nested_kv_attention_at(q, b, r, sc, length, length, kv8_from[view], out=out), repeats)
                    need = s * hkv * 2 * (planes * d // 2 + 2) + 2 * hq * t * d * 4
                    rows.append({"kernel": "nested_kv_attention", "layout": layout, "context": s, "T": t,
                                 "view": view, "bytes": need, "us": sec * 1e6, "GBps": need / sec / 1e9,
                                 "fraction_of_copy": need / sec / copy_bw})
            del base, refine, scale
    return rows


def run(a) -> dict:
    if not torch.cuda.is_available():
        raise BitNestError("bench_kernels.py needs a CUDA GPU (none found): run it on the device; "
                           "the kernels' correctness is checked without one by the interpreter tests")
    contexts = [int(c) for c in a.contexts.split(",")]
    copy_bw = copy_bandwidth(a.repeats)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "repeats": a.repeats, "copy_GBps": copy_bw / 1e9,
              "l2_bytes": l2_bytes("cuda"), "gemv": gemv_rows(a.repeats, copy_bw, GEMV_SHAPES + DEVICE_CHECK_SHAPES),
              "attention": attention_rows(a.repeats, copy_bw, contexts), "prefill": prefill_rows(a.repeats),
              "prefill_attention": prefill_attention_rows(a.repeats)}
    if a.out:
        tmp = Path(a.out + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(a.out)
    if not a.json:
        print(f"device: {result['device']}, copy bandwidth {copy_bw / 1e9:.1f} GB/s")
        for r in result["gemv"]:
            print(f"{r['kernel']:18} K={r['K']:5} N={r['N']:5} M={r['M']} {r['view']:6} {r['act']:7} "
                  f"{r['us']:8.1f} us {r['GBps']:7.1f} GB/s {100 * r['fraction_of_copy']:5.1f}%")
        for r in result["attention"]:
            print(f"attention {r['layout']:13} S={r['context']:5} T={r['T']} {r['view']} {r['us']:8.1f} us "
                  f"{r['GBps']:7.1f} GB/s {100 * r['fraction_of_copy']:5.1f}%")
        for r in result["prefill"]:
            print(f"prefill K={r['K']:5} N={r['N']:5} M={r['M']} {r['view']:6} tensor cores {r['gemm_us']:8.1f} us, "
                  f"decode kernel {r['decode_us']:8.1f} us: {r['speedup']:.2f}x, {r['gemm_TOPS']:.1f} int8 TOPS")
        for r in result["prefill_attention"]:
            print(f"prefill attention {r['layout']} S={r['context']} T={r['T']}: {r['prefill_us']:8.1f} us, split "
                  f"kernel {r['split_us']:8.1f} us: {r['speedup']:.2f}x, relative difference {r['rel_diff']:.1e}")
    return result
