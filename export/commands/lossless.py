"""`bitnest lossless` (scripts/lossless.py): speculative output against the target's on real prompts
(edge.analysis.lossless)."""

import argparse

from edge.analysis.lossless import __doc__ as _TOOL_DOC, lossless
from edge.argtypes import Parser, count, gamma
from edge.backends import BACKENDS
from edge.options.run import run_cli
from edge.options.groups import add_draft_head_arguments, add_model_argument, checkpoint_arg
from export.commands import default_checkpoint


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(description=_TOOL_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint")
    add_model_argument(p)
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--prompts", type=count(), default=20, help="ShareGPT requests and Shakespeare passages, half each")
    p.add_argument("--code-prompts", type=count(0), default=0, help="coding requests (held-out ShareGPT) besides them")
    p.add_argument("--max-new-tokens", type=count(), default=128)
    p.add_argument("--gamma", type=gamma(), default=4)
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="check fixed-γ speculation only (default: adaptive speculation too)")
    p.add_argument("--reference", default="none", choices=("none",) + BACKENDS,
                   help="also compare the target view with this backend's, teacher-forced on the outputs (torch: the "
                        "reference semantics)")
    add_draft_head_arguments(p)
    p.add_argument("--json", action="store_true")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    return run_cli(lambda: lossless(a, checkpoint_arg(a, default_checkpoint)), a.json, "lossless.py")
