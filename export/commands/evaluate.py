"""`bitnest evaluate` (scripts/evaluate.py): perplexity and draft / target agreement on held-out text
(edge.analysis.evaluate), with the float reference loaded by the host's source readers (export.sources)."""

import argparse

from edge.analysis.evaluate import EvalOptions, __doc__ as _TOOL_DOC, evaluate
from edge.argtypes import Parser, count
from edge.backends import BACKENDS
from edge.options.run import run_cli
from edge.options.groups import add_draft_head_arguments
from edge.corpora import CORPORA


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="bitnest-evaluate", description=_TOOL_DOC)
    p.add_argument("--checkpoint", required=True, help="nested checkpoint folder")
    p.add_argument("--corpus", action="append", help=f"{'|'.join(CORPORA)}|FILE (repeatable; default: all three)")
    p.add_argument("--tokens", type=count(2), default=8192, help="evaluation tokens per corpus")
    p.add_argument("--window", type=count(2), default=1024, help="tokens per non-overlapping window")
    p.add_argument("--act", choices=("float", "int8"), default="float", help="activations of the torch backend's views")
    p.add_argument("--backend", choices=BACKENDS, default="torch", help="backend that runs the nested views")
    p.add_argument("--reference", help="the float reference: default, a preset, a .gguf file or an HF folder "
                   "(default: the model the checkpoint was exported from)")
    add_draft_head_arguments(p, vocab=False)
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def float_reference(spec):
    """The float model a checkpoint was exported from, through the host's source readers (export.sources)."""
    from export.sources import float_reference as load
    return load(spec)


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    opts = lambda: EvalOptions(a.checkpoint, tuple(a.corpus or CORPORA), a.tokens, a.window, a.act == "int8",
                               a.reference, backend=a.backend, draft_head=a.draft_head, shortlist_k=a.shortlist_k,
                               reference_loader=float_reference)
    return run_cli(lambda: evaluate(opts()), a.json, "bitnest-evaluate")
