"""Compile every Triton kernel for a GPU architecture without a GPU (Orin NX / AGX Orin: sm_87) and summarize it.

    python scripts/compile_kernels.py --arch sm_87 [--out DIR] [--ptx-version 85] [--json]

Writes DIR/NAME.ptx and DIR/NAME.cubin per kernel variant and DIR/summary.json (DIR: a new temporary folder unless
--out names one); prints a table (or, with --json, one object last: {"arch", "ptx_version", "out", "budgets_met",
"kernels": [{"kernel", "ptx_isa", "registers", "shared_bytes", "spill_store_bytes", "spill_load_bytes", "imma",
"hmma", "idp4a", "ldg128", the bandwidth proxy of the GEMVs (instructions_per_weight_byte, loop_ldg128; for the
prefill GEMMs also loop_tokens, loop_imma, instructions_per_weight_byte_token) and of attention
(instructions_per_kv4_byte, instructions_per_kv8_byte, the loops' plane loads), "budget_failures"}]}).
Exit 1 where a decode GEMV, prefill GEMM or attention kernel held to a budget misses it (plugins/kernels/aot.py),
naming each miss; --decode-sweep compiles the decode GEMV at every M, view and group size instead; --launches
CHECKPOINT compiles instead what the triton backend launches for that checkpoint's passes (a speculative round, a
target and a draft step), or for a model preset's shapes (one block of random planes), through Triton's own launch
path, with nothing run (edge/analysis/kernel_launches.py): the proxy on the variants that really run, and every
launch option checked by the installed Triton. The PTX ISA is
pinned to 8.5 by default so it loads on the CUDA 12.6 driver of JetPack 6.1/6.2.
"""

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from edge.argtypes import Parser, count
from edge.options.run import run_cli


def run(a) -> dict:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise ValueError("TRITON_INTERPRET=1 is set: unset it, ahead-of-time compilation needs the compiler")
    m = re.fullmatch(r"sm_(\d{2,3})", a.arch)
    if not m or int(m.group(1)) < 80:
        raise ValueError(f"--arch {a.arch!r}: give sm_XY with XY >= 80 (Orin is sm_87)")
    if a.launches and a.decode_sweep:
        raise ValueError("--launches and --decode-sweep each choose what to compile: give one")
    if a.sms and not a.launches:
        raise ValueError("--sms sets the GPU --launches plans its passes for: give it with --launches")
    try:
        from plugins.kernels.aot import compile_all
    except ImportError as e:
        raise ValueError(f"triton is not installed ({e}): pip install triton") from e
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix=f"bitnest-{a.arch}-"))
    if a.launches:
        from edge.analysis.kernel_launches import compile_launches
        rows = compile_launches(a.launches, out, int(m.group(1)), a.ptx_version, a.sms)
    else:
        rows = compile_all(out, int(m.group(1)), a.ptx_version, a.decode_sweep)
    misses = [f"{r['kernel']}: {'; '.join(r['budget_failures'])}" for r in rows if r.get("budget_failures") and r["held"]]
    result = {"arch": a.arch, "ptx_version": a.ptx_version, "out": str(out), "launches": a.launches, "sms": a.sms,
              "budgets_met": not misses, "kernels": rows}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out / "summary.json")
    if not a.json:
        print(f"{'kernel':32} {'isa':>4} {'regs':>5} {'smem':>6} {'spill':>6} {'IMMA':>5} {'HMMA':>5} {'DP4A':>5} "
              f"{'LDG128':>6}  instructions a plane byte")
        for r in rows:
            per_byte = (f"KV4 {r['instructions_per_kv4_byte']}, KV8 {r['instructions_per_kv8_byte']}"
                        if "instructions_per_kv8_byte" in r else r.get("instructions_per_weight_byte", ""))
            print(f"{r['kernel']:32} {r['ptx_isa']:>4} {r['registers']:>5} {r['shared_bytes']:>6} "
                  f"{r['spill_store_bytes']:>6} {r['imma']:>5} {r['hmma']:>5} {r['idp4a']:>5} {r['ldg128']:>6}  {per_byte}")
        print(f"kernels in {out}")
    for miss in misses:
        print(f"compile_kernels.py: over budget: {miss}", file=sys.stderr)
    return result


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="compile_kernels.py", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_87", help="target architecture, e.g. sm_87 (Orin)")
    p.add_argument("--out", help="folder for the PTX, cubins and summary.json (default: a new temporary folder)")
    p.add_argument("--ptx-version", type=count(10), default=85, help="PTX ISA version x10 (85 loads on CUDA 12.6)")
    p.add_argument("--decode-sweep", action="store_true",
                   help="instead: the decode GEMV at every M (1-8), view and group size (32, 64, 128)")
    p.add_argument("--launches", metavar="CHECKPOINT|PRESET",
                   help="instead: what the triton backend launches for a checkpoint's passes, or a model preset's "
                        "(one block of random planes, e.g. llama-2-7b-32k), compiled, none run")
    p.add_argument("--sms", type=count(), help="with --launches: the GPU's SMs the GEMV's split of K is planned for "
                                               "(default: 8, Orin NX's, for sm_87; 132 for sm_90)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    done = {}
    rc = run_cli(lambda: done.setdefault("result", run(a)), a.json, p.prog, echo=False)
    return 1 if rc == 0 and not done["result"]["budgets_met"] else rc
