"""Compile every Triton kernel for a GPU architecture without a GPU (Orin NX / AGX Orin: sm_87) and summarize it.

    python scripts/compile_kernels.py --arch sm_87 --out DIR [--ptx-version 85] [--json]

Writes DIR/NAME.ptx and DIR/NAME.cubin per kernel variant and DIR/summary.json; prints a table (or, with --json,
one object last: {"arch", "ptx_version", "kernels": [{"kernel", "ptx_isa", "registers", "shared_bytes",
"spill_store_bytes", "spill_load_bytes", "imma", "hmma", "idp4a", ...}]}). The PTX ISA is pinned to 8.5 by
default so it loads on the CUDA 12.6 driver of JetPack 6.1/6.2 (see plugins/kernels/aot.py).
"""

import argparse
import json
import os
import re
from pathlib import Path

from edge.argtypes import Parser, count
from edge.cli.common import run_cli


def run(a) -> dict:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise ValueError("TRITON_INTERPRET=1 is set: unset it, ahead-of-time compilation needs the compiler")
    m = re.fullmatch(r"sm_(\d{2,3})", a.arch)
    if not m or int(m.group(1)) < 80:
        raise ValueError(f"--arch {a.arch!r}: give sm_XY with XY >= 80 (Orin is sm_87)")
    try:
        from plugins.kernels.aot import compile_all
    except ImportError as e:
        raise ValueError(f"triton is not installed ({e}): pip install triton") from e
    rows = compile_all(Path(a.out), int(m.group(1)), a.ptx_version)
    result = {"arch": a.arch, "ptx_version": a.ptx_version, "out": str(a.out), "kernels": rows}
    tmp = Path(a.out) / "summary.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(Path(a.out) / "summary.json")
    if not a.json:
        print(f"{'kernel':32} {'isa':>4} {'regs':>5} {'smem':>6} {'spill':>6} {'IMMA':>5} {'HMMA':>5} {'DP4A':>5}")
        for r in rows:
            print(f"{r['kernel']:32} {r['ptx_isa']:>4} {r['registers']:>5} {r['shared_bytes']:>6} "
                  f"{r['spill_store_bytes']:>6} {r['imma']:>5} {r['hmma']:>5} {r['idp4a']:>5}")
    return result


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="compile_kernels.py", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_87", help="target architecture, e.g. sm_87 (Orin)")
    p.add_argument("--out", required=True, help="folder for the PTX, cubins and summary.json")
    p.add_argument("--ptx-version", type=count(10), default=85, help="PTX ISA version x10 (85 loads on CUDA 12.6)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    return run_cli(lambda: run(a), a.json, p.prog, echo=False)
