"""`bitnest device-check` (scripts/device_check.sh): every GPU check in one run, its JSON and its docs table
(export.tools.device_check)."""

import argparse
import json

from edge.argtypes import Parser, count
from edge.options.run import run_cli
from edge.errors import BitNestError
from edge.analysis.report.device import SECTIONS, table
from export.tools.device_check import (DRY_LIMIT_SCALE, DeviceCheckOptions, LIMITS, __doc__ as _TOOL_DOC,
                                      run_device_check)
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="device_check", description=_TOOL_DOC.splitlines()[0])
    p.add_argument("--out", help="write the JSON object here (atomically)")
    p.add_argument("--table", help="print the docs table of this device_check JSON file and exit")
    p.add_argument("--dry", action="store_true", help="Triton interpreter on the CPU, tiny shapes (TRITON_INTERPRET=1)")
    p.add_argument("--repeats", type=count(), default=3)
    p.add_argument("--new-tokens", type=count(), default=32)
    p.add_argument("--with-7b", action="store_true", help="also the Llama-2-7B shape (past the default run's 300 s)")
    p.add_argument("--with-gptq", action="store_true", help="also the gptq section: the default model exported with "
                   "GPTQ on CUDA against the committed CPU figures (past the default run's 300 s: "
                   f"{LIMITS['gptq']} s more)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    p.add_argument("--limits", default="", help="per-section seconds, e.g. kernels=200,lossless=60 (default: "
                   + ",".join(f"{k}={v}" for k, v in LIMITS.items()) + f"; x{DRY_LIMIT_SCALE} with --dry)")
    p.add_argument("--hang", help="dry runs only: make this section hang (a simulated timeout)")
    p.add_argument("--checkpoint", help="tensorrt section: an exported checkpoint (default: an RTN export of the "
                   "default model; in a dry run the section runs only with one)")
    p.add_argument("--onnx", help="tensorrt section: the step graph to build (default: exported from the checkpoint)")
    p.add_argument("--json", action="store_true", help="print the JSON object last")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)

    def body():
        if a.table:
            path = Path(a.table)
            if not path.is_file():
                raise BitNestError(f"{path} does not exist")
            print(table(json.loads(path.read_text())), end="")
            return {}
        try:
            limits = tuple((k, float(v)) for k, v in (kv.split("=") for kv in a.limits.split(",") if kv))
        except ValueError:
            raise ValueError(f"--limits {a.limits!r}: use SECTION=SECONDS[,SECTION=SECONDS...]") from None
        opts = DeviceCheckOptions(a.dry, a.repeats, a.new_tokens, not a.with_7b,
                                  tuple(s for s in a.sections.split(",") if s), limits, a.hang, a.checkpoint, a.onnx,
                                  a.with_gptq)
        return run_device_check(opts, Path(a.out) if a.out else None)

    return run_cli(body, a.json and not a.table, "device_check", echo=False)
