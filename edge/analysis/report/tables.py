"""The result tables of README.md and docs/*.md, rendered from scripts/results/*.json so that they cannot drift
from the data: every table sits between `<!-- table:NAME -->` and `<!-- /table:NAME -->`, `update_tables` rewrites
the text between the markers (atomically) and, with `check`, only names the tables whose text differs.

    bitnest tables [--check] [--json]        (python scripts/results_tables.py)

NAME is a fixed table (`headline`, `quality`, `bench`, `bench-ratios`, `bench-passes`, `sm87-kernels`, `device-check`,
`device-bandwidth`, `verify-local`, `replay-exports`) or KIND-STEM for one results file: `replay-STEM`
(replay-STEM.json), `compare-STEM`, `compare-phase-STEM`, `history-STEM`, `history-phase-STEM` (compare-STEM.json),
`sweep-STEM` (sweep-STEM.json), `max-context-STEM` (max_context_STEM.json), `lossless-STEM`, `bench-STEM`
(bench-STEM.json: `bench --shape STEM`). The bench tables are edge.analysis.report.bench's.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edge.analysis.report.bench import (
    bench_passes,
    bench_ratios,
    bench_table,
    headline_bench_row,
    headline_model_row,
    headline_shape_row,
    isa_paths_table,
    shape_block,
)
from edge.analysis.report.cells import mb as _mb
from edge.analysis.report.cells import mib as _mib
from edge.analysis.report.cells import pct as _pct
from edge.analysis.report.cells import table as _table
from edge.analysis.report.shapes import SHAPE_TABLES
from edge.analysis.report.device import table as device_check_table
from edge.analysis.report.device import bandwidth_table
from edge.atomic import write_atomic
from edge.errors import BitNestError

ROOT = Path(__file__).resolve().parents[3]
RESULTS = Path("scripts") / "results"
DOC_FILES = ("README.md", "docs/*.md")
# Markers stand alone on their lines (a marker quoted inside prose is not one).
MARKER = re.compile(r"^<!-- table:(?P<name>[\w.-]+) -->\n(?P<body>.*?)^<!-- /table:(?P=name) -->$", re.S | re.M)
OPEN = re.compile(r"^<!-- (/?)table:([\w.-]+) -->$", re.M)


# -- cells ------------------------------------------------------------------------------------------------------
def _pts(d: dict) -> str:
    """A paired difference in points with its 95% interval: +66.7 (+45.8 to +83.3)."""
    return f"{100 * d['value']:+.1f} ({100 * d['low']:+.1f} to {100 * d['high']:+.1f})"


def _mcnemar(m: dict) -> str:
    return f"{m['a_only']}/{m['b_only']}, p={m['p']:.3f}"


def _ci(d: dict, sep: str = " to ") -> str:
    return f"{d['value']:.3f} ({d['low']:.3f}{sep}{d['high']:.3f})"


# -- quality (export.tools.quality writes quality.json) -----------------------------------------------------------------
CORPORA = ("sharegpt", "shakespeare", "code")
DEFAULT_ROW = "bitnest closed, trust 0.1 + rot + nested head, draft head 8bit (default)"  # the default export


def quality_table(results: dict) -> str:
    """Perplexity (reference / draft / target, the target's distance from the reference) and teacher-forced
    draft/target agreement per corpus, one row per export configuration in the file's order."""
    head = ["config", "rotation"] + [f"{c} ppl ref / draft / target" for c in CORPORA] + \
           [f"{c} agree" for c in CORPORA]
    rows = []
    for name, r in results.items():
        if name.startswith("_"):
            continue
        e, cells = r["eval"], [name, r["rotation"]]
        for c in CORPORA:
            p = e["ppl"]
            cells.append(f"{p['reference'][c]:.2f} / {p['draft'][c]:.2f} / {p['target'][c]:.2f} "
                         f"({100 * (p['target'][c] / p['reference'][c] - 1):+.1f}%)")
        cells += [_pct(e["agreement"][c]) for c in CORPORA]
        rows.append(cells)
    return _table(head, rows)


# -- kernels (compile_kernels --json) ---------------------------------------------------------------------------
def _verdict(k: dict) -> str:
    """A compiled variant's budget verdict; one the build does not hold to its budget says so."""
    met = "met" if k["budget_failures"] == [] else "missed"
    return met if k.get("held", True) else f"{met} (reported, not held)"


def sm87_table(d: dict) -> str:
    """Per kernel variant: resources, instructions, 128-bit loads; the GEMVs', prefill GEMMs' and attention's proxy and
    budget verdict (a variant the build does not hold to its budget says so)."""
    head = ["kernel variant", "registers", "shared bytes", "spill bytes", "IMMA", "HMMA", "DP4A", "128-bit loads",
            "instructions / plane byte", "budget"]
    kv = ("KV4 {instructions_per_kv4_byte}, KV8 {instructions_per_kv8_byte} "
          "(edge steps {instructions_per_kv4_byte_edge}, {instructions_per_kv8_byte_edge})")
    return _table(head, [[f"`{k['kernel']}`", *(str(k[c]) for c in ("registers", "shared_bytes", "spill_store_bytes",
                          "imma", "hmma", "idp4a", "ldg128")), kv.format(**k) if "instructions_per_kv8_byte" in k
                          else str(k.get("instructions_per_weight_byte", "")),
                          _verdict(k) if "budget_failures" in k else ""]
                         for k in d["kernels"]])


# -- memory (max_context --json, with or without --verify) ------------------------------------------------------
def max_context_table(d: dict) -> str:
    """Per configuration: weights, KV per position, workspace (+ draft scratch) and the largest context; the two
    bitnest variants share a row when they store the same bytes."""
    cfgs = dict(d["configs"])
    a, b = cfgs.get("bitnest"), cfgs.pop("bitnest-kv8-draft", None)
    if b is not None and a is not None and a["max_context"] == b["max_context"]:
        cfgs["bitnest (KV4 or KV8 drafting)"] = cfgs.pop("bitnest")
    elif b is not None:
        cfgs["bitnest-kv8-draft"] = b
    if "bitnest-elastic" in cfgs:       # last, after the rows it is compared with
        cfgs["bitnest-elastic"] = cfgs.pop("bitnest-elastic")
    rows = []
    for name, c in cfgs.items():
        ws = _mib(c["workspace_bytes"]) + (f" (+ {_mib(c['scratch_bytes'])} scratch)" if c["scratch_bytes"] else "")
        kv = f"{c['kv_bytes_per_position']:,} B" + (f" (KV4; + {_mib(c['ring_bytes'])} ring of {c['ring_slots']:,} "
                                                     f"slots)" if c.get("ring_slots") else "")
        memory = c.get("memory_max_context", c["max_context"])
        cap = f" (model's positions; memory alone: {memory:,})" if memory > c["max_context"] else ""
        rows.append([name, _mib(c["weight_bytes"]), kv, ws, f"**{c['max_context']:,}**{cap}"])
    return _table(["config", "weights", "KV / position", "workspace", "max context"], rows)


def verify_table(*runs: dict) -> str:
    """`max_context --verify`: the planned bytes of the bitnest configuration against the bytes measured."""
    head = ["model", "positions", "weights", "KV", "scratch", "workspace", "planned", "measured", "ratio",
            "resident-size peak delta", "ratio"]
    rows = []
    for d in runs:
        v, p = d["verify"], d["verify"]["planned"]
        rows.append([d["model"], f"{v['context']:,}", f"{p['weights']:,} B", f"{p['kv']:,} B", f"{p['scratch']:,} B",
                     f"{max(p['workspace'].values()):,} B", f"**{v['planned_bytes']:,} B**",
                     f"**{v['measured_bytes']:,} B**", f"{v['ratio']}", f"{v['rss_peak_delta_bytes']:,} B",
                     f"{v['rss_ratio']}"])
    return _table(head, rows)


# -- Precision on Demand: replay (replay --json) ----------------------------------------------------------------
BUDGET_ORDERS = ("entropy", "margin", "lagged_entropy", "oracle", "random")


def _with_ci(g: dict) -> str:
    ci = g.get("recall_ci")
    return _pct(g["recall"], 0) + (f" ({_pct(ci[0], 0)}–{_pct(ci[1], 0)})" if ci else "")


def replay_block(d: dict) -> str:
    """One replay: its summary line, AUCs, budgets, speculation replay, cost model and calibrated gates."""
    out = [f"{d['method']} ({d['rotation']}): {d['prompts']} prompts, {d['steps']} steps, flip rate "
           f"{_pct(d['flip_rate'])}, mean KL {d['mean_kl']:.4f} nats", ""]
    out += [_table(["signal", "AUC for flips (95% CI over prompts)", "AUC for top-10% KL"],
                   [[s, _ci(a), f"{a['kl_top10']:.3f}"] for s, a in d["auc"].items()]), ""]
    rows = []
    for budget, b in d["budgets"].items():
        recall = " / ".join(_with_ci(b[o]) if o in ("entropy", "margin") else _pct(b[o]["recall"], 0)
                            for o in BUDGET_ORDERS)
        kl = " / ".join(_pct(b[o]["kl_removed"], 0) for o in BUDGET_ORDERS)
        rows.append([f"{float(budget):.0%}", recall, kl,
                     f"{b['bytes_vs_high']['gate']:.3f} / {b['bytes_vs_high']['lagged']:.3f}"])
    out += [_table(["budget", "recall of flips: entropy / margin / lagged entropy / oracle / random",
                    "KL removed: entropy / margin / lagged entropy / oracle / random",
                    "bytes vs all-high: gate / lagged"], rows), ""]
    out += [_table(["k", "rounds", "mean accepted", "tokens / round", "acceptance", "bytes vs all-high"],
                   [[k[1:], str(s["rounds"]), f"{s['mean_accepted']:.2f}", f"{s['tokens_per_round']:.2f}",
                     _pct(s["acceptance"]), f"{s['bytes_vs_high']:.3f}"] for k, s in d["speculation"].items()]), ""]
    c = d["cost_model"]
    head = f"head {_mb(c['head_high'])} (every pass)" if c["head_high"] == c["head_low"] else \
        f"head high {_mb(c['head_high'])}, low {_mb(c['head_low'])}"
    out.append(f"Cost model (MB per pass): blocks high {_mb(c['blocks_high'])}, blocks low {_mb(c['blocks_low'])}, "
               f"{head}; whole pass high {_mb(c['high_pass'])}, low {_mb(c['low_pass'])}; low/high "
               f"{c['low_share_of_high']:.3f} (blocks alone {c['blocks_low_share']:.3f}); head is "
               f"{_pct(c['head_share_of_high'], 0)} of a high pass, {_pct(c['head_share_of_low'], 0)} of a low pass.")
    out.append("Head what-if (bytes vs all-high with the same head): " + "; ".join(
        f"{h}: all-low {w['all_low']:.3f}, gate@15% {w['gate@0.15']:.3f}, lagged@15% {w['lagged@0.15']:.3f}, "
        f"spec k4 {w['speculation_k4']:.3f}" for h, w in c["head_what_if"].items()))
    if d.get("calibrated"):
        out += ["", _table(["calibrated gate", "threshold", "replay rate", "recall of flips", "lift", "KL removed",
                            "bytes vs all-high"],
                           [[g, f"{r['threshold']:.3f}", _pct(r["rate"]), _pct(r["recall"], 0), f"{r['lift']:.1f}x",
                             _pct(r["kl_removed"], 0), f"{r['bytes_vs_high']:.3f}"]
                            for g, r in d["calibrated"].items()])]
    return "\n".join(out)


EXPORT_ABOUT = {"bitnest": "GPTQ-trust base, closed refinement", "top4of8": "RTN top-4-of-8, asymmetric",
                "rtn": "RTN base and refinement"}


def replay_exports_table(*runs: dict) -> str:
    """One row per export's replay on the same prompts."""
    rows = []
    for d in runs:
        rot = "no rotation" if d["rotation"] == "none" else d["rotation"]
        about = EXPORT_ABOUT.get(d["method"])
        rows.append([f"{d['method']} ({about + ', ' if about else ''}{rot})", _pct(d["flip_rate"]),
                     f"{d['mean_kl']:.3f}", _ci(d["auc"]["entropy"], "–"), _ci(d["auc"]["margin"], "–"),
                     _pct(d["budgets"]["0.15"]["margin"]["recall"], 0), _pct(d["speculation"]["k4"]["acceptance"]),
                     f"{d['speculation']['k4']['bytes_vs_high']:.3f}"])
    return _table(["export", "flip rate", "mean KL (nats)", "AUC entropy (95% CI)", "AUC margin (95% CI)",
                   "margin recall of flips at 15%", "acceptance k = 4", "bytes vs all-high k = 4"], rows)


# -- Precision on Demand: live comparison and speculation sweep (compare --json) -------------------------------
def _policy_rows(policies: dict) -> list[list[str]]:
    rows = []
    for name, p in policies.items():
        cells = [name, _pct(p["match"], 0), _pct(p["prefix_share"], 0), _pct(p["escalation_rate"]),
                 _mb(p["weight_bytes_per_token"]), f"{p['kv_bytes_per_token'] / 1e6:.2f}", f"{p['tok_s']:g}"]
        t, dr = p.get("vs_target"), p.get("vs_draft")
        cells += [_pts(t["match_diff"]), _mcnemar(t["mcnemar"])] if t else ["", ""]
        cells += [_pts(dr["match_diff"]), _mcnemar(dr["mcnemar"]), _pts(dr["prefix_diff"])] if dr else ["", "", ""]
        rows.append(cells)
    return rows


POLICY_HEAD = ["policy", "match@K", "prefix share", "escalated", "weight MB / token", "KV MB / token", "tok/s",
               "match diff vs target (pts)", "McNemar vs target", "match diff vs draft (pts)", "McNemar vs draft",
               "prefix diff vs draft (pts)"]


def compare_table(d: dict) -> str:
    return _table(POLICY_HEAD, _policy_rows(d["policies"]))


def compare_phase_table(d: dict) -> str:
    return _table(POLICY_HEAD, _policy_rows(d["phase"]["policies"]))


def _history(policies: dict) -> str:
    """Per gate, how often its low and its escalated steps leave the target's greedy choice on its own history."""
    return _table(["gate", "escalated", "low steps", "of them leaving the target's choice", "escalated steps",
                   "of them leaving the target's choice"],
                  [[n, _pct(p["escalation_rate"]), str(h["low_steps"]), _pct(h["low_departures"]),
                    str(h["escalated_steps"]), _pct(h["escalated_departures"])]
                   for n, p in policies.items() if (h := p.get("own_history"))])


def history_table(d: dict) -> str:
    return _history(d["policies"])


def history_phase_table(d: dict) -> str:
    return _history(d["phase"]["policies"])


def _sweep_label(name: str, adaptive: dict) -> str:
    m = re.fullmatch(r"fixed-g(\d+)", name)
    if m:
        return f"fixed γ = {m.group(1)}"
    m = re.fullmatch(r"adaptive-g(\d+)-stop(?:-extend(\d+))?", name)
    if not m:
        return name
    margin = adaptive["signal"] == "margin"
    stop = f"{adaptive['signal']} {'<' if margin else '>'} {adaptive['stop']}"
    if m.group(2) is None:
        return f"adaptive γ = {m.group(1)}, early stop ({stop})"
    return (f"adaptive γ = {m.group(1)}, early stop + extend to {m.group(2)} "
            f"({adaptive['signal']} {'≥' if margin else '≤'} {adaptive['extend']})")


def sweep_table(d: dict) -> str:
    """Fixed γ against adaptive speculation on the same prompts, each output checked against the target's."""
    rows = []
    for name, s in d["speculation_sweep"].items():
        rows.append([_sweep_label(name, d["adaptive"]), _pct(s["acceptance"]),
                     "" if s["tokens_per_round"] is None else f"{s['tokens_per_round']:.2f}",
                     f"{s['drafted'] / s['rounds']:.2f}" if s["rounds"] else "", _mb(s["weight_bytes_per_token"]),
                     f"{s['kv_bytes_per_token'] / 1e6:.2f}", f"{s['tok_s']:g}",
                     f"{s['identical_to_target']} / {d['prompts']}"])
    return _table(["config", "acceptance", "tokens / round", "drafted / round", "weight MB / token", "KV MB / token",
                   "tok/s", "identical to target"], rows)


LOSSLESS_POLICIES = {"target": "target AR", "speculative": "speculative (γ = {g})", "adaptive": "adaptive speculation",
                     "auto": "auto (γ from measured costs)"}


def lossless_table(run: dict) -> str:
    """One `bitnest lossless` run: per corpus and policy, acceptance, tokens per round, weight bytes per token
    (and against the FP16 AR baseline), KV bytes per token and tok/s; identical outputs in the last column."""
    rows = []
    for corpus, by_policy in run["stats"].items():
        for policy, label in LOSSLESS_POLICIES.items():
            if policy not in by_policy:
                continue
            s = by_policy[policy]
            same = run["identical_by_policy"].get(policy)
            rows.append([corpus, label.format(g=run["gamma"]), _pct(s.get("acceptance")),
                         "" if s.get("tokens_per_round") is None else f"{s['tokens_per_round']:.2f}",
                         _mb(s["weight_bytes_per_token"]), f"{s['weight_bytes_vs_fp16']:.2f}",
                         _mb(s["kv_bytes_per_token"]), f"{s['tok_s']:g}",
                         "" if same is None else f"{same} / {run['prompts']}"])
    return _table(["prompts", "policy", "acceptance", "tokens / round", "weight MB / token", "vs FP16 AR",
                   "KV MB / token", "tok/s", "identical to target (all prompts)"], rows)


def lossless_isas_table(*runs: dict) -> str:
    """`bitnest lossless` once per ISA path of the native step: how many outputs of each policy equal the target's."""
    rows = []
    for run in runs:
        same = run["identical_by_policy"]
        rows.append([f"{run['isa']}", f"{run['prompts']} x {run['max_new_tokens']}"]
                    + ["" if p not in same else f"{same[p]} / {run['prompts']}" for p in ("speculative", "adaptive",
                                                                                         "auto")]
                    + [str(len(run["divergences"])), "yes" if run["lossless"] else "no"])
    return _table(["ISA path", "prompts x tokens", f"speculative (γ = {runs[0]['gamma']})", "adaptive", "auto", "divergences",
                   "lossless"], rows)


# -- the README's headline --------------------------------------------------------------------------------------
QWEN_RUNS = ("bench-qwen2.5-coder-0.5b-sharegpt.json",)   # `--stop-at-eos`, beside llama.cpp built for the CPU


def headline_table(sweep: dict, quality: dict, mc: dict, verify: dict, replay: dict, bench: dict, shape: dict,
                   qwen_lossless: dict, *qwen_runs: dict) -> str:
    """One row per headline result, each with the command that measured it."""
    sw = sweep["speculation_sweep"]
    t, g4 = sw["target"], sw["fixed-g4"]
    ad = sw.get("adaptive-g4-stop", g4)
    target_bytes = t["weight_bytes_per_token"]
    n = sweep["prompts"]
    q = quality[DEFAULT_ROW]["eval"]
    ppl = q["ppl"]
    c = mc["configs"]
    v = verify["verify"]
    rows = [
        headline_bench_row(bench),
        headline_shape_row(shape),
        headline_model_row("Qwen2.5-Coder-0.5B-Instruct", qwen_lossless, *qwen_runs),
        ["greedy speculation is lossless",
         f"{g4['identical_to_target']} / {n} outputs identical to the target's at γ = 4 (acceptance "
         f"{_pct(g4['acceptance'])}, {g4['tokens_per_round']:.2f} tokens / round)",
         "`python scripts/compare_policies.py --prompts 16 --max-new-tokens 64 --speculation-sweep --json`"],
        ["weight bytes per token (decode)",
         f"adaptive speculation (γ = 4, early stop) {_mb(ad['weight_bytes_per_token'])} MB against the target's "
         f"{_mb(t['weight_bytes_per_token'])} MB ({100 * (ad['weight_bytes_per_token'] / target_bytes - 1):+.0f}%); "
         f"fixed γ = 4: {_mb(g4['weight_bytes_per_token'])} MB", "the same run"],
        ["draft / target agreement of the default export",
         " / ".join(_pct(q["agreement"][k]) for k in CORPORA) + " (ShareGPT / Shakespeare / code); target perplexity "
         + " / ".join(f"{100 * (ppl['target'][k] / ppl['reference'][k] - 1):+.1f}%" for k in CORPORA)
         + " from the reference", "`python scripts/quality_table.py --tokens 4096`"],
        [f"largest context, {mc['model']} on {mc['device']['name']} (planned; not run on a device)",
         f"bitnest {c['bitnest']['max_context']:,}, W8A8 AR {c['w8a8-ar']['max_context']:,}, "
         f"FP16 AR {c['fp16-ar']['max_context']:,} positions",
         f"`python scripts/max_context.py --device {mc['device']['name']} --model {mc['model']} --json`"],
        ["planned bytes = allocated bytes",
         f"{verify['model']} shapes at {v['context']:,} positions: planned {v['planned_bytes']:,} B, measured "
         f"{v['measured_bytes']:,} B (ratio {v['ratio']})", f"`{verify['command']}`"],
        ["Precision on Demand: the low pass's margin ranks argmax flips",
         f"AUC {replay['auc']['margin']['value']:.3f} (entropy {replay['auc']['entropy']['value']:.3f}); "
         f"flips on {_pct(replay['flip_rate'])} of {replay['steps']} steps",
         "`python scripts/replay.py --prompts 24 --max-new-tokens 64 --plots scripts/results --json`"],
    ]
    return _table(["result", "measured (SmolLM2-135M on this 2-core CPU unless named)", "command"], rows)


# -- the registry -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    sources: tuple[str, ...]                    # files under scripts/results/, read as JSON
    render: Callable[..., str]                  # the loaded files -> markdown


FIXED = {
    "headline": Table(("sweep-bitnest.json", "quality.json", "max_context_orin-nx-16gb_llama-2-7b-32k.json",
                       "verify_local_llama-2-7b-32k.json", "replay-bitnest.json", "bench.json",
                       "bench-smollm2-1.7b.json", "lossless-qwen2.5-coder-0.5b-gptq-shortlist-vocab65536.json",
                       *QWEN_RUNS), headline_table),
    "quality": Table(("quality.json",), quality_table),
    "bench": Table(("bench.json",), bench_table),
    "bench-ratios": Table(("bench.json",), bench_ratios),
    "bench-passes": Table(("bench.json",), bench_passes),
    "bench-isas": Table(("bench.json", "bench_avx2.json", "bench_shortlist.json", "bench-smollm2-1.7b.json",
                         "bench_avx2_smollm2-1.7b.json", "bench_shortlist_smollm2-1.7b.json"), isa_paths_table),
    "lossless-isas": Table(("lossless-bitnest.json", "lossless-avx-vnni.json", "lossless-avx2.json",
                            "lossless-generic.json"), lossless_isas_table),
    "sm87-kernels": Table(("sm87_kernels.json",), sm87_table),
    "device-check": Table(("device-check-h200.json",), device_check_table),
    "device-bandwidth": Table(("device-check-h200.json",), bandwidth_table),
    "verify-local": Table(("verify_local_llama-2-7b-32k.json", "verify_local_default.json"), verify_table),
    "replay-exports": Table(("replay-bitnest.json", "replay-top4of8.json", "replay-rtn.json"), replay_exports_table),
    **{name: Table(*spec) for name, spec in SHAPE_TABLES.items()},
}
PER_FILE = {  # NAME prefix -> (file pattern, renderer); longest prefix first
    "compare-phase-": ("compare-{}.json", compare_phase_table),
    "history-phase-": ("compare-{}.json", history_phase_table),
    "max-context-": ("max_context_{}.json", max_context_table),
    "lossless-": ("lossless-{}.json", lossless_table),
    "compare-": ("compare-{}.json", compare_table),
    "history-": ("compare-{}.json", history_table),
    "replay-": ("replay-{}.json", replay_block),
    "sweep-": ("sweep-{}.json", sweep_table),
    "bench-": ("bench-{}.json", shape_block),
}


def table_for(name: str) -> Table:
    """The table a marker names; BitNestError where it names none."""
    if name in FIXED:
        return FIXED[name]
    for prefix, (pattern, render) in PER_FILE.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return Table((pattern.format(name[len(prefix):]),), render)
    raise BitNestError(f"unknown table {name!r}: use one of {', '.join(FIXED)} or "
                       f"{', '.join(p + 'STEM' for p in PER_FILE)}")


def render(name: str, root: Path = ROOT) -> str:
    """The markdown of table `name` from its results files."""
    t = table_for(name)
    data = []
    for src in t.sources:
        path = root / RESULTS / src
        try:
            data.append(json.loads(path.read_text()))
        except FileNotFoundError:
            raise BitNestError(f"table {name}: {path.relative_to(root)} does not exist") from None
        except ValueError as e:
            raise BitNestError(f"table {name}: {path.relative_to(root)} is not valid JSON ({e})") from None
    try:
        return t.render(*data)
    except (KeyError, TypeError, IndexError) as e:
        raise BitNestError(f"table {name}: {', '.join(t.sources)} lack the field {e}") from None


def doc_files(root: Path = ROOT) -> list[Path]:
    return [p for pattern in DOC_FILES for p in sorted(root.glob(pattern))]


def _check_markers(text: str, path: str) -> None:
    """Every opening marker closed by its own name, in order (a stray or crossed marker is an error)."""
    stack = []
    for m in OPEN.finditer(text):
        if not m.group(1):
            if stack:
                raise BitNestError(f"{path}: table {m.group(2)} opens inside table {stack[-1]}")
            stack.append(m.group(2))
        elif not stack or stack.pop() != m.group(2):
            raise BitNestError(f"{path}: <!-- /table:{m.group(2)} --> closes no open table of that name")
    if stack:
        raise BitNestError(f"{path}: table {stack[-1]} is never closed (<!-- /table:{stack[-1]} -->)")


def update_tables(root: Path = ROOT, check: bool = False, only: tuple[str, ...] = ()) -> dict:
    """Render every table (or those named in `only`) into the doc files. With `check`, write nothing and list
    the tables whose text differs from what the JSON gives under "stale"."""
    root = Path(root)
    tables, stale, written = [], [], []
    for path in doc_files(root):
        rel = str(path.relative_to(root))
        text = path.read_text()
        _check_markers(text, rel)

        def fill(m: re.Match) -> str:
            name = m.group("name")
            if only and name not in only:
                return m.group(0)
            tables.append(f"{rel}:{name}")
            body = render(name, root) + "\n"
            if body != m.group("body"):
                stale.append(f"{rel}:{name}")
            return f"<!-- table:{name} -->\n{body}<!-- /table:{name} -->"

        new = MARKER.sub(fill, text)
        if new != text and not check:
            write_atomic(new.encode(), path)
            written.append(rel)
    return {"tables": tables, "stale": stale, "written": written, "check": check}
