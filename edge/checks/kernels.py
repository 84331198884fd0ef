"""`python -m edge.checks.kernels [--checkpoint DIR] [--json]`: every Triton kernel against the pure-torch
references (plugins.kernels.selfcheck) on real planes of a checkpoint, or random RTN-nested ones without one (said
in the output). Exit 0 when every check passes, 1 when one fails, 2 when the kernels cannot run or the
checkpoint is bad (the reason is printed in one line)."""

import argparse
import json
import sys

from edge.argtypes import Parser
from edge.errors import BitNestError

LINEARS = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj")   # both group sizes of the default


def check_kernels(checkpoint=None) -> dict:
    from plugins.kernels.selfcheck import run_checks
    if checkpoint is None:
        return run_checks()
    from edge.model.checkpoint import load_checkpoint
    ck = load_checkpoint(checkpoint)
    cfg = ck.config
    return run_checks([(n, *ck.planes(n)) for n in LINEARS], (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
                      str(checkpoint))


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="python -m edge.checks.kernels", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: random RTN-nested weights)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        result = check_kernels(a.checkpoint)
        code = 0 if result["passed"] else 1
    except (ImportError, RuntimeError) as e:
        result, code = {"passed": False, "device": None, "checks": [], "reason": f"cannot run the kernels: {e}"}, 2
    except (BitNestError, ValueError, FileNotFoundError) as e:   # a bad checkpoint: one line, no traceback
        result, code = {"passed": False, "device": None, "checks": [], "reason": str(e)}, 2
    if a.json:
        print(json.dumps(result))
    else:
        for c in result["checks"]:
            print(f"{'ok  ' if c['passed'] else 'FAIL'} {c['name']}: rel err {c['max_rel_err']}")
        if result["reason"]:
            print(f"selfcheck: {result['reason']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
