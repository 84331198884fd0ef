"""`bitnest calibrate` (scripts/calibrate_gates.py): calibrate the gate thresholds of one backend and save them beside
the checkpoint (edge.analysis.calibrate)."""

import argparse

from edge.analysis.calibrate import calibrate
from edge.argtypes import count
from edge.options.run import run_cli
from edge.options.groups import checkpoint_arg, draft_head_options, tool_parser
from edge.decode.thresholds import save_thresholds
from export.commands import default_checkpoint


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = tool_parser("calibrate_gates.py", __doc__)
    p.add_argument("--prompts", type=count(), default=12, help="calibration prompts (ShareGPT calibration range)")
    p.add_argument("--max-new-tokens", type=count(), default=64, help="length of each target trajectory")
    return p


def main(argv=None) -> int:
    """`bitnest calibrate` (scripts/calibrate_gates.py): calibrate (again) and save the thresholds of one backend."""
    a = parser().parse_args(argv)

    def body():
        ckpt = checkpoint_arg(a, default_checkpoint)
        from edge.llm import LLM
        rt = LLM(ckpt, policy="target", backend=a.backend, max_context=a.max_new_tokens + 2048, meter="none",
                 **draft_head_options(a))
        entry = calibrate(rt, a.prompts, a.max_new_tokens)
        return dict(entry, file=str(save_thresholds(rt.ckpt, entry)))
    return run_cli(body, a.json, "calibrate_gates.py")
