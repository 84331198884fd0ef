"""The table of `bitnest bench --shape NAME --passes-only --peer llamacpp-native` over the shapes users run
(scripts/results/shape-native-NAME.json), rendered for edge.analysis.report.tables: per shape the 1- and 5-token target
passes and the draft pass, this runtime's target pass rate and prefill beside llama.cpp built for the same CPU
(llama-bench tg and pp, Q8_0 and Q4_K_M of the same shapes), and speculation projected from the pass times with the
judged acceptance of a real model (the second model's lossless run: random weights have none of their own), labelled
as such; and the draft pass with the shortlist head over a draft vocabulary (scripts/results/shape-shortlist-NAME.json)
beside the 8-bit head, with the speculation its pass times project, and the same over every id, the head an export
of a model from its own files records (scripts/results/shape-source-head-NAME.json); and the same passes on the AVX2
kernel set (scripts/results/shape-avx2-NAME.json, BITNEST_NATIVE_ISA=avx2) beside this CPU's best set's."""

from edge.analysis.bench.replay import alpha_from_tokens_per_round, projected
from edge.analysis.report.cells import pct, table
from edge.analysis.bench.synthetic_gguf import q8_0_bytes_per_token
from edge.model.arch import ModelConfig

SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b")
SOURCES = tuple(f"shape-native-{s}.json" for s in SHAPES)
SHORTLIST_SOURCES = tuple(f"shape-shortlist-{s}.json" for s in SHAPES)   # --draft-head shortlist --draft-vocab 65536
SOURCE_HEAD_SOURCES = tuple(f"shape-source-head-{s}.json" for s in SHAPES)   # the shortlist over every id (the default)
AVX2_SOURCES = tuple(f"shape-avx2-{s}.json" for s in SHAPES)         # BITNEST_NATIVE_ISA=avx2, 8-bit head
ACCEPTANCE = "lossless-qwen2.5-coder-0.5b-gptq-shortlist-vocab65536.json"     # the real model whose rounds lend α
SOURCE_HEAD_ACCEPTANCE = "lossless-qwen2.5-coder-0.5b-gptq-shortlist.json"    # the same, its draft scoring every id


def borrowed_alpha(lossless: dict, name: str = ACCEPTANCE) -> tuple[float, str]:
    """(judged α, its label) from the second model's lossless run `name`: its ShareGPT speculative rounds."""
    s = lossless["stats"]["sharegpt"]["speculative"]
    g = lossless["gamma"]
    alpha = alpha_from_tokens_per_round(s["tokens_per_round"], g)
    return alpha, (f"judged α {alpha:.3f}, solved from {s['tokens_per_round']} tokens a round at γ = {g} on "
                   f"Qwen2.5-Coder-0.5B's own export ({s['tokens']} tokens of held-out ShareGPT prompts, "
                   f"`{name}`)")


def paired_q8_ratios(d: dict) -> list[float]:
    """The 1-token target pass rate over llama.cpp's Q8_0 tg rate, round by round (each round ran this runtime's
    passes and then llama-bench, minutes apart at most): the spread a shared host's bandwidth puts on the ratio."""
    ours = [1e3 / r["target"]["1"] for r in d["layouts"]["online"].get("ms_rounds", [])]
    return [a / b for a, b in zip(ours, d["llamacpp_native"]["q8_0"].get("tg_tok_s_rounds", []))]


def shape_row(d: dict, alpha: float) -> list[str]:
    lay = d["layouts"]["online"]
    ms, n = lay["ms"], d["llamacpp_native"]
    t1, t5, d1 = ms["target"]["1"], ms["target"][str(d["gamma"] + 1)], ms["draft"]["1"]
    tok = lay["target_pass_tok_s"]
    proj = projected(ms, alpha)
    best = proj["tok_s_by_gamma"][str(proj["best_gamma"])]
    q8, q4 = n["q8_0"], n["q4_k_m"]
    pp = lay["prefill"]["tok_s"]
    roof = f"{lay['target_pass_gbps']:g} ({pct(lay['target_roofline_fraction'], 0)} of {d['read_gbps']:g})" \
        if "read_gbps" in d else "not probed"
    q8_bytes = q8_0_bytes_per_token(ModelConfig.from_dict(d["config"]))
    q8_gbps = q8["tg_tok_s"] * q8_bytes / 1e9
    ours = lay["target_pass_gbps"] * t1 * 1e6                  # the target's bytes a token (GB/s x ms)
    share = f" ({pct(q8_gbps / d['read_gbps'], 0)})" if "read_gbps" in d else ""
    peer = f"{q8_gbps:.2f}{share}; {q8_bytes / ours:.2f}×"
    return [d["shape"], f"{t1:g} / {t5:g} ({t5 / t1:.2f}×)", f"{d1:g} ({d1 / t1:.2f}×)",
            f"{tok:g}", roof, f"{q8['tg_tok_s']:g} / {q4['tg_tok_s']:g}", peer, f"**{tok / q8['tg_tok_s']:.2f}×**",
            ", ".join(f"{r:.2f}×" for r in paired_q8_ratios(d)) or "not recorded",
            f"{best:g} (γ {proj['best_gamma']}, {best / tok:.2f}×)", f"{best / q4['tg_tok_s']:.2f}×",
            f"{pp:g}", f"{q8['pp_tok_s']:g} / {q4['pp_tok_s']:g}", f"**{pp / q8['pp_tok_s']:.2f}×**"]


def shapes_native_table(*files: dict) -> str:
    """One row per shape; the acceptance source and each run's conditions under the table."""
    *shapes, lossless = files
    alpha, label = borrowed_alpha(lossless)
    head = ["shape", "target pass 1 / 5 tokens, ms (5/1)", "draft pass, ms (/target)", "target tok/s",
            "target GB/s (of the read probe's)", "llama.cpp tg Q8_0 / Q4_K_M",
            "Q8_0 GB/s (of the probe's); its bytes a token / the target's", "target / Q8_0",
            "target / Q8_0 round by round", "speculation projected, tok/s (best γ, /target)",
            "/ Q4_K_M tg", "prefill tok/s", "llama.cpp pp Q8_0 / Q4_K_M", "prefill / Q8_0"]
    rows = [shape_row(d, alpha) for d in shapes]
    first = shapes[0]
    m, info = first["machine"], first["llamacpp_native"]["q8_0"]["system_info"]
    notes = [f"Projected speculation: {label}; random weights have no acceptance of their own, so it is the real "
             "model's, replayed through this shape's pass times (edge.analysis.bench.replay.projected).",
             f"Machine: {m['cpu']}, {first['threads']} threads for every runner; the native step's ISA path "
             f"{first['layouts']['online']['isa']}; llama.cpp {info['build']['llama_cpp_commit']} built for this CPU "
             f"({' '.join(info['build']['cmake'][:2])}), its backend {info['backends']}, repacking "
             f"{info['repack']}; tg of {first['llamacpp_native']['q8_0']['tg_tokens']} tokens after "
             f"{first['llamacpp_native']['q8_0']['tg_depth']} of context, pp of "
             f"{first['llamacpp_native']['q8_0']['pp_tokens']}; each figure the median over "
             f"{first['rounds']} rounds, every runner in its own process, one at a time."]
    return table(head, rows) + "\n\n" + "\n".join(notes)


def shortlist_row(d: dict, native: dict, alpha: float) -> list[str]:
    lay, eight = d["layouts"]["online"], native["layouts"]["online"]
    ms = lay["ms"]
    t1, t5, d1 = ms["target"]["1"], ms["target"][str(d["gamma"] + 1)], ms["draft"]["1"]
    proj = projected(ms, alpha)
    best = proj["tok_s_by_gamma"][str(proj["best_gamma"])]
    return [d["shape"], f"{eight['draft_pass_vs_target_pass']:.2f}×",
            f"{d1:g} (**{d1 / t1:.2f}×**)", f"{t1:g} / {t5:g} ({t5 / t1:.2f}×)",
            f"{best:g} (γ {proj['best_gamma']}, **{best / lay['target_pass_tok_s']:.2f}×**)", f"{d['read_gbps']:g}"]


def shapes_shortlist_table(*files: dict, acceptance: str = ACCEPTANCE) -> str:
    """One row per shape: the draft pass with the shortlist head (over the first `draft_vocab` ids where the run had
    one) against the target pass of the same run, the 8-bit head's ratio from the native table's run, and the
    projected speculation with the acceptance of the second model's run `acceptance` (the same head)."""
    n = len(SHAPES)
    shortlist, native, lossless = files[:n], files[n:2 * n], files[2 * n]
    alpha, label = borrowed_alpha(lossless, acceptance)
    first = shortlist[0]["layouts"]["online"]
    vocab = first.get("draft_vocab")
    ids = f"the first {vocab:,}" if vocab else "all"
    head = ["shape", "draft / target pass, 8-bit head (the native table)",
            f"draft pass, shortlist head over {f'{vocab:,} ids' if vocab else 'every id'}, ms (/target)",
            "target pass 1 / 5 tokens, ms (5/1)", "speculation projected, tok/s (best γ, /target)", "read probe GB/s"]
    rows = [shortlist_row(d, nat, alpha) for d, nat in zip(shortlist, native)]
    notes = [f"The draft ranks {ids} rows of the head on its 4-bit base plane and re-scores the "
             f"{first['shortlist_k']} best at 8 bits (--draft-head shortlist"
             f"{f' --draft-vocab {vocab}' if vocab else ''}); the target verifies every token of the full vocabulary. "
             f"Projected speculation: {label}, an acceptance measured with this same draft head"
             f"{' and vocabulary' if vocab else ''}.",
             f"Each figure the median over {shortlist[0]['rounds']} rounds of {shortlist[0]['pass_repeats']} passes, "
             "every runner in its own process; ratios within one run (the 8-bit head's from the native table's)."]
    return table(head, rows) + "\n\n" + "\n".join(notes)


def shapes_source_head_table(*files: dict) -> str:
    """shapes_shortlist_table for the head an export of a model from its own files records (the shortlist over every
    id: scripts/results/shape-source-head-NAME.json, `--passes-only` with no draft-head option)."""
    return shapes_shortlist_table(*files, acceptance=SOURCE_HEAD_ACCEPTANCE)


def shapes_avx2_table(*files: dict) -> str:
    """One row per shape: the AVX2 kernel set's 1- and 5-token target passes (their ratio overall and round by round)
    and its draft pass, beside the 5/1 ratio of this CPU's best set in the native table's run."""
    n = len(SHAPES)
    avx2, native = files[:n], files[n:2 * n]
    head = ["shape", "ISA path", "target pass 1 / 5 tokens, ms (5/1)", "5/1 round by round", "draft pass, ms (/target)",
            "read probe GB/s", "5/1 on this CPU's best set (the native table)"]
    rows = []
    for d, nat in zip(avx2, native):
        lay, best = d["layouts"]["online"], nat["layouts"]["online"]
        t1, t5, d1 = lay["ms"]["target"]["1"], lay["ms"]["target"]["5"], lay["ms"]["draft"]["1"]
        by_round = ", ".join(f"{r['target']['5'] / r['target']['1']:.2f}×" for r in lay.get("ms_rounds", []))
        rows.append([d["shape"], lay["isa"], f"{t1:g} / {t5:g} (**{t5 / t1:.2f}×**)", by_round,
                     f"{d1:g} ({d1 / t1:.2f}×)", f"{d['read_gbps']:g}",
                     f"{best['target_pass_vs_1']['5']:.2f}× ({best['isa']})"])
    note = (f"Each figure the median over {avx2[0]['rounds']} rounds of {avx2[0]['pass_repeats']} passes, every runner "
            "in its own process, the draft reading the head at 8 bits; the native table's run is another "
            "run on the same host.")
    return table(head, rows) + "\n\n" + note


# {table name: (its files under scripts/results/, its renderer)}: edge.analysis.report.tables's registry entries
SHAPE_TABLES = {
    "shapes-native": ((*SOURCES, ACCEPTANCE), shapes_native_table),
    "shapes-shortlist": ((*SHORTLIST_SOURCES, *SOURCES, ACCEPTANCE), shapes_shortlist_table),
    "shapes-source-head": ((*SOURCE_HEAD_SOURCES, *SOURCES, SOURCE_HEAD_ACCEPTANCE), shapes_source_head_table),
    "shapes-avx2": ((*AVX2_SOURCES, *SOURCES), shapes_avx2_table),
}
