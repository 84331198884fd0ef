"""Export every nesting construction of the default model, evaluate each, and rewrite the quality table.

    python scripts/quality_table.py [--work DIR] [--tokens N] [--only NAME ...] [--table-only] [--json]

Exports land in --work (reused when an export with the same options is already there), raw results in
scripts/results/quality.json (in the order of CONFIGS), and the table between the docs' `table:quality` markers
(rendered by edge.analysis.report, as `bitnest tables` does).
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from edge.analysis.evaluate import EvalOptions, evaluate
from edge.analysis.report import update_tables
from edge.atomic import write_atomic
from edge.cli.common import run_cli
from edge.model.checkpoint import is_checkpoint_dir, read_manifest
from export.pipeline import ExportOptions, run_export
from export.quantize import QuantOptions

# name -> (rotation, QuantOptions)
CONFIGS = {
    "bitnest closed, trust 0.1": ("none", QuantOptions("bitnest", "closed", base_trust=0.1)),
    "bitnest gptq, trust 0.15": ("none", QuantOptions("bitnest", "gptq", base_trust=0.15)),
    "bitnest closed, no trust": ("none", QuantOptions("bitnest", "closed", base_trust=None)),
    "bitnest gptq, no trust": ("none", QuantOptions("bitnest", "gptq", base_trust=None)),
    "rtn": ("none", QuantOptions("rtn")),
    "top4of8": ("none", QuantOptions("top4of8")),
    "bitnest closed, trust 0.1 + rot (default)": ("r1r2r4", QuantOptions("bitnest", "closed", base_trust=0.1)),
    "bitnest gptq, trust 0.15 + rot": ("r1r2r4", QuantOptions("bitnest", "gptq", base_trust=0.15)),
    "rtn + rot": ("r1r2r4", QuantOptions("rtn")),
    "top4of8 + rot": ("r1r2r4", QuantOptions("top4of8")),
}
RESULTS = ROOT / "scripts" / "results" / "quality.json"


def _folder(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in name)


def _export(name: str, work: Path) -> Path:
    rotation, quant = CONFIGS[name]
    out = work / _folder(name)
    if is_checkpoint_dir(out):
        m = read_manifest(out)
        if m.get("quant") == json.loads(json.dumps(quant.__dict__)) and m["rotation"]["kind"] == rotation:
            return out
    summary = run_export(ExportOptions(out=str(out), rotation=rotation, quant=quant))
    print(json.dumps({"exported": name, **summary}), file=sys.stderr)
    return out


def _ordered(results: dict) -> dict:
    """The reference first, then the configurations in the order of CONFIGS (the table's row order)."""
    first = ["_reference"] + list(CONFIGS)
    return {k: results[k] for k in first + [k for k in results if k not in first] if k in results}


def run(a) -> dict:
    work = Path(a.work)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    for name in [] if a.table_only else (a.only or CONFIGS):
        if name not in CONFIGS:
            raise ValueError(f"unknown config {name!r}: choose from {', '.join(CONFIGS)}")
        ck = _export(name, work)
        ref = results.get("_reference", {})
        have_ref = ref.get("tokens") == a.tokens
        ev = evaluate(EvalOptions(str(ck), tokens=a.tokens, with_reference=not have_ref))
        if have_ref:   # the float reference does not depend on the export: evaluated once
            ev["ppl"]["reference"] = ref["ppl"]
        else:
            results["_reference"] = {"tokens": a.tokens, "ppl": ev["ppl"]["reference"]}
        results[name] = {"rotation": CONFIGS[name][0], "eval": ev}
        results = _ordered(results)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(json.dumps(results, indent=1).encode(), RESULTS)
        print(json.dumps({"evaluated": name, "ppl": ev["ppl"], "agreement": ev["agreement"]}), file=sys.stderr)
    update_tables(ROOT, only=("quality",))
    return {"results": str(RESULTS), "configs": [k for k in _ordered(results) if k in CONFIGS], "tokens": a.tokens}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=str(ROOT / "checkpoints" / "table"), help="folder for the exports")
    p.add_argument("--tokens", type=int, default=4096, help="evaluation tokens per corpus")
    p.add_argument("--only", nargs="*", help="config names to (re)run")
    p.add_argument("--table-only", action="store_true", help="only rewrite the quality table from the saved results")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    return run_cli(lambda: run(a), a.json, "quality_table")
