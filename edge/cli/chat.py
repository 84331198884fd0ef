"""`bitnest chat` (scripts/chat.py): chat with a nested checkpoint (interactive, one prompt, or a JSONL file of
prompts), streaming tokens and reporting acceptance, tokens per round, bytes per token and tok/s."""

import argparse
import sys
import time
from dataclasses import replace

from edge.backends import BACKENDS, check_backend
from edge.cli.common import run_cli
from edge.cli.options import (
    adaptive_config,
    add_policy_arguments,
    checkpoint_arg,
    gate_config,
)
from edge.cli.prompts import read_prompts
from edge.decode.config import DraftKVPolicy, GenerateConfig
from edge.decode.registry import POLICIES
from edge.decode.sampling import SamplingConfig
from edge.decode.thresholds import resolve_gate
from edge.runtime import Runtime, merged_summary


def parser(prog: str = "chat.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    p.add_argument("--backend", default="auto", help=f"{' | '.join(BACKENDS)} (auto: native where it builds, else cpu)")
    p.add_argument("--policy", default="speculative", help=f"{' | '.join(POLICIES)}")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per speculative round")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--prompt", help="one prompt (chat-formatted)")
    p.add_argument("--prompts-file", help='JSONL, one {"prompt": str, "chat": bool} per line')
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-context", type=int, help="KV cache capacity in positions (default 2048, or with "
                                                   "--device the largest that fits)")
    p.add_argument("--device", help="plan memory for this device profile (scripts/max_context.py) and refuse "
                                    "requests over it")
    p.add_argument("--kv8-draft-below", type=int, default=2048, help="draft with KV8 below this context, else --long-draft-kv")
    p.add_argument("--long-draft-kv", choices=("kv4", "recent"), default="kv4")
    p.add_argument("--recent", type=int, default=256, help="KV8 window of the recent draft KV view")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    add_policy_arguments(p)
    return p


def generate_config(a) -> GenerateConfig:
    return GenerateConfig(policy=a.policy, gamma=a.gamma, max_new_tokens=a.max_new_tokens,
                          sampling=SamplingConfig(a.temperature, a.top_k, a.top_p, a.seed),
                          draft_kv=DraftKVPolicy(a.kv8_draft_below, a.long_draft_kv, a.recent),
                          gate=gate_config(a), adaptive=adaptive_config(a))


def _result(r: dict) -> dict:
    return {"text": r["text"], "tokens": r["tokens"], "stats": r["stats"].summary()}


def interactive(rt: Runtime, cfg: GenerateConfig, stops) -> dict:
    """Read-eval loop with a chat history; Ctrl-C or Ctrl-D ends it cleanly."""
    history, all_stats = [], []
    print(f"BitNest Edge chat ({rt.ckpt.method}, {rt.backend} backend, {cfg.policy}). Ctrl-D or Ctrl-C to quit.",
          file=sys.stderr)
    try:
        while True:
            try:
                user = input("\nyou> ")
            except EOFError:
                break
            if not user.strip():
                continue
            history.append({"role": "user", "content": user})
            print("bot> ", end="", flush=True)
            r = rt.generate(rt.encode(history), cfg, stops, on_text=lambda s: print(s, end="", flush=True))
            history.append({"role": "assistant", "content": r["text"]})
            s = r["stats"].summary()
            acc = f", acceptance {s['acceptance']:.0%}, {s['tokens_per_round']} tok/round" if s["acceptance"] is not None else ""
            acc += f", escalated {s['escalation_rate']:.0%}" if s["escalation_rate"] is not None else ""
            print(f"\n[{s['tokens']} tokens, {s['tok_s']} tok/s{acc}]", file=sys.stderr)
            all_stats.append(r["stats"])
    except KeyboardInterrupt:
        print("\n(interrupted)", file=sys.stderr)
    return {"turns": len(all_stats), "stats": merged_summary(all_stats) if all_stats else {}}


def converse(a, cfg: GenerateConfig) -> dict:
    """The chat command's body: one prompt, a prompts file, or the interactive loop."""
    rt = Runtime(a.checkpoint, backend=a.backend, max_context=a.max_context or (None if a.device else 2048),
                 scratch=max(8, cfg.most_proposals + 1), device=a.device)
    cfg = replace(cfg, gate=resolve_gate(rt.ckpt, rt.backend, cfg.policy, cfg.gate))
    stops = tuple(a.stop)
    if a.prompts_file:
        results = []
        for prompt, chat in read_prompts(a.prompts_file):
            results.append(rt.generate(rt.encode(prompt, chat), cfg, stops))
            if not a.json:
                print(results[-1]["text"], flush=True)
        return {"results": [_result(r) for r in results], "stats": merged_summary([r["stats"] for r in results])}
    if a.prompt is not None:
        stream = None if a.json else (lambda s: print(s, end="", flush=True))
        r = rt.generate(rt.encode(a.prompt), cfg, stops, on_text=stream)
        if not a.json:
            print()
        return _result(r)
    return interactive(rt, cfg, stops)


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
