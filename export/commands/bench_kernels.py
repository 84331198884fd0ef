"""`bitnest bench-kernels` (scripts/bench_kernels.py): GB/s of every Triton kernel on a CUDA GPU against the device's
copy bandwidth (edge.analysis.kernel_bench)."""

import argparse

from edge.analysis.kernel_bench import __doc__ as _TOOL_DOC, run
from edge.argtypes import Parser, count
from edge.options.run import run_cli


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="bench_kernels.py", description=_TOOL_DOC.splitlines()[0])
    p.add_argument("--repeats", type=count(), default=7, help="timed graph replays per case (median taken)")
    p.add_argument("--contexts", default="4096,8192,16384,32768", help="attention context lengths")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    return run_cli(lambda: run(a), a.json, p.prog, echo=False)
