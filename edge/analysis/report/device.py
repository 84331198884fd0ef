"""The docs table of a device-check JSON object (`bitnest device-check --table FILE.json`): the pass
times and their projected speed-up per model and engine form, then one line per section (the kernels and their unit
tests, lossless, bandwidth as shares of the copy bandwidth, the prefill chunk on the tensor cores, the passes' kernels by family, the plugins, TensorRT,
GPTQ) and what did not finish; the bandwidth and profile sections also as tables of their own."""

GAMMA = 4           # the device check's γ: its lossless run and the projected speed-up
# the device check's sections, in order
SECTIONS = ("kernels", "bandwidth", "prefill", "lossless", "pass_times", "profile", "plugins", "tensorrt", "gptq")


def table(result: dict) -> str:
    """The docs table (markdown) of a device_check JSON object (its passes ran at GAMMA; SECTIONS in order)."""
    env = result["environment"]
    trt = result.get("tensorrt", {"status": "not reached"})
    lines = [f"Device: {env['gpu'] or 'CPU (dry run)'}, torch {env['torch']}, CUDA {env['cuda']}, triton "
             f"{env['triton']}; TensorRT: {trt_summary(trt)}.", "",
             "| model | engine | draft pass (ms) | target pass (ms) | verification pass, γ+1 (ms) "
             "| projected speed-up |",
             "| --- | --- | --- | --- | --- | --- |"]
    proj = result.get("projection", {})
    for model, forms in result.get("pass_times", {}).items():
        if model == "error":
            continue
        for form, t in forms.items():
            lines.append(f"| {model} | {form} | {t['draft_ms']} | {t['target_ms']} | {t['verify_ms']} | "
                         f"{proj.get(model, {}).get(form, '')}× |")
    missing = {"error": "not run"}
    k, ll = result.get("kernels", missing), result.get("lossless", missing)
    bw = result.get("bandwidth", {})
    unit = k.get("unit_tests", {})
    tests = (unit.get("summary") or unit.get("reason") or "not run") + \
        (f" ({'; '.join(unit['failures'])})" if unit.get("failures") else "")
    verdict = "all passed" if k.get("passed") else k.get("error") or "FAILED"
    lines += ["", f"Kernels against the oracle: {verdict} ({len(k.get('checks', []))} checks; their unit tests on "
              f"this device: {tests}). Lossless (triton, γ = {GAMMA}, {ll.get('model')}): {ll.get('identical')}, "
              f"acceptance {ll.get('acceptance')}. {bandwidth_line(bw)}"]
    if "prefill" in result:
        lines.append(prefill_line(result["prefill"]))
    pl = result.get("plugins", missing)
    lines.append("TensorRT plugins through the 10.3 stand-in on the " + (f"{pl.get('device')}: {pl.get('summary')}"
                 if "summary" in pl else f"device: {pl.get('reason') or pl.get('error') or 'not run'}") + ".")
    if "gptq" in result:
        lines.append(gptq_line(result["gptq"]))
    if result.get("step_bandwidth"):
        lines.append(step_line(result["step_bandwidth"]))
    if "profile" in result:
        lines.append(profile_line(result))
    if proj:
        lines.append(f"Projection at the real model's {proj['tokens_per_round']} tokens per round (γ = {GAMMA}, "
                     f"{proj['source']}).")
    if not result.get("complete", True):
        lines.append(f"INCOMPLETE: stopped during `{result.get('running')}` (the sections above it are recorded).")
    timed_out = [s for s in SECTIONS if "timed out" in str(result.get(s, {}).get("error", ""))]
    if timed_out:
        lines.append(f"Timed out: {', '.join(timed_out)}.")
    for name in (s for s in SECTIONS if result.get(f"{s}_stopped")):
        lines.append(f"Stopped at its limit: {name} ({result[f'{name}_stopped']}); its rows above are those it finished.")
    if "llama-2-7b" in result:
        lines.append(f"Llama-2-7B shape {result['llama-2-7b']}.")
    if "error" not in result.get("profile", {"error": "not run"}):
        lines += ["", profile_table(result).rstrip("\n")]
    return "\n".join(lines) + "\n"


def bandwidth_line(bw: dict) -> str:
    """The bandwidth section in a sentence: copy GB/s and each kernel's range as a share of it (or its error): the
    decode GEMV at M = 1 and 5 beyond L2 (one copy of the planes larger than the L2) and at the other shapes."""
    if "copy_GBps" not in bw:
        return f"Bandwidth: {bw.get('error', 'not run').rstrip('.')}."

    def share(rows):
        f = sorted(r["fraction_of_copy"] for r in rows)
        return f"{100 * f[0]:.0f}–{100 * f[-1]:.0f}%" if f else "none"
    parts = []
    tiled = any(r["kernel"] == "dual_plane_linear_tiled" for r in bw["gemv"])      # runs before the tiled layout: one
    for kernel, label in (("dual_plane_linear_tiled", "GEMV (tiled planes, the triton backend's)"),   # GEMV row set
                          ("dual_plane_linear", "GEMV (canonical planes)" if tiled else "GEMV")):
        gemv = [r for r in bw["gemv"] if r["kernel"] == kernel and r["act"] == "int8"]
        for where, rows in (("beyond L2", [r for r in gemv if r.get("beyond_l2")]),
                            ("at the other shapes", [r for r in gemv if not r.get("beyond_l2")])):
            parts += [f"{label} {where} M = {m} {v} {share([r for r in rows if r['M'] == m and r['view'] == v])}"
                      for m, v in ((1, "draft"), (1, "target"), (5, "target")) if any(r["M"] == m for r in rows)]
    parts += [f"attention T = 1 {v} {share([r for r in bw['attention'] if r['T'] == 1 and r['view'] == v])}"
              for v in ("kv8", "kv4")]
    return f"Copy bandwidth {bw['copy_GBps']:.0f} GB/s; kernels as a share of it: {', '.join(parts)}."


def prefill_line(pre: dict) -> str:
    """The prefill section in a sentence: the tensor-core kernel's speed-up over the decode kernel in passes of 8 on
    a chunk, and whether both gave the same bits (or the section's error)."""
    if "rows" not in pre:
        return f"Prefill: {pre.get('error', 'not run').rstrip('.')}."
    up = sorted(r["speedup"] for r in pre["rows"])
    tops = sorted(r["gemm_TOPS"] for r in pre["rows"])
    line = (f"Prefill chunk of {pre['rows'][0]['M']} tokens, tensor-core kernel against the decode kernel in passes "
            f"of 8: {up[0]:.1f}–{up[-1]:.1f}× faster ({tops[0]:.1f}–{tops[-1]:.1f} int8 TOPS); rows identical: "
            f"{pre['identical']}.")
    attn = pre.get("attention")
    if attn:
        up = sorted(r["speedup"] for r in attn)
        line += (f" Its attention (a chunk of {attn[0]['T']} at {attn[0]['context']} positions first), the prefill "
                 f"kernel against the split kernel: {up[0]:.2f}–{up[-1]:.2f}×; outputs within 5e-5: "
                 f"{pre['attention_close']}.")
    return line


def step_line(steps: dict) -> str:
    """Each model's whole graphed pass (its weight bytes over its time) as a share of the copy bandwidth."""
    parts = []
    for model, forms in steps.items():
        t = forms.get("graphs") or forms.get("static") or {}
        if t:
            parts.append(f"{model} target {100 * t['target']:.0f}%, draft {100 * t['draft']:.0f}%, "
                         f"verification {100 * t['verify']:.0f}%")
    return ("Whole passes, weight bytes over pass time as a share of the copy bandwidth: " + "; ".join(parts) + ".") \
        if parts else ""


def profile_line(result: dict) -> str:
    """Each model's target pass in a sentence: its kernels' time against its wall time, its launches, each family's
    ms and launches, and the GEMV family's share of the copy bandwidth inside the pass (`gemv_in_pass`)."""
    prof = result["profile"]
    if "error" in prof:
        return f"Pass profile: {prof['error'].rstrip('.')}."
    parts = []
    for model, passes in prof.items():
        t = passes["target"]
        fams = ", ".join(f"{f} {v['ms']:.3g} ({v['launches']:g})" for f, v in t["families"].items())
        gemv = result.get("gemv_in_pass", {}).get(model, {}).get("target")
        parts.append(f"{model} ({passes['form']}) {t['kernel_ms']:.3g} ms of kernels in {t['wall_ms']:.3g} ms, "
                     f"{t['launches']:g} launches: {fams}" +
                     (f"; its GEMVs at {100 * gemv:.0f}% of the copy bandwidth" if gemv else ""))
    return "A target pass's device time by kernel family, ms (launches): " + "; ".join(parts) + "."


def profile_table(result: dict) -> str:
    """The profile section as a table: each model's draft, target and verification pass, wall and kernel time, the
    time no kernel ran, launches, each family's ms, and the GEMVs' share of the copy bandwidth inside the pass."""
    prof, inside = result["profile"], result.get("gemv_in_pass", {})
    fams = []
    for passes in prof.values():
        for k in ("draft", "target", "verify"):
            fams += [f for f in passes[k]["families"] if f not in fams]
    lines = [f"Device: {result['environment']['gpu'] or 'CPU (dry run)'}; ms a pass (launches in brackets).", "",
             "| model | engine | pass | wall | kernels | idle | launches | " + " | ".join(fams) + " | GEMVs of copy |",
             "| --- " * (8 + len(fams)) + "|"]
    for model, passes in prof.items():
        for k in ("draft", "target", "verify"):
            t = passes[k]
            cells = [f"{t['families'][f]['ms']:.3g} ({t['families'][f]['launches']:g})" if f in t["families"] else ""
                     for f in fams]
            share = inside.get(model, {}).get(k)
            lines.append(f"| {model} | {passes['form']} | {k} | {t['wall_ms']:.3g} | {t['kernel_ms']:.3g} | "
                         f"{t['idle_ms']:.3g} | {t['launches']:g} | " + " | ".join(cells) +
                         f" | {f'{100 * share:.0f}%' if share else ''} |")
    return "\n".join(lines) + "\n"


def trt_summary(trt: dict) -> str:
    """One line of the tensorrt section: skipped and why, or the engine's agreement, KV binding and plane copies."""
    if "error" in trt:
        return trt["error"]
    if trt.get("status") not in ("passed", "failed"):
        return trt.get("reason") or trt.get("status", "not reached")
    if "prefill_rel_err" not in trt:                    # stopped, or failed, before any comparison
        done = ", ".join(f"{k} {v:g} s" for k, v in trt.get("phase_seconds", {}).items())
        return f"{trt['status']}: {trt.get('reason')}" + (f" (phases done: {done})" if done else "")
    build = trt.get("build", {})
    binding = f", KV {build['kv_binding']}, plane copies in its engine: {len(build['plane_copies'])}" + \
        (f" (the aliased build's: {len(build['aliased_build_copies'])})" if "aliased_build_copies" in build else "") + \
        f", runtime kv_window {build.get('kv_window')}" + \
        (f", aliased engine failed: {trt['aliased_failed']}" if trt.get("aliased_failed") else "") if build else ""
    return (f"{trt['status']} against the independent reference ({trt['engine']}{binding}; prefill logits "
            f"{trt['prefill_rel_err']:.2e}, bound {trt['prefill_bound']:.2e}; greedy tokens equal: "
            f"{trt['tokens_equal']})" + (f": {trt['reason']}" if trt.get("reason") else ""))


def _subtable(header: str, rows: list[str]) -> list[str]:
    """A table of its own after a blank line (header and rows as markdown lines); nothing where there are no rows."""
    return ["", header, "|" + " --- |" * header.count(" | ") + " --- |", *rows] if rows else []


def bandwidth_table(result: dict) -> str:
    """The device check's bandwidth section as a table: each kernel's time and GB/s at Llama-7B's decode shapes, as
    a share of the copy bandwidth of the same run (the GEMV beside cuBLAS float16 at the same shape)."""
    bw = result["bandwidth"]
    lines = [f"Copy bandwidth {bw['copy_GBps']:.0f} GB/s ({result['environment']['gpu']}).", "",
             "| kernel | shape | M / T | view | activations | µs | GB/s | of copy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in bw["gemv"]:
        lines.append(f"| {r['kernel']} | {r['K']} × {r['N']} | {r['M']} | {r['view']} | {r['act']} | {r['us']:.1f} | "
                     f"{r['GBps']:.0f} | {100 * r['fraction_of_copy']:.0f}% |")
    for r in bw["attention"]:
        lines.append(f"| {r['kernel']} | {r['layout']}, {r['context']} positions | {r['T']} | {r['view']} | float32 | "
                     f"{r['us']:.1f} | {r['GBps']:.0f} | {100 * r['fraction_of_copy']:.0f}% |")
    pre = result.get("prefill", {})
    lines += _subtable("| prefill chunk | shape | tokens | view | tensor-core µs | decode kernel µs | speed-up | int8 "
                       "TOPS | identical |", [f"| dual_plane_linear_tiled | {r['K']} × {r['N']} | {r['M']} | "
                                             f"{r['view']} | {r['gemm_us']:.1f} | {r['decode_us']:.1f} | "
                                             f"{r['speedup']:.2f}× | {r['gemm_TOPS']:.1f} | {r['identical']} |"
                                             for r in pre.get("rows", [])])
    lines += _subtable("| prefill attention | context | queries | prefill kernel µs | its programs | its GB/s (one KV "
                       "read) | split kernel µs | speed-up | relative difference |",
                       [f"| {r['layout']} | {r['context']} | {r['T']} | {r['prefill_us']:.1f} | {r['programs']} | "
                        f"{r['prefill_GBps']:.0f} | {r['split_us']:.1f} | {r['speedup']:.2f}× | {r['rel_diff']:.1e} |"
                        for r in pre.get("attention", [])])
    return "\n".join(lines) + "\n"


def gptq_line(r: dict) -> str:
    """The docs table's line of the section."""
    if "error" in r:
        return f"GPTQ export on CUDA: {r['error']}."
    if r.get("status") == "not run":
        return f"GPTQ export on CUDA: not run ({r.get('reason')})."
    head = f"GPTQ export on {r.get('gpu') or r.get('device')}: {r.get('status')}"
    corpora = r.get("corpora")
    if not corpora:
        return f"{head}: {r.get('reason')}."
    figures = ", ".join(f"{c} {100 * v['measured']:.2f}% against the CPU export's {100 * v['committed']:.2f}% "
                        f"({v['difference_points']:+.2f})" if v["measured"] is not None else f"{c} missing"
                        for c, v in corpora.items())
    ex = r.get("export", {})
    peak = ex.get("peak_rss_bytes")
    return (f"{head} (draft/target agreement, bound {r['tolerance_points']:g} points: {figures}; export "
            f"{ex.get('seconds')} s" + (f", peak {peak / 2 ** 30:.2f} GiB resident" if peak else "") + ")"
            + (f": {r['reason']}" if r.get("reason") else "") + ".")
