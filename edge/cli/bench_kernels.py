"""Kernel bandwidth on a CUDA GPU: effective bandwidth of each Triton kernel at decode shapes, as a fraction of the
device's measured copy bandwidth (both taken in the same run).

    python scripts/bench_kernels.py [--repeats 7] [--contexts 4096,8192,16384,32768] [--out FILE] [--json]

GEMV: K x N = 4096 x 4096, 4096 x 11008 and 11008 x 4096 (Llama-7B q/o, gate/up and down), M = 1 and 5, draft
(W4A8: base + scales) and target (W8A8: both planes), and the float16-activation variant; cuBLAS float16 x @ W^T
of the same shape is timed beside it. Attention: Llama-2-7B heads (32 x 128, MHA) and a GQA 32/8 layout, T = 1 and
5, KV8 and KV4, over each context. "bytes" are the bytes the format requires (planes, scales, activations in,
result out); each time is the median over repeats of a CUDA-graph replay of 20 launches (launch overhead excluded),
and the copy bandwidth is a device-to-device copy of 512 MiB counted as read + write.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from edge.argtypes import Parser, count
from edge.cli.common import run_cli
from edge.errors import BitNestError

GEMV_SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]   # (K, N)
ATTENTION_LAYOUTS = [("llama2-7b mha", 32, 32, 128), ("gqa 32/8", 32, 8, 128)]   # (name, Hq, Hkv, D)
LAUNCHES = 20


def time_graph(fn, repeats: int) -> float:
    """Median seconds per call of `fn` over `repeats` replays of a CUDA graph holding LAUNCHES calls."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()                                              # warm-up on the capture stream (compiles, allocates)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / LAUNCHES)
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


def time_host(fn, repeats: int) -> float:
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


def gemv_rows(repeats: int, copy_bw: float, shapes=GEMV_SHAPES, device: str = "cuda", timer=time_graph) -> list[dict]:
    from plugins.kernels import dual_plane_linear
    rows = []
    for k, n in shapes:
        g = 128 if k % 128 == 0 else 64
        base = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
        refine = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
        scale = (torch.rand(n, k // g, device=device) * 1e-2).half()
        w16 = torch.randn(n, k, device=device).half()
        for m in (1, 5):
            x = torch.randn(m, k, device=device).half()
            out = torch.empty(m, n, dtype=torch.float32, device=device)
            for view, planes in (("draft", 1), ("target", 2)):
                for act in ("int8", "float16"):
                    sec = timer(lambda: dual_plane_linear(x, base, refine, scale, view, out=out, act=act), repeats)
                    need = planes * n * k // 2 + n * (k // g) * 2 + m * k * 2 + m * n * 4
                    rows.append({"kernel": "dual_plane_linear", "K": k, "N": n, "M": m, "view": view, "act": act,
                                 "bytes": need, "us": sec * 1e6, "GBps": need / sec / 1e9,
                                 "fraction_of_copy": need / sec / copy_bw})
            sec = timer(lambda: x @ w16.T, repeats)
            need = n * k * 2 + m * k * 2 + m * n * 2
            rows.append({"kernel": "cublas_fp16", "K": k, "N": n, "M": m, "view": "fp16", "act": "float16",
                         "bytes": need, "us": sec * 1e6, "GBps": need / sec / 1e9,
                         "fraction_of_copy": need / sec / copy_bw})
    return rows


def attention_rows(repeats: int, copy_bw: float, contexts: list[int], layouts=ATTENTION_LAYOUTS, device: str = "cuda",
                   timer=time_graph) -> list[dict]:
    from plugins.kernels import nested_kv_attention_at
    rows = []
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
                    sec = timer(lambda: nested_kv_attention_at(q, base, refine, scale, length, length, kv8_from[view],
                                                               out=out), repeats)
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
              "gemv": gemv_rows(a.repeats, copy_bw), "attention": attention_rows(a.repeats, copy_bw, contexts)}
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
    return result


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="bench_kernels.py", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=count(), default=7, help="timed graph replays per case (median taken)")
    p.add_argument("--contexts", default="4096,8192,16384,32768", help="attention context lengths")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    return run_cli(lambda: run(a), a.json, p.prog, echo=False)
