"""`bitnest quality-table` (scripts/quality_table.py): export the variants and tabulate their perplexity and draft /
target agreement (export.tools.quality)."""

import argparse

from edge.argtypes import Parser, count
from edge.options.run import run_cli
from export.tools.quality import RESULTS, ROOT, __doc__ as _TOOL_DOC, run


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(description=_TOOL_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="`default` (embedded SmolLM2-135M-Instruct), an HF folder or "
                   "a .gguf file, as export")
    p.add_argument("--work", default=str(ROOT / "checkpoints" / "table"), help="folder for the exports")
    p.add_argument("--tokens", type=count(2), default=4096, help="evaluation tokens per corpus")
    p.add_argument("--only", nargs="*", help="config names to (re)run")
    p.add_argument("--table-only", action="store_true", help="only rewrite the quality table from the saved results")
    p.add_argument("--results", default=str(RESULTS), help="raw results JSON (read, then rewritten)")
    p.add_argument("--json", action="store_true")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    return run_cli(lambda: run(a), a.json, "quality_table")
