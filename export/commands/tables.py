"""`bitnest tables` (scripts/results_tables.py): rewrite the docs' result tables from scripts/results/*.json, or
--check them (edge.analysis.report)."""

import argparse
import json
import sys

from edge.analysis.report.tables import ROOT, __doc__ as _TOOL_DOC, update_tables
from edge.argtypes import Parser
from edge.errors import BitNestError


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="results_tables.py", description=_TOOL_DOC,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every table that differs "
                                                         "from its JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        result = update_tables(ROOT, check=a.check)
    except BitNestError as e:
        print(f"results_tables.py: error: {e}", file=sys.stderr)
        return 2
    if a.check and result["stale"]:
        print(f"results_tables.py: tables differ from scripts/results: {', '.join(result['stale'])} "
              "(run `bitnest tables` to rewrite them)", file=sys.stderr)
    if a.json:
        print(json.dumps(result))
    elif not a.check:
        print(f"{len(result['tables'])} tables, rewritten: {', '.join(result['written']) or 'none'}")
    return 1 if a.check and result["stale"] else 0
