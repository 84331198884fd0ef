"""`bitnest weights-memory` (scripts/weights_memory.py): resident memory of --weights base against the 8-bit run, each
in a fresh process (edge.analysis.weights_memory)."""

import argparse

from edge.analysis.weights_memory import __doc__ as _TOOL_DOC, compare
from edge.argtypes import Parser, count
from export.commands import default_checkpoint


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="weights_memory.py", description=_TOOL_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    p.add_argument("--backend", default="native", choices=("native", "cpu", "torch"))
    p.add_argument("--prompts", type=count(), default=4, help="ShareGPT prompts answered by each run")
    p.add_argument("--max-new-tokens", type=count(), default=64)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    from edge.options.run import run_cli
    from edge.corpora import sharegpt_prompts

    def go() -> dict:
        ckpt = a.checkpoint or str(default_checkpoint())
        return compare(ckpt, a.backend, sharegpt_prompts(a.prompts), a.max_new_tokens)
    return run_cli(go, True, "weights_memory.py", echo=True)
