"""Export every nesting construction of a model (the default model unless --model), evaluate each, and rewrite the
quality table.

    python scripts/quality_table.py [--model default|HF_FOLDER|FILE.gguf] [--work DIR] [--tokens N] [--only NAME ...]
                                    [--table-only] [--results FILE] [--json]

Exports land in --work (reused when an export of the same model with the same options is already there), raw results
in --results (default scripts/results/quality.json, in the order of CONFIGS, written atomically). Where the results
are the repository's own, the table between the docs' `table:quality` markers is rendered again from them (by
edge.analysis.report.tables, as `bitnest tables` does); other results files leave the docs alone.
"""

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from edge.analysis.evaluate import EvalOptions, evaluate
from edge.analysis.report.tables import DEFAULT_ROW, update_tables
from edge.atomic import write_atomic
from edge.model.manifest import is_checkpoint_dir, read_manifest
from export.pipeline import ExportOptions, run_export
from export.quantize import QuantOptions
from export.sources import float_reference
from export.rotation.learned import LearnOptions

@dataclass(frozen=True)
class Row:
    """One row of the table: how it is exported, and the draft head it is evaluated with (rows that differ only in
    the draft head share one export: the setting changes what the draft reads, not the weights)."""

    rotation: str
    quant: QuantOptions
    learn: LearnOptions = LearnOptions()
    draft_head: str | None = None          # None: a float16 head
    shortlist_k: int | None = None

    @property
    def export_key(self) -> tuple:
        return self.rotation, self.quant, self.learn


F16 = dict(quantize_head=False)            # the float16 head of every row measured before issue 21
LEARNED_12 = LearnOptions(steps=12, samples=13)
NESTED = QuantOptions("bitnest", "closed", base_trust=0.1, quantize_head=True)
CONFIGS = {
    "bitnest closed, trust 0.1": Row("none", QuantOptions("bitnest", "closed", base_trust=0.1, **F16)),
    "bitnest gptq, trust 0.15": Row("none", QuantOptions("bitnest", "gptq", base_trust=0.15, **F16)),
    "bitnest closed, no trust": Row("none", QuantOptions("bitnest", "closed", base_trust=None, **F16)),
    "bitnest gptq, no trust": Row("none", QuantOptions("bitnest", "gptq", base_trust=None, **F16)),
    "rtn": Row("none", QuantOptions("rtn", **F16)),
    "top4of8": Row("none", QuantOptions("top4of8", **F16)),
    "bitnest closed, trust 0.1 + rot, float16 head": Row("r1r2r4", QuantOptions("bitnest", "closed", base_trust=0.1,
                                                                                 **F16)),
    "bitnest gptq, trust 0.15 + rot": Row("r1r2r4", QuantOptions("bitnest", "gptq", base_trust=0.15, **F16)),
    "rtn + rot": Row("r1r2r4", QuantOptions("rtn", **F16)),
    "top4of8 + rot": Row("r1r2r4", QuantOptions("top4of8", **F16)),
    "bitnest closed, trust 0.1 + learned rot (12 steps)": Row("learned", QuantOptions("bitnest", "closed",
                                                                                      base_trust=0.1, **F16),
                                                              LEARNED_12),
    "bitnest closed, trust 0.1 + rot + nested head, draft head 4bit": Row("r1r2r4", NESTED, draft_head="4bit"),
    DEFAULT_ROW: Row("r1r2r4", NESTED, draft_head="8bit"),
    "bitnest closed, trust 0.1 + rot + nested head, draft head shortlist 32": Row("r1r2r4", NESTED,
                                                                                  draft_head="shortlist",
                                                                                  shortlist_k=32),
    "bitnest closed, trust 0.1 + rot + nested head, draft head shortlist 64": Row("r1r2r4", NESTED,
                                                                                  draft_head="shortlist",
                                                                                  shortlist_k=64),
}
RESULTS = ROOT / "scripts" / "results" / "quality.json"


def _folder(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in name)


def _learned_matches(record: dict, learn: LearnOptions) -> bool:
    got = record.get("learning", {})
    return all(got.get(k) == v for k, v in asdict(learn).items())


def _export(name: str, work: Path, model: str) -> Path:
    row = CONFIGS[name]
    rotation, quant, learn = row.export_key
    first = next(n for n, r in CONFIGS.items() if r.export_key == row.export_key)   # rows sharing the export
    out = work / _folder(first)
    if is_checkpoint_dir(out):
        m = read_manifest(out)
        if m.get("quant") == json.loads(json.dumps(quant.__dict__)) and m["rotation"]["kind"] == rotation and \
                m.get("source", {}).get("model", "default") == model and \
                (rotation != "learned" or _learned_matches(m["rotation"], learn)):
            return out
    summary = run_export(ExportOptions(out=str(out), model=model, rotation=rotation, quant=quant, learn=learn))
    print(json.dumps({"exported": name, **summary}), file=sys.stderr)
    return out


def _ordered(results: dict) -> dict:
    """The reference first, then the configurations in the order of CONFIGS (the table's row order)."""
    first = ["_reference"] + list(CONFIGS)
    return {k: results[k] for k in first + [k for k in results if k not in first] if k in results}


def run(a) -> dict:
    work, results_file = Path(a.work), Path(a.results)
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    for name in [] if a.table_only else (a.only or CONFIGS):
        if name not in CONFIGS:
            raise ValueError(f"unknown config {name!r}: choose from {', '.join(CONFIGS)}")
        ck = _export(name, work, a.model)
        ref = results.get("_reference", {})
        have_ref = ref.get("tokens") == a.tokens
        row = CONFIGS[name]
        ev = evaluate(EvalOptions(str(ck), tokens=a.tokens, with_reference=not have_ref, draft_head=row.draft_head,
                                  shortlist_k=row.shortlist_k, reference_loader=float_reference))
        if have_ref:   # the float reference does not depend on the export: evaluated once
            ev["ppl"]["reference"] = ref["ppl"]
        else:
            results["_reference"] = {"tokens": a.tokens, "ppl": ev["ppl"]["reference"]}
        results[name] = {"rotation": row.rotation, "eval": ev}
        results = _ordered(results)
        results_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(json.dumps(results, indent=1).encode(), results_file)
        print(json.dumps({"evaluated": name, "ppl": ev["ppl"], "agreement": ev["agreement"]}), file=sys.stderr)
    own = results_file.resolve() == RESULTS.resolve()
    tables = update_tables(ROOT, only=("quality",))["written"] if own else []
    return {"results": str(results_file), "configs": [k for k in _ordered(results) if k in CONFIGS],
            "tokens": a.tokens, "tables_written": tables}
