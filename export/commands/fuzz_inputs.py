"""`bitnest fuzz-inputs` (scripts/fuzz_inputs.py): mutated inputs at every reader, killed and disk-full exports
(export.tools.fuzz_inputs)."""

import argparse

from edge.argtypes import Parser, count, positive, seed
from export.commands import default_checkpoint
from export.tools.fuzz_inputs import READERS, __doc__ as _TOOL_DOC, run


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="fuzz_inputs.py", description=_TOOL_DOC,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="checkpoint to mutate copies of (default: the embedded SmolLM2 export)")
    p.add_argument("--cases", type=count(), default=500, help="mutated inputs per reader")
    p.add_argument("--seed", type=seed(), default=0)
    p.add_argument("--seconds", type=positive(), default=120.0, help="time limit of one case (past it: a hang)")
    p.add_argument("--readers", default=",".join(READERS), help=f"comma list of {', '.join(READERS)}")
    p.add_argument("--export-model", default="default", help="source model of the killed and disk-full exports")
    p.add_argument("--kills", type=count(0), default=10, help="exports killed mid-write (0: skip the export checks)")
    p.add_argument("--work", help="working folder (kept; default: a temporary one, removed)")
    p.add_argument("--json", action="store_true")
    return p


def main(argv=None) -> int:
    from edge.options.run import run_cli
    from edge.options.groups import checkpoint_arg
    a = parser().parse_args(argv)

    def body():
        a.checkpoint = checkpoint_arg(a, default_checkpoint)
        return run(a)
    return run_cli(body, a.json, "fuzz_inputs.py")
