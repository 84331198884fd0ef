"""`bitnest compare` (scripts/compare_policies.py): every policy live on the same prompts, paired tests
(edge.analysis.compare)."""

import argparse

from edge.analysis.compare import CompareOptions, compare
from edge.argtypes import count, gamma, seed
from edge.errors import BitNestError
from export.commands import default_checkpoint


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    from edge.options.groups import add_policy_arguments, tool_parser
    p = tool_parser("compare_policies.py", __doc__)
    p.add_argument("--prompts", type=count(), default=24, help="held-out ShareGPT requests")
    p.add_argument("--max-new-tokens", type=count(), default=24)
    p.add_argument("--match-tokens", type=count(), default=8, help="K of the exact-match outcome")
    p.add_argument("--phase-prompts", type=count(0), default=12, help="prompts of the phase set (0: skip it)")
    p.add_argument("--phase-tokens", type=count(), default=48, help="new tokens per phase prompt")
    p.add_argument("--gamma", type=gamma(), default=4)
    p.add_argument("--resamples", type=count(), default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=seed(), default=0, help="bootstrap and gate-random seed")
    p.add_argument("--speculation-sweep", action="store_true", help="only compare adaptive with fixed gamma")
    add_policy_arguments(p)
    return p


def main(argv=None) -> int:
    from edge.options.run import run_cli
    from edge.options.groups import (
        adaptive_config,
        checkpoint_arg,
    )
    a = parser().parse_args(argv)

    def body():
        ckpt = checkpoint_arg(a, default_checkpoint)
        if a.gate_threshold is not None:
            raise BitNestError("compare_policies.py uses the calibrated thresholds: pass --gate-rate, not --gate-threshold")
        return compare(CompareOptions(ckpt, a.backend, a.prompts, a.max_new_tokens, a.match_tokens, a.phase_prompts,
                                      a.phase_tokens, a.gate_rate, a.gamma, adaptive_config(a), a.resamples, a.seed,
                                      a.speculation_sweep, a.phase_tag, a.draft_head, a.shortlist_k,
                                      a.draft_vocab))
    return run_cli(body, a.json, "compare_policies.py")
