"""The result tables of `bitnest bench` (scripts/results/bench.json) and `bitnest bench --shape NAME`
(scripts/results/bench-NAME.json), rendered for edge.analysis.report.tables: every runner's decode speed with the machine,
its ISA path and the isolation noted; pass times per view and width; the ratios; one block per shape with what was
measured, replayed or projected marked; and the README's headline rows for both regimes and for a second real model."""

from edge.analysis.bench.replay import alpha_from_tokens_per_round, projected
from edge.analysis.report.cells import mb, pct, table

BENCH_RUNS = {"target": "target AR", "draft": "draft AR", "speculative": "speculative (fixed γ = {g})",
              "adaptive": "adaptive speculation", "auto": "auto (γ from measured costs)",
              "llamacpp_native_q8_0": "llama.cpp built for this CPU, Q8_0 (made here from the shipped file)",
              "llamacpp_native_q4_1": "llama.cpp built for this CPU, Q4_1 (as shipped)",
              "llamacpp_q8_0": "llama.cpp Q8_0 (the xllamacpp wheel, AVX2 build)",
              "llamacpp_q4_1": "llama.cpp Q4_1 (the xllamacpp wheel, AVX2 build)", "hf_fp32": "transformers float32"}
RATIO_KEYS = ("speculative_vs_target", "adaptive_vs_target", "auto_vs_target", "target_vs_llamacpp_native_q8",
              "auto_vs_llamacpp_native_q8", "auto_vs_llamacpp_native_q4_1", "target_vs_llamacpp_q8",
              "speculative_vs_llamacpp_q8", "adaptive_vs_llamacpp_q8", "auto_vs_llamacpp_q8", "speculative_vs_hf_fp32",
              "verification_pass_vs_target_pass", "draft_pass_vs_target_pass")
SHAPE_RATIO_KEYS = ("target_vs_llamacpp_q8", "replayed_speculative_vs_target", "projected_speculative_vs_target",
                    "projected_best_gamma_vs_target", "draft_vs_target", "verification_pass_vs_target_pass",
                    "draft_pass_vs_target_pass")


def _mib(b: int) -> str:
    return f"{b / 2 ** 20:,.0f} MiB"


def machine_note(d: dict) -> str:
    """One line: CPU, the ISA path the step took, the CPU's ISA flags, LLC and probe sizes, threads, isolation."""
    m = d["machine"]
    flags = ", ".join(f for f, on in m["isa_flags"].items() if on) or "none of note"
    llc = m["llc"]
    seen = _mib(llc["sysfs_bytes"]) + (f" (getconf: {_mib(llc['getconf_bytes'])})"
                                      if llc["getconf_bytes"] and llc["getconf_bytes"] != llc["sysfs_bytes"] else "")
    load = "" if m.get("load_average_before") is None else \
        f"; load average {m['load_average_before']:g} before the run, {m.get('load_average_after', 0):g} after"
    return (f"Machine: {m['cpu']} ({m['arch']}, {m['cores']} cores), {d['threads']} threads for every runner; the "
            f"native step's ISA path: {d['isa']} (CPU flags: {flags}); last-level cache {seen}, read probe "
            f"{_mib(d['probe']['bytes'])}; {d['isolation']}, repeats interleaved ({d['repeats']}), medians{load}.")


def _run_row(label: str, r: dict, extra: list[str] | None = None) -> list[str]:
    return [label] + (extra or []) + [
        f"{r['tok_s']:g}", pct(r.get("acceptance")),
        "" if r.get("weight_bytes_per_token") is None else mb(r["weight_bytes_per_token"]),
        "" if r.get("weight_gbps") is None else f"{r['weight_gbps']:g}",
        "" if r.get("roofline_fraction") is None else pct(r["roofline_fraction"])]


def bench_table(bench: dict) -> str:
    """tok/s of every runner of one `bitnest bench` run, with bytes and roofline fraction; the machine noted."""
    runs = bench["runs"]
    rows = [_run_row(label.format(g=bench["gamma"]), runs[name]) for name, label in BENCH_RUNS.items() if name in runs]
    return table(["runner", "decode tok/s (median)", "acceptance", "weight MB / token", "weight GB/s",
                  f"of the read probe ({bench['read_gbps']:g} GB/s)"], rows) + "\n\n" + machine_note(bench)


def passes_table(p: dict) -> str:
    """Median ms of one pass per view and width, and each target width over the 1-token target pass."""
    widths = list(p["ms"]["target"])
    one = p["ms"]["target"][widths[0]]
    rows = [[f"{view} view (ms)"] + [f"{p['ms'][view][w]:g}" for w in widths] for view in ("draft", "target")]
    rows.append(["target, × its 1-token pass"] + [f"{p['ms']['target'][w] / one:.2f}" for w in widths])
    return table([f"tokens per pass ({p['context']} positions of context, median of {p.get('repeats', 15)})"] + widths,
                 rows)


def bench_passes(bench: dict) -> str:
    return passes_table(bench["pass_times"])


def _ratio_table(r: dict, keys, extra=()) -> str:
    return table(["ratio", "value"], [[f"`{k}`", f"{r[k]:g}"] for k in keys if r.get(k) is not None] +
                 [[f"`{k}`", f"{v:g}"] for k, v in extra if v is not None])


def bench_ratios(bench: dict) -> str:
    return _ratio_table(bench["ratios"], RATIO_KEYS,
                        [("target_roofline_fraction", bench.get("target_roofline_fraction"))])


def judged(d: dict) -> dict:
    """A `bench --shape` run whose projection used the judged acceptance its formula means (bench_replay's
    judged_acceptance). A file written before it projected with accepted ÷ drafted: its projection and the ratios
    made from it are recomputed from its own pass times, with α solved from its recorded tokens per round."""
    proj = d.get("projection")
    if not proj or "alpha_kind" in proj:
        return d
    g, acc = d["gamma"], d["acceptance_source"]
    new = dict(projected(d["pass_times"]["ms"], alpha_from_tokens_per_round(acc["tokens_per_round"], g)), gamma=g,
               alpha_kind="accepted / judged, solved from the run's tokens per round (the file's own projection "
                          f"used accepted / drafted, {pct(proj['alpha'])})")
    new["speculative_tok_s"] = new["tok_s_by_gamma"][str(g)]
    r = dict(d["ratios"], projected_speculative_vs_target=new["vs_target_by_gamma"][str(g)],
             projected_best_gamma_vs_target=new["vs_target_by_gamma"][str(new["best_gamma"])])
    if "projected_speculative_vs_llamacpp_q8" in r:
        r["projected_speculative_vs_llamacpp_q8"] = round(new["speculative_tok_s"] / d["runs"]["llamacpp_q8_0"]["tok_s"], 3)
    return {**d, "projection": new, "ratios": r}


def shape_block(d: dict) -> str:
    """One `bench --shape` run: what each runner measured (or what was replayed, or projected), its pass times and
    its ratios, and where the acceptance came from."""
    d = judged(d)
    runs, proj, acc, g = d["runs"], d["projection"], d["acceptance_source"], d["gamma"]
    source = "this run" if acc["source"] == "this run" else f"`{acc['source']}`"
    rows = [_run_row("target AR", runs["target"], ["measured"]), _run_row("draft AR", runs["draft"], ["measured"])]
    if "speculative_replayed" in runs:
        rows.append(_run_row(f"speculative (γ = {g})", runs["speculative_replayed"],
                             ["replayed: real passes, accept decisions recorded on the default model"]))
    blank = ["", "", "", ""]
    rows.append([f"speculative (γ = {g})", f"projected: pass times, α = {pct(proj['alpha'])} ({proj['alpha_kind']})",
                 f"{proj['speculative_tok_s']:g}"] + blank)
    if proj["best_gamma"] != g:
        rows.append([f"best γ by the projection (γ = {proj['best_gamma']})", "projected",
                     f"{proj['tok_s_by_gamma'][str(proj['best_gamma'])]:g}"] + blank)
    if "llamacpp_q8_0" in runs:
        rows.append(_run_row("llama.cpp Q8_0 (random blocks, same shapes)", runs["llamacpp_q8_0"], ["measured"]))
    head = ["runner", "how", "decode tok/s (median)", "acceptance", "weight MB / token", "weight GB/s",
            f"of the read probe ({d['read_gbps']:g} GB/s)"]
    c = d["config"]
    lead = (f"Shape {d['shape']}: hidden {c['hidden_size']}, intermediate {c['intermediate_size']}, {c['num_layers']} "
            f"layers, {c['num_heads']} heads / {c['num_kv_heads']} KV heads, vocabulary {c['vocab_size']} (synthetic "
            f"nested checkpoint, random planes). Speculation: **{d['speculative_method']}**; acceptance from "
            f"{source} ({acc['checkpoint'].rsplit('/', 1)[-1] if acc.get('checkpoint') else 'default model'}, "
            f"γ = {acc['gamma']}: {pct(acc['acceptance'])}"
            + (f", {acc['rounds']} rounds" if acc.get("rounds") else "") + ").")
    ratios = _ratio_table(d["ratios"], SHAPE_RATIO_KEYS,
                          [("target_roofline_fraction", d.get("target_roofline_fraction"))])
    return "\n\n".join([lead, table(head, rows), passes_table(d["pass_times"]), ratios, machine_note(d)])


def isa_paths_table(*runs: dict) -> str:
    """One row per bench run (each ISA path, each regime): the aims of issue 21 side by side: target speed and its
    share of the read probe, a (γ + 1)-token target pass over a 1-token one, a draft pass over a target pass, auto
    (or, at a shape, the best γ by the projection) and fixed-γ speculation (replayed at a shape) over the target, and
    the target against llama.cpp Q8_0."""
    rows = []
    for d in map(judged, runs):
        r, p, g = d["ratios"], d["pass_times"]["ms"], d["gamma"]
        shape = d.get("shape")
        rows.append([f"{shape} shapes (random weights)" if shape else "SmolLM2-135M", d["isa"],
                     d.get("draft_head", "8bit (not recorded)"),
                     f"{d['runs']['target']['tok_s']:g}", pct(d["target_roofline_fraction"]),
                     f"{p['target'][str(g + 1)] / p['target']['1']:.2f}", f"{r['draft_pass_vs_target_pass']:g}",
                     f"{r['projected_best_gamma_vs_target']:g} (projected, best γ {d['projection']['best_gamma']})"
                     if shape else f"{r['auto_vs_target']:g}",
                     "; ".join(f"{r[f'{m}_speculative_vs_target']:g} ({m})" for m in ("replayed", "projected")
                               if f"{m}_speculative_vs_target" in r) if shape else f"{r['speculative_vs_target']:g}",
                     f"{r['target_vs_llamacpp_q8']:g}"])
    return table(["model", "ISA path", "draft head", "target tok/s", "of the read probe", f"{runs[0]['gamma'] + 1}-token / 1-token "
                  "target pass", "draft / target pass", "auto / target", f"speculative (γ = {runs[0]['gamma']}) / target",
                  "target / llama.cpp Q8_0 (the AVX2 wheel)"], rows)


# -- the README's headline rows -----------------------------------------------------------------------------------
def headline_bench_row(bench: dict) -> list[str]:
    """The default model's policies beside llama.cpp. A run with the native peer leads with its fixed headline: `auto`
    against llama.cpp built for this CPU on the shipped file and on the Q8_0 made from it, paired by repeat; the
    wheel's figures follow, labelled as its AVX2 build. An older run without it leads with the wheel, so labelled."""
    runs, r = bench["runs"], bench["ratios"]
    lead = bench.get("headline") or {}
    native = {k: v for k, v in lead.get("vs", {}).items() if k.startswith("llamacpp_native_")}
    p = bench["pass_times"]["ms"]["target"]
    llc = bench["machine"]["llc"]["sysfs_bytes"]
    where = "within" if runs["target"]["weight_bytes_per_token"] < llc else "past"
    shipped = next((k.removeprefix("llamacpp_") for k in runs if k.startswith("llamacpp_q4")), None)
    wheel = "" if "llamacpp_q8_0" not in runs else (
        f"; the xllamacpp wheel (AVX2 build): Q8_0 {runs['llamacpp_q8_0']['tok_s']:g}"
        + (f", {shipped.upper()} {runs['llamacpp_' + shipped]['tok_s']:g}" if shipped else "")
        + f" (`target_vs_llamacpp_q8` {r['target_vs_llamacpp_q8']:g})")
    policies = (f"target AR {runs['target']['tok_s']:g} tok/s ({pct(bench['target_roofline_fraction'])} of the read "
                f"probe), speculative (γ = {bench['gamma']}) {runs['speculative']['tok_s']:g} "
                f"(`speculative_vs_target` {r['speculative_vs_target']:g}), draft AR {runs['draft']['tok_s']:g}")
    if native and lead.get("policy") == "auto":
        vs = ", ".join(f"{'Q8_0 (made here from the shipped file)' if k.endswith('_q8') else 'the shipped ' + k.removeprefix('llamacpp_native_').upper()} "
                       f"{v['paired']:g}×" for k, v in native.items())
        paired = {k: v["median"] for k, v in bench["paired_ratios"].items()}
        text = (f"`auto` (the default policy) {runs['auto']['tok_s']:g} tok/s, {paired['auto_vs_target']:g}× the "
                f"target; against llama.cpp built for this CPU: {vs}, the target "
                f"{paired['target_vs_llamacpp_native_q8']:g}× its Q8_0 (each the median of the repeat-by-repeat "
                f"ratios); {policies}")
    else:
        auto = f", auto {runs['auto']['tok_s']:g} (`auto_vs_target` {r['auto_vs_target']:g})" if "auto" in runs else ""
        text = policies + auto
    return [f"decode speed, SmolLM2-135M ({where} this CPU's {_mib(llc)} last-level cache), {bench['backend']} "
            f"backend ({bench['isa']}, {bench['threads']} threads), every runner in its own process, "
            f"{bench['prompts']} prompts",
            f"{text}{wheel}; {bench['gamma'] + 1}-token target pass {p[str(bench['gamma'] + 1)] / p['1']:.2f}× a "
            f"1-token pass{_identical(bench)} ([runtime](docs/runtime.md))",
            f"`{bench['command']}`"]


def _identical(bench: dict) -> str:
    """"; identical to the target on n / N prompts (policies)" where the run held its outputs against the target's."""
    same = bench.get("identical_to_target")
    if not same:
        return ""
    return f"; identical to the target on {min(same.values())} / {bench['prompts']} prompts ({', '.join(same)})"


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def headline_model_row(model: str, lossless: dict, *runs: dict) -> list[str]:
    """A second real model: its bench runs (each a `bitnest bench` JSON of its export beside llama.cpp on the same
    GGUF: the wheel's, and the build for this CPU where the run has it) as ranges over the runs, and its lossless
    run."""
    first = runs[0]
    paired = [d["paired_ratios"] for d in runs]
    probe = [d["read_gbps"] for d in runs]
    same = lossless["identical_by_policy"]
    vocab = f", draft vocabulary {first['draft_vocab']:,} ids" if first.get("draft_vocab") else ""
    med = lambda key: _span([p[key]["median"] for p in paired])                            # noqa: E731
    if all("auto_vs_llamacpp_native_q8" in p for p in paired):
        shipped = [k.removeprefix("auto_vs_llamacpp_native_") for k in paired[0]
                   if k.startswith("auto_vs_llamacpp_native_") and k != "auto_vs_llamacpp_native_q8"]
        peers = f"llama.cpp built for this CPU: a Q8_0 made here from the shipped file " \
                f"{med('auto_vs_llamacpp_native_q8')}×" + "".join(
            f", the shipped {q.upper()} {med(f'auto_vs_llamacpp_native_{q}')}×" for q in shipped) + \
            f"; the target {med('target_vs_llamacpp_native_q8')}× its Q8_0"
    else:
        peers = f"llama.cpp Q8_0 {med('auto_vs_llamacpp_q8')}×"
    eos = "each answer ending at the model's end of text" if first.get("stop_at_eos") else "EOS ignored"
    return [f"decode speed, {model} (real weights, streamed from memory), {first['backend']} backend "
            f"({first['isa']}, {first['threads']} threads), every runner in its own process, {len(runs)} "
            f"run{'s' if len(runs) > 1 else ''} of {first['prompts']} held-out ShareGPT requests ({eos})",
            f"speculative (γ = {first['gamma']}, {first['draft_head']} draft head{vocab}) "
            f"{med('speculative_vs_target')}× its target at acceptance "
            f"{_span([d['runs']['speculative']['acceptance'] for d in runs], '{:.3f}')} on those requests, `auto` "
            f"(the default policy) {med('auto_vs_target')}× "
            f"(medians of the repeat-by-repeat ratios); `auto` against {peers}; read probe "
            f"{_span(probe, '{:.1f}')} GB/s; identical "
            f"to the target on {min(same.values())} / {lossless['prompts']} prompts ({' and '.join(same)}; [model "
            "and data](docs/model-and-data.md))",
            f"`{first['command']}`"]


def headline_shape_row(d: dict) -> list[str]:
    """The memory-bound regime: a synthetic checkpoint of a larger model's shapes beside llama.cpp Q8_0."""
    d = judged(d)
    runs, r, p = d["runs"], d["ratios"], d["pass_times"]["ms"]
    method = d["speculative_method"]
    model = (d["acceptance_source"].get("checkpoint") or "the default model").rstrip("/").rsplit("/", 1)[-1]
    spec = f"{r.get(f'{method}_speculative_vs_target'):g}× target at the acceptance recorded on the real model " \
           f"`{model}` (random weights have none of their own)"
    if method != "projected":      # a replay beside what the same run's pass times project
        spec += f" (projected from the pass times: {r['projected_speculative_vs_target']:g}×)"
    return [f"decode speed, memory-bound ({d['shape']} shapes, random weights), {d['backend']} backend ({d['isa']}, "
            f"{d['threads']} threads)",
            f"target AR {runs['target']['tok_s']:g} tok/s ({pct(d['target_roofline_fraction'])} of the read probe), "
            f"draft AR {runs['draft']['tok_s']:g}; llama.cpp Q8_0 (the xllamacpp wheel, AVX2 build) "
            f"{runs['llamacpp_q8_0']['tok_s']:g}: "
            f"`target_vs_llamacpp_q8` {r['target_vs_llamacpp_q8']:g}; speculative (γ = {d['gamma']}, {method}) "
            f"{spec}; {d['gamma'] + 1}-token target pass "
            f"{p['target'][str(d['gamma'] + 1)] / p['target']['1']:.2f}× a 1-token pass, draft pass {r['draft_pass_vs_target_pass']:g}× ([runtime](docs/runtime.md))",
            f"`{d['command']}`"]
