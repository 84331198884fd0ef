"""`bitnest replay` (scripts/replay.py): Precision on Demand replay along the target's greedy trajectories: AUCs,
budgets, the cost model, figures (edge.analysis.replay)."""

import argparse

from edge.analysis.replay.analyse import ReplayOptions, replay
from edge.argtypes import count, seed
from export.commands import default_checkpoint


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    from edge.options.groups import tool_parser
    p = tool_parser("replay.py", __doc__)
    p.add_argument("--prompts-file", help='JSONL, one {"prompt": str, "chat": bool} per line (as chat.py)')
    p.add_argument("--prompts", type=count(), default=12, help="held-out ShareGPT requests without a prompts file")
    p.add_argument("--max-new-tokens", type=count(), default=96, help="length of each target trajectory")
    p.add_argument("--resamples", type=count(), default=1000, help="bootstrap resamples of prompts")
    p.add_argument("--seed", type=seed(), default=0, help="bootstrap seed")
    p.add_argument("--plots", help="write PNG figures (paper figures 10-13) into this folder")
    return p


def main(argv=None) -> int:
    from edge.options.run import run_cli
    from edge.options.groups import checkpoint_arg
    a = parser().parse_args(argv)

    def body():
        ckpt = checkpoint_arg(a, default_checkpoint)
        return replay(ReplayOptions(ckpt, a.backend, a.prompts_file, a.prompts, a.max_new_tokens, a.resamples,
                                    a.seed, a.plots, a.draft_head, a.shortlist_k,
                                    a.draft_vocab))
    return run_cli(body, a.json, "replay.py")
