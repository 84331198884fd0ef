"""Export every nesting construction of the default model, evaluate each, and write the README table.

    python scripts/quality_table.py [--work DIR] [--tokens N] [--only NAME ...] [--table-only] [--json]

Exports land in --work (reused when an export with the same options is already there), raw results in
scripts/results/quality.json, and the markdown table between the README's quality-table markers.
"""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from edge.analysis.evaluate import EvalOptions, evaluate
from edge.cli.common import run_cli
from edge.model.checkpoint import is_checkpoint_dir, read_manifest
from export.pipeline import ExportOptions, run_export
from export.quantize import QuantOptions
from export.rotation import LearnOptions

# name -> (rotation, QuantOptions[, LearnOptions of a learned rotation])
LEARNED_12 = LearnOptions(steps=12, samples=13)
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
    "bitnest closed, trust 0.1 + learned rot (12 steps)": ("learned", QuantOptions("bitnest", "closed", base_trust=0.1),
                                                           LEARNED_12),
    "bitnest closed, trust 0.1 + rot + nested head": ("r1r2r4", QuantOptions("bitnest", "closed", base_trust=0.1,
                                                                           quantize_head=True)),
}
RESULTS = ROOT / "scripts" / "results" / "quality.json"
START, END = "<!-- quality-table:start -->", "<!-- quality-table:end -->"


def _folder(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in name)


def _learned_matches(record: dict, learn: LearnOptions) -> bool:
    got = record.get("learning", {})
    return all(got.get(k) == v for k, v in asdict(learn).items())


def _export(name: str, work: Path) -> Path:
    rotation, quant, learn = (CONFIGS[name] + (LearnOptions(),))[:3]
    out = work / _folder(name)
    if is_checkpoint_dir(out):
        m = read_manifest(out)
        if m.get("quant") == json.loads(json.dumps(quant.__dict__)) and m["rotation"]["kind"] == rotation and \
                (rotation != "learned" or _learned_matches(m["rotation"], learn)):
            return out
    summary = run_export(ExportOptions(out=str(out), rotation=rotation, quant=quant, learn=learn))
    print(json.dumps({"exported": name, **summary}), file=sys.stderr)
    return out


def table(results: dict) -> str:
    corpora = ("sharegpt", "shakespeare", "code")
    head = ["config", "rotation"] + [f"{c} ppl ref / draft / target" for c in corpora] + \
           [f"{c} agree" for c in corpora]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        e = r["eval"]
        cells = [name, r["rotation"]]
        for c in corpora:
            p = e["ppl"]
            cells.append(f"{p['reference'][c]:.2f} / {p['draft'][c]:.2f} / {p['target'][c]:.2f} "
                         f"({100 * (p['target'][c] / p['reference'][c] - 1):+.1f}%)")
        cells += [f"{100 * e['agreement'][c]:.1f}%" for c in corpora]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_readme(text: str) -> None:
    readme = ROOT / "README.md"
    s = readme.read_text()
    if START in s and END in s:
        s = s[: s.index(START) + len(START)] + "\n" + text + "\n" + s[s.index(END):]
        readme.write_text(s)


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
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1))
        print(json.dumps({"evaluated": name, "ppl": ev["ppl"], "agreement": ev["agreement"]}), file=sys.stderr)
    ordered = {k: results[k] for k in CONFIGS if k in results}
    write_readme(table(ordered))
    return {"results": str(RESULTS), "configs": list(ordered), "tokens": a.tokens}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=str(ROOT / "checkpoints" / "table"), help="folder for the exports")
    p.add_argument("--tokens", type=int, default=4096, help="evaluation tokens per corpus")
    p.add_argument("--only", nargs="*", help="config names to (re)run")
    p.add_argument("--table-only", action="store_true", help="only rewrite the README table from the saved results")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    return run_cli(lambda: run(a), a.json, "quality_table")
