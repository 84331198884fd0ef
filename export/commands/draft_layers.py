"""`bitnest draft-layers` (scripts/draft_layers.py): what a draft that skips decoder layers would agree and save, and
the speed-up it projects on this machine's pass costs (edge.analysis.draft_layers)."""

import argparse

from edge.analysis.draft_layers import DraftLayerOptions, __doc__ as _TOOL_DOC, draft_layers
from edge.argtypes import Number, Parser, count
from edge.backends import BACKENDS
from edge.corpora import CORPORA
from edge.engine.costs import MAX_GAMMA
from edge.options.groups import add_model_argument, checkpoint_arg
from edge.options.run import run_cli
from export.commands import default_checkpoint


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="bitnest-draft-layers", description=_TOOL_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    add_model_argument(p)
    p.add_argument("--corpus", default="sharegpt", help=f"held-out text: {'|'.join(CORPORA)}|FILE")
    p.add_argument("--tokens", type=count(2), default=1024, help="teacher-forced positions")
    p.add_argument("--most", type=count(), default=6, help="layers skipped at the curve's last point")
    p.add_argument("--backend", choices=BACKENDS, default="native", help="the engine whose pass costs are measured")
    p.add_argument("--gamma-max", type=Number(int, 1, MAX_GAMMA), default=MAX_GAMMA,
                   help="the most proposals a projected round may draft")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    opts = lambda: DraftLayerOptions(checkpoint_arg(a, default_checkpoint), a.corpus, a.tokens, a.most, a.backend,
                                     a.gamma_max)
    return run_cli(lambda: draft_layers(opts()), a.json, "bitnest-draft-layers")
