"""Decode speed and energy per token of each decoding policy on real prompts, with idle power beside it.

    python scripts/joules_per_token.py [--checkpoint DIR] [--meter auto|tegrastats|jtop|nvml|none] \
        [--policy speculative,target,draft] [--prompts N] [--max-new-tokens N] [--idle-seconds S] \
        [--interval-ms MS] [--meter-command "CMD ..."] [--rail NAME] [--backend cpu|torch] [--json] [--plot FILE]

J/token integrates instantaneous power over the decode phase only (from the first token to the last);
where no meter works, the J/token fields are null and `reason` says why: nothing is estimated.
"""

import argparse
from pathlib import Path

from edge.argtypes import Parser, at_least, count, gamma
from edge.backends import BACKENDS
from edge.options.run import pyplot, run_cli
from edge.options.groups import (
    add_draft_head_arguments,
    add_meter_arguments,
    checkpoint_arg,
    draft_head_options,
    make_meter_from,
)
from edge.corpora import sharegpt_prompts
from edge.decode.generate import GenerateConfig
from edge.decode.registry import POLICIES
from edge.energy.decode_energy import energy_summary, idle_power, metered_generate
from edge.errors import BitNestError
from edge.llm import LLM
from edge.engine.stats import merged_summary
from export.commands import default_checkpoint


MAX_PROMPTS = 1000          # a measurement, not a corpus run
MAX_NEW_TOKENS = 32768


def plot(out: dict, path: str) -> None:
    plt = pyplot("--plot")
    names = list(out["policies"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
    a1.bar(names, [out["policies"][n]["tok_s"] or 0 for n in names])
    a1.set_ylabel("decode tok/s")
    jpt = [out["policies"][n]["joules_per_token"] for n in names]
    a2.bar(names, [j or 0 for j in jpt])
    a2.set_ylabel("J/token (decode)")
    if all(j is None for j in jpt):
        a2.text(0.5, 0.5, "no power meter:\n" + out["policies"][names[0]]["reason"][:80], ha="center",
                va="center", transform=a2.transAxes, fontsize=7, wrap=True)
    fig.suptitle(f"{out['checkpoint_name']}, meter {out['meter']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def joules(a, default_checkpoint=None) -> dict:
    """Idle power, then each policy's decode-phase tok/s and J/token on the same prompts."""
    if not 1 <= a.prompts <= MAX_PROMPTS or not 1 <= a.max_new_tokens <= MAX_NEW_TOKENS:
        raise BitNestError(f"--prompts must be in [1, {MAX_PROMPTS}] and --max-new-tokens in [1, {MAX_NEW_TOKENS}]")
    if not 0 <= a.idle_seconds <= 3600 or not 1 <= a.interval_ms <= 60_000:
        raise BitNestError("--idle-seconds must be in [0, 3600] and --interval-ms in [1, 60000]")
    policies = [p.strip() for p in a.policy.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise BitNestError(f"unknown policy {bad[0]!r}: use a comma list of {', '.join(POLICIES)}")
    a.checkpoint = checkpoint_arg(a, default_checkpoint)
    rt = LLM(a.checkpoint, policy="target", backend=a.backend, max_context=a.max_new_tokens + 1024, meter="none",
             **draft_head_options(a))   # the command's own meter reads each policy's decode phase
    prompts = [rt.encode(p) for p in sharegpt_prompts(a.prompts)]
    meter = make_meter_from(a)
    out = {"checkpoint": a.checkpoint, "checkpoint_name": Path(a.checkpoint).name, "backend": a.backend,
           "meter": meter.name, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "gamma": a.gamma,
           "draft_head": rt.ckpt.draft_head}
    try:
        out["idle"] = idle_power(meter, a.idle_seconds)
        out["policies"] = {}
        for policy in policies:
            cfg = GenerateConfig(policy=policy, gamma=a.gamma, max_new_tokens=a.max_new_tokens)
            runs = [metered_generate(rt.engine, p, cfg, rt.eos, meter) for p in prompts]
            s = merged_summary([st for st, _ in runs])
            out["policies"][policy] = {"tok_s": s["tok_s"], "tokens": s["tokens"], "acceptance": s["acceptance"],
                                       **energy_summary([e for _, e in runs], s["tokens"], out["idle"]["watts"])}
    finally:
        meter.stop()
    if a.plot:
        plot(out, a.plot)
        out["plot"] = a.plot
    return out


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="joules_per_token.py", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    p.add_argument("--policy", default="speculative,target,draft", help=f"comma list of {', '.join(POLICIES)}")
    p.add_argument("--prompts", type=count(), default=4, help="ShareGPT prompts per policy")
    p.add_argument("--max-new-tokens", type=count(), default=64)
    p.add_argument("--gamma", type=gamma(), default=4)
    p.add_argument("--idle-seconds", type=at_least(), default=3.0, help="idle power is measured this long first")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--plot", help="write a PNG of tok/s and J/token per policy")
    p.add_argument("--json", action="store_true")
    add_meter_arguments(p)
    add_draft_head_arguments(p)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    return run_cli(lambda: joules(a, default_checkpoint), a.json, "joules_per_token.py")
