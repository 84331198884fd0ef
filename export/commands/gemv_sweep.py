"""`bitnest gemv-sweep` (scripts/gemv_sweep.py): the decode GEMV's access patterns and launch configurations on a
CUDA GPU, each as a share of the same run's copy bandwidth (edge.analysis.gemv_sweep)."""

import argparse
import sys

from edge.analysis.gemv_sweep import SHAPES, __doc__ as _TOOL_DOC, summary_lines, sweep
from edge.argtypes import Parser, count
from edge.options.run import run_cli


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="gemv_sweep.py", description=_TOOL_DOC.splitlines()[0])
    p.add_argument("--repeats", type=count(), default=5, help="timed graph replays per case (median taken)")
    p.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES),
                   help="K x N pairs, comma-separated (N a multiple of 32, K of 1024)")
    p.add_argument("--out", help="also write the JSON result here (after each shape)")
    p.add_argument("--json", action="store_true", help="print the best rows as one JSON object last")
    p.add_argument("--dry", action="store_true",
                   help="the Triton interpreter on the CPU (set TRITON_INTERPRET=1), tiny shapes: plumbing only")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)

    def body():
        result = sweep(a.shapes, a.repeats, a.out, a.dry)
        if not a.json:
            print("\n".join(summary_lines(result)), file=sys.stderr)
        return {"best": result["best"]}
    return run_cli(body, a.json, p.prog, echo=False)
