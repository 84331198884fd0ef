"""Maximum context per run configuration (fp16-ar, w8a8-ar, bitnest with KV4 or KV8 drafting, bitnest-elastic: KV4
past a window, bitnest-base: the base planes only) of a model on a device, with the arithmetic; optionally a PNG of memory against context, and (--device local) a check of
the plan against what the runtime really allocates.

    python scripts/max_context.py --device NAME --model default|PATH|llama-2-7b-32k|llama-3-8b|qwen2.5-7b \
        [--gamma N] [--prefill-chunk N] [--kv-window N] [--backend cpu|torch] [--total-mib M] [--os-reserve-mib M] \
        [--context-reserve-mib M] [--verify] [--plot FILE] [--json]

Presets of the papers' models are shapes only (no weights). --verify allocates the planned maximum context
for real (a preset gets random planes), so keep the budget within this machine's free memory (--total-mib).
"""

import argparse
from pathlib import Path

from edge.argtypes import Parser, at_least, count, gamma, positive
from edge.options.run import pyplot, run_cli
from edge.errors import BitNestError
from edge.memory.devices import DEVICES, MiB, get_profile
from edge.memory.model_shapes import MODEL_PRESETS
from edge.memory.plan import CONFIGS, DEFAULT_KV_WINDOW, Workload, plan
from edge.model.checkpoint import load_checkpoint
from export.commands import default_checkpoint


def resolve_model(name: str, default_checkpoint=None):
    """(label, config, checkpoint or None, loader for --verify: weights -> checkpoint) of a preset, `default` or a
    checkpoint folder."""
    if name in MODEL_PRESETS:
        from edge.memory.synthetic import exported_shapes
        cfg = MODEL_PRESETS[name]
        return name, cfg, None, lambda weights="nested": exported_shapes(cfg, "cpu", weights=weights)
    if name == "default":
        if default_checkpoint is None:
            raise BitNestError("--model default needs the default export: run `bitnest max-context` or pass a checkpoint folder")
        path = default_checkpoint()
    else:
        path = Path(name)
        if not path.exists():
            raise BitNestError(f"--model {name}: not a preset ({', '.join(MODEL_PRESETS)}), not `default` and "
                               "no such checkpoint folder")
    ckpt = load_checkpoint(path)
    return path.name, ckpt.config, ckpt, lambda weights="nested": load_checkpoint(path, verify=False, weights=weights)


def plot(plans: dict, device, path: str) -> None:
    """Planned bytes against context for each configuration, the usable budget, and each maximum marked."""
    plt = pyplot("--plot")
    top = max(max(max(p.max_context, p.memory_max_context) for p in plans.values()), 1024)
    xs = [int(top * 1.25 * i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5))
    gib = 1 << 30
    for name, p in plans.items():
        base = p.total_bytes(0)         # weights, scratch, elastic KV's ring, workspace
        memory = f" (memory alone: {p.memory_max_context:,})" if p.memory_max_context > p.max_context else ""
        ax.plot(xs, [(base + p.kv_bytes(x)) / gib for x in xs], ls=":" if name.endswith("kv8-draft") else "-",
                label=f"{name}: max {p.max_context:,}{memory}")
        if p.max_context:
            ax.plot([p.max_context], [p.total_bytes() / gib], "o", color=ax.lines[-1].get_color())
        if memory:      # the model's positions cap it first: where memory alone would stop
            ax.plot([p.memory_max_context], [(base + p.kv_bytes(p.memory_max_context)) / gib], "x",
                    color=ax.lines[-1].get_color())
    ax.axhline(device.usable_bytes / gib, color="k", ls="--", label=f"usable {device.usable_bytes / gib:.2f} GiB")
    ax.set_xlabel("context (positions)")
    ax.set_ylabel("planned memory (GiB)")
    model = next(iter(plans.values())).model
    ax.set_title(f"{model} on {device.name}: weights + KV x context + scratch + workspace")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def max_context(a, default_checkpoint=None) -> dict:
    device = get_profile(a.device).override(a.total_mib, a.os_reserve_mib, a.context_reserve_mib)
    label, cfg, ckpt, load = resolve_model(a.model, default_checkpoint)
    work = Workload(a.gamma, a.prefill_chunk, a.kv_window)
    plans = {name: plan(label, cfg, c, device, work, ckpt, a.backend) for name, c in CONFIGS.items()}
    out = {"device": device.to_dict(), "model": label, "gamma": a.gamma, "prefill_chunk": a.prefill_chunk,
           "configs": {name: p.to_dict() for name, p in plans.items()}}
    if not a.json:
        print(f"{label} on {device.name} ({device.source})")
        for name, p in plans.items():
            cap = f"; memory alone allows {p.memory_max_context:,}" if p.memory_max_context > p.max_context else ""
            print(f"\n{name}: max context {p.max_context:,}{cap} ({p.config.about})")
            for line in p.arithmetic():
                print("  " + line)
    if a.plot:
        plot(plans, device, a.plot)
        out["plot"] = a.plot
    if a.verify:
        if a.device != "local":
            raise BitNestError("--verify allocates the plan on this machine: use it with --device local")
        from edge.memory.verify import verify_plan
        for name, key in (("bitnest", "verify"), ("bitnest-elastic", "verify_elastic"),
                          ("bitnest-base", "verify_base")):        # fitting no context: null
            p = plans[name]
            out[key] = verify_plan(p, lambda: load(p.config.weights)) if p.max_context else None
            v = out[key]
            if not a.json:
                print(f"\nverify {name}: does not fit" if v is None else
                      f"\nverify {name} at {v['context']:,} positions: planned {v['planned_bytes'] / MiB:,.1f} MiB, "
                      f"measured {v['measured_bytes'] / MiB:,.1f} MiB (ratio {v['ratio']}), within 2%: {v['within_2pct']}")
    return out


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="max_context.py", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", required=True, help=" | ".join(DEVICES))
    p.add_argument("--model", default="default", help=f"default | PATH | {' | '.join(MODEL_PRESETS)}")
    p.add_argument("--gamma", type=gamma(), default=4)
    p.add_argument("--prefill-chunk", type=count(), default=256)
    p.add_argument("--kv-window", type=count(), default=DEFAULT_KV_WINDOW,
                   help="bitnest-elastic: positions each query reads at KV8 (older ones at KV4)")
    p.add_argument("--backend", default=None, help="cpu | torch: dry-run this runtime's backend; native: its step's "
                                                    "formula (default: the device's own: GPU kernels on a GPU, cpu here)")
    p.add_argument("--total-mib", type=positive(), help="override the device's total memory")
    p.add_argument("--os-reserve-mib", type=at_least(), help="override the memory the OS keeps")
    p.add_argument("--context-reserve-mib", type=at_least(), help="override the CUDA context / runtime reserve")
    p.add_argument("--verify", action="store_true", help="allocate the bitnest and bitnest-base plans here and compare "
                                                          "(--device local)")
    p.add_argument("--plot", help="write a PNG of memory against context")
    p.add_argument("--json", action="store_true")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    return run_cli(lambda: max_context(a, default_checkpoint), a.json, "max_context.py", echo=False)
