"""`bitnest chat` (scripts/chat.py): chat with a nested checkpoint (interactive, one prompt, or a JSONL file of
prompts), streaming tokens and reporting acceptance, tokens per round, bytes per token, tok/s and, from a power
meter, J/token of each answer's decode phase (with `--energy-log FILE`, every power sample and its phase)."""

import argparse
import sys
import time
from dataclasses import replace

from edge.argtypes import Parser, at_least, count, gamma, seed, unit
from edge.backends import BACKENDS, check_backend
from edge.cli.common import run_cli
from edge.cli.options import (
    adaptive_config,
    add_draft_head_arguments,
    add_meter_arguments,
    add_policy_arguments,
    checkpoint_arg,
    draft_head_options,
    gate_config,
    make_meter_from,
)
from edge.cli.prompts import read_prompts
from edge.decode.auto import AutoConfig
from edge.decode.config import DraftKVPolicy, GenerateConfig
from edge.decode.costs import MAX_GAMMA
from edge.decode.generate import CONTEXT_FULL
from edge.decode.registry import POLICIES
from edge.decode.sampling import SamplingConfig
from edge.decode.thresholds import resolve_gate
from edge.energy.session import EnergySession
from edge.runtime import Runtime, merged_summary


def parser(prog: str = "chat.py") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    p.add_argument("--backend", default="auto", help=f"{' | '.join(BACKENDS)} (auto: native where it builds, else cpu)")
    p.add_argument("--policy", default="auto", help=f"{' | '.join(POLICIES)} (auto: γ chosen each round from this "
                   "machine's measured pass costs, 0 = a target step)")
    p.add_argument("--gamma", type=gamma(), help=f"draft tokens per speculative round (default {GenerateConfig.gamma}); "
                   f"with auto, the most it may choose (1..{MAX_GAMMA}, default {MAX_GAMMA})")
    p.add_argument("--remeasure-costs", action="store_true", help="auto: time the passes again instead of reading "
                   "this machine's cached cost table")
    p.add_argument("--temperature", type=at_least(), default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=count(0), default=0)
    p.add_argument("--top-p", type=unit(open_lo=True), default=1.0)
    p.add_argument("--seed", type=seed(), default=0, help="sampling seed")
    p.add_argument("--prompt", help="one prompt (chat-formatted)")
    p.add_argument("--prompts-file", help='JSONL, one {"prompt": str, "chat": bool} per line')
    p.add_argument("--max-new-tokens", type=count(), default=128)
    p.add_argument("--max-context", type=count(2), help="KV cache capacity in positions (default 2048, or with "
                                                   "--device the largest that fits)")
    p.add_argument("--device", help="plan memory for this device profile (scripts/max_context.py) and refuse "
                                    "requests over it")
    p.add_argument("--kv8-draft-below", type=count(0), default=2048, help="draft with KV8 below this context, else --long-draft-kv")
    p.add_argument("--long-draft-kv", choices=("kv4", "recent"), default="kv4")
    p.add_argument("--recent", type=count(), default=256, help="KV8 window of the recent draft KV view")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    add_draft_head_arguments(p)
    add_policy_arguments(p)
    add_meter_arguments(p)
    p.add_argument("--energy-log", help="append every power sample with its phase (prefill, draft, verify, idle) "
                                        "to this file as JSON lines")
    p.add_argument("--idle-seconds", type=at_least(), default=0.0, help="measure idle power this long before the first "
                   "answer (idle samples between answers count too)")
    return p


def generate_config(a) -> GenerateConfig:
    """The options as typed settings; `--gamma` is the round length of the fixed policies and auto's ceiling."""
    auto = a.policy == "auto" and a.gamma is not None
    return GenerateConfig(policy=a.policy, gamma=GenerateConfig.gamma if a.gamma is None or auto else a.gamma,
                          max_new_tokens=a.max_new_tokens,
                          sampling=SamplingConfig(a.temperature, a.top_k, a.top_p, a.seed),
                          draft_kv=DraftKVPolicy(a.kv8_draft_below, a.long_draft_kv, a.recent),
                          gate=gate_config(a), adaptive=adaptive_config(a),
                          auto=AutoConfig(gamma_max=a.gamma) if auto else AutoConfig())


def _result(r: dict) -> dict:
    return {"text": r["text"], "tokens": r["tokens"], "stats": r["stats"].summary()}


def ask(rt: Runtime, energy: EnergySession, ids: list[int], cfg: GenerateConfig, stops, on_text=None) -> dict:
    """One answer, metered: its stats carry J/token (or null and the reason); a meter that stopped is reported
    once on stderr and the chat goes on."""
    r, figures = energy.answer(lambda on_tokens: rt.generate(ids, cfg, stops, on_text=on_text, on_tokens=on_tokens))
    r["stats"].extra.update(figures)
    stopped = energy.failure()
    if stopped:
        print(f"\nenergy: the power meter stopped ({stopped}); the chat goes on without J/token", file=sys.stderr)
    return r


def answer_line(s: dict) -> str:
    """The line printed after an interactive answer."""
    acc = f", acceptance {s['acceptance']:.0%}, {s['tokens_per_round']} tok/round" if s["acceptance"] is not None else ""
    acc += f", escalated {s['escalation_rate']:.0%}" if s["escalation_rate"] is not None else ""
    if s.get("gamma_histogram"):
        acc += ", γ " + " ".join(f"{g}×{n}" for g, n in s["gamma_histogram"].items())
    jpt = s.get("joules_per_token")
    if jpt is None:
        joules = ", J/token n/a" if s.get("meter") in (None, "none") else ", J/token n/a (meter gave no figure)"
    else:
        above = s.get("joules_per_token_above_idle")
        joules = f", {jpt:.4g} J/token" + (f" ({above:.4g} above idle)" if above is not None else "")
    return f"[{s['tokens']} tokens, {s['tok_s']} tok/s{joules}{acc}]"


def context_full_message(rt: Runtime) -> str:
    return (f"[the context is full ({rt.engine.capacity} positions): this chat ends here; start a new one, or raise "
            "--max-context for longer chats]")


def interactive(rt: Runtime, energy: EnergySession, cfg: GenerateConfig, stops) -> dict:
    """Read-eval loop with a chat history. Ctrl-C during an answer stops that answer (what was written stays in the
    history) and the chat goes on; Ctrl-C or Ctrl-D at the prompt ends it. A history that fills the context ends
    it with a message that says so."""
    history, all_stats, stopped = [], [], None
    print(f"BitNest Edge chat ({rt.ckpt.method}, {rt.backend} backend, {cfg.policy}). Ctrl-C stops an answer; "
          "Ctrl-D or Ctrl-C at the prompt quits.", file=sys.stderr)
    while stopped is None:
        try:
            user = input("\nyou> ")
        except (EOFError, KeyboardInterrupt):
            break
        if not user.strip():
            continue
        ids = rt.encode(history + [{"role": "user", "content": user}])
        if len(ids) + 1 > rt.engine.capacity:
            stopped = CONTEXT_FULL
            print(context_full_message(rt), file=sys.stderr)
            break
        history.append({"role": "user", "content": user})
        print("bot> ", end="", flush=True)
        shown, answered = [], False
        try:
            r = ask(rt, energy, ids, cfg, stops, on_text=lambda t: (shown.append(t), print(t, end="", flush=True)))
            answered = True
            history.append({"role": "assistant", "content": r["text"]})
            all_stats.append(r["stats"])
            s = r["stats"].summary()
            print("\n" + answer_line(s), file=sys.stderr)
            if s.get("stopped") == CONTEXT_FULL:
                stopped = CONTEXT_FULL
                print(context_full_message(rt), file=sys.stderr)
        except KeyboardInterrupt:
            if answered:     # the answer was complete: Ctrl-C on the way back to the prompt quits, as at the prompt
                break
            history.append({"role": "assistant", "content": "".join(shown)})
            print("\n[answer interrupted]", file=sys.stderr)
    return {"turns": len(all_stats), "stopped": stopped, "stats": merged(all_stats, energy) if all_stats else {}}


def merged(stats: list, energy: EnergySession) -> dict:
    """One summary over several answers, with J/token over all their decode phases."""
    return {**merged_summary(stats), **energy.summary()}


def converse(a, cfg: GenerateConfig) -> dict:
    """The chat command's body: one prompt, a prompts file, or the interactive loop."""
    rt = Runtime(a.checkpoint, backend=a.backend, max_context=a.max_context or (None if a.device else 2048),
                 scratch=max(8, cfg.most_proposals + 1), device=a.device, **draft_head_options(a))
    cfg = replace(cfg, gate=resolve_gate(rt.ckpt, rt.backend, cfg.policy, cfg.gate))
    if cfg.policy == "auto":         # the pass costs before the first answer (read from the cache, or timed once)
        note = rt.cost_table(remeasure=a.remeasure_costs).note
        if note:
            print(f"auto: {note}", file=sys.stderr)
    stops = tuple(a.stop)
    prompts = read_prompts(a.prompts_file) if a.prompts_file else None    # a bad file fails before the meter starts
    energy = EnergySession(make_meter_from(a), a.energy_log, a.idle_seconds)
    energy.attach(rt.engine)
    try:
        if prompts is not None:
            results = []
            for prompt, chat in prompts:
                results.append(ask(rt, energy, rt.encode(prompt, chat), cfg, stops))
                if not a.json:
                    print(results[-1]["text"], flush=True)
            return {"results": [_result(r) for r in results], "stats": merged([r["stats"] for r in results], energy)}
        if a.prompt is not None:
            stream = None if a.json else (lambda s: print(s, end="", flush=True))
            r = ask(rt, energy, rt.encode(a.prompt), cfg, stops, on_text=stream)
            if not a.json:
                print()
            if r["stats"].extra.get("stopped") == CONTEXT_FULL:
                print(context_full_message(rt), file=sys.stderr)
            return _result(r)
        return interactive(rt, energy, cfg, stops)
    finally:
        energy.close()


def main(argv=None, default_checkpoint=None) -> int:
    """Parse, resolve the checkpoint (default: `default_checkpoint()`, which may export it), and run."""
    a = parser().parse_args(argv)

    def body():
        t0 = time.time()
        cfg = generate_config(a)                        # bad options fail before a checkpoint is made or read
        check_backend(a.backend)
        a.checkpoint = checkpoint_arg(a, default_checkpoint)
        out = converse(a, cfg)
        out.setdefault("seconds", round(time.time() - t0, 1))
        return out

    return run_cli(body, a.json, "chat.py", echo=False)
