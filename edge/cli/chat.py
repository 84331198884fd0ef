"""`python scripts/chat.py`: chat with a nested checkpoint (interactive, one prompt, or a JSONL file of
prompts), streaming tokens and reporting acceptance, tokens per round, bytes per token and tok/s."""

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from edge.backends import BACKENDS
from edge.cli.common import run_cli
from edge.errors import BitNestError
from edge.decode.generate import GenerateConfig
from edge.decode.policies import POLICIES, DraftKVPolicy
from edge.cli.options import adaptive_config, add_policy_arguments, gate_config
from edge.runtime import Runtime, merged_summary
from edge.decode.sampling import SamplingConfig
from edge.decode.thresholds import resolve_gate


def parser(prog: str = "chat.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    p.add_argument("--backend", default="cpu", help=f"{' | '.join(BACKENDS)}")
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


def read_prompts(path: str) -> list[tuple[str, bool]]:
    """[(prompt, chat)] from a JSONL file; a malformed line is a one-line error naming it."""
    f = Path(path)
    if not f.is_file():
        raise BitNestError(f"prompts file {path} does not exist")
    out = []
    for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.append((str(rec["prompt"]), bool(rec.get("chat", True))))
        except (ValueError, KeyError, TypeError):
            raise BitNestError(f"{path}:{i}: expected a JSON object with a \"prompt\" string") from None
    if not out:
        raise BitNestError(f"prompts file {path} holds no prompts")
    return out


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
            r = rt.run(rt.encode(history), cfg, stops, on_text=lambda s: print(s, end="", flush=True))
            history.append({"role": "assistant", "content": r["text"]})
            s = r["stats"].summary()
            acc = f", acceptance {s['acceptance']:.0%}, {s['tokens_per_round']} tok/round" if s["acceptance"] is not None else ""
            acc += f", escalated {s['escalation_rate']:.0%}" if s["escalation_rate"] is not None else ""
            print(f"\n[{s['tokens']} tokens, {s['tok_s']} tok/s{acc}]", file=sys.stderr)
            all_stats.append(r["stats"])
    except KeyboardInterrupt:
        print("\n(interrupted)", file=sys.stderr)
    return {"turns": len(all_stats), "stats": merged_summary(all_stats) if all_stats else {}}


def run(a) -> dict:
    cfg = generate_config(a)
    rt = Runtime(a.checkpoint, backend=a.backend, max_context=a.max_context or (None if a.device else 2048),
                 scratch=max(8, cfg.most_proposals + 1), device=a.device)
    cfg = replace(cfg, gate=resolve_gate(rt, cfg.policy, cfg.gate))
    stops = tuple(a.stop)
    if a.prompts_file:
        results = []
        for prompt, chat in read_prompts(a.prompts_file):
            results.append(rt.run(rt.encode(prompt, chat), cfg, stops))
            if not a.json:
                print(results[-1]["text"], flush=True)
        return {"results": [_result(r) for r in results], "stats": merged_summary([r["stats"] for r in results])}
    if a.prompt is not None:
        stream = None if a.json else (lambda s: print(s, end="", flush=True))
        r = rt.run(rt.encode(a.prompt), cfg, stops, on_text=stream)
        if not a.json:
            print()
        return _result(r)
    return interactive(rt, cfg, stops)


def main(argv=None, default_checkpoint=None) -> int:
    """Parse, resolve the checkpoint (default: `default_checkpoint()`, which may export it), and run."""
    a = parser().parse_args(argv)

    def body():
        if a.policy not in POLICIES:
            raise BitNestError(f"unknown policy {a.policy!r}: use one of {', '.join(POLICIES)}")
        if a.backend not in BACKENDS:
            raise BitNestError(f"unknown backend {a.backend!r}: use one of {', '.join(BACKENDS)}")
        if a.checkpoint is None:
            if default_checkpoint is None:
                raise BitNestError("pass --checkpoint DIR")
            a.checkpoint = str(default_checkpoint())
        t0 = time.time()
        out = run(a)
        out.setdefault("seconds", round(time.time() - t0, 1))
        return out

    return run_cli(body, a.json, "chat.py", echo=False)
