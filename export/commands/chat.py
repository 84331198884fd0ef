"""`bitnest chat` (scripts/chat.py): chat with a nested checkpoint (interactive, one prompt, or a JSONL file of
prompts), streaming tokens and reporting acceptance, tokens per round, bytes per token, tok/s and, from a power
meter, J/token of each answer's decode phase (with `--energy-log FILE`, every power sample and its phase)."""

import argparse
import sys
import time

from edge.argtypes import Parser, at_least, count, seed, unit
from edge.backends import check_backend
from edge.options.run import run_cli
from edge.options.llm_args import add_llm_arguments, llm_config, make_llm
from edge.options.groups import checkpoint_arg
from edge.options.prompts import read_prompts
from edge.decode.config import GenerateConfig
from edge.decode.generate import CONTEXT_FULL
from edge.decode.sampling import SamplingConfig
from edge.llm import LLM, Answer
from edge.engine.stats import merged_summary
from export.commands import default_checkpoint


def parser(prog: str = "chat.py") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=__doc__)
    add_llm_arguments(p)
    p.add_argument("--temperature", type=at_least(), default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=count(0), default=0)
    p.add_argument("--top-p", type=unit(open_lo=True), default=1.0)
    p.add_argument("--seed", type=seed(), default=0, help="sampling seed")
    p.add_argument("--prompt", help="one prompt (chat-formatted)")
    p.add_argument("--prompts-file", help='JSONL, one {"prompt": str, "chat": bool} per line')
    p.add_argument("--max-new-tokens", type=count(), default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def generate_config(a) -> GenerateConfig:
    """The options as typed settings (edge.options.llm_args) with the chat's sampling and token limit."""
    return llm_config(a, SamplingConfig(a.temperature, a.top_k, a.top_p, a.seed), a.max_new_tokens)


def _result(r: Answer) -> dict:
    return {"text": r.text, "tokens": r.tokens, "stats": r.summary()}


def ask(llm: LLM, ids: list[int], cfg: GenerateConfig, stops, on_text=None) -> Answer:
    """One answer, metered: its stats carry J/token (or null and the reason); a meter that stopped is reported
    once on stderr and the chat goes on."""
    r = llm.generate(ids, config=cfg, stop=stops, on_text=on_text)
    stopped = llm.energy_failure()
    if stopped:
        print(f"\nenergy: the power meter stopped ({stopped}); the chat goes on without J/token", file=sys.stderr)
    return r


def answer_line(s: dict) -> str:
    """The line printed after an interactive answer."""
    acc = f", acceptance {s['acceptance']:.0%}, {s['tokens_per_round']} tok/round" if s["acceptance"] is not None else ""
    acc += f", escalated {s['escalation_rate']:.0%}" if s["escalation_rate"] is not None else ""
    if s.get("gamma_histogram"):
        acc += ", γ " + " ".join(f"{g}×{n}" for g, n in s["gamma_histogram"].items())
    if s.get("kv_window"):          # elastic KV: positions the last query read at KV4 (their refinement is gone)
        acc += f", {s['kv4_positions']:,} positions at KV4 (window {s['kv_window']:,})"
    jpt = s.get("joules_per_token")
    if jpt is None:
        joules = ", J/token n/a" if s.get("meter") in (None, "none") else ", J/token n/a (meter gave no figure)"
    else:
        above = s.get("joules_per_token_above_idle")
        joules = f", {jpt:.4g} J/token" + (f" ({above:.4g} above idle)" if above is not None else "")
    return f"[{s['tokens']} tokens, {s['tok_s']} tok/s{joules}{acc}]"


def context_full_message(llm: LLM) -> str:
    return (f"[the context is full ({llm.capacity} positions): this chat ends here; start a new one, or raise "
            "--max-context for longer chats]")


def interactive(llm: LLM, cfg: GenerateConfig, stops) -> dict:
    """Read-eval loop with a chat history. Ctrl-C during an answer stops that answer (what was written stays in the
    history) and the chat goes on; Ctrl-C or Ctrl-D at the prompt ends it. A history that fills the context ends
    it with a message that says so."""
    history, all_stats, stopped = [], [], None
    print(f"BitNest Edge chat ({llm.ckpt.method}, {llm.backend} backend, {cfg.policy}). Ctrl-C stops an answer; "
          "Ctrl-D or Ctrl-C at the prompt quits.", file=sys.stderr)
    while stopped is None:
        try:
            user = input("\nyou> ")
        except (EOFError, KeyboardInterrupt):
            break
        if not user.strip():
            continue
        ids = llm.encode(history + [{"role": "user", "content": user}])
        if len(ids) + 1 > llm.capacity:
            stopped = CONTEXT_FULL
            print(context_full_message(llm), file=sys.stderr)
            break
        history.append({"role": "user", "content": user})
        print("bot> ", end="", flush=True)
        shown, answered = [], False
        try:
            r = ask(llm, ids, cfg, stops, on_text=lambda t: (shown.append(t), print(t, end="", flush=True)))
            answered = True
            history.append({"role": "assistant", "content": r.text})
            all_stats.append(r.stats)
            s = r.summary()
            print("\n" + answer_line(s), file=sys.stderr)
            if s.get("stopped") == CONTEXT_FULL:
                stopped = CONTEXT_FULL
                print(context_full_message(llm), file=sys.stderr)
        except KeyboardInterrupt:
            if answered:     # the answer was complete: Ctrl-C on the way back to the prompt quits, as at the prompt
                break
            history.append({"role": "assistant", "content": "".join(shown)})
            print("\n[answer interrupted]", file=sys.stderr)
    return {"turns": len(all_stats), "stopped": stopped, "stats": merged(all_stats, llm) if all_stats else {}}


def merged(stats: list, llm: LLM) -> dict:
    """One summary over several answers, with J/token over all their decode phases."""
    return {**merged_summary(stats), **llm.energy.summary()}


def converse(a, cfg: GenerateConfig) -> dict:
    """The chat command's body: one prompt, a prompts file, or the interactive loop."""
    prompts = read_prompts(a.prompts_file) if a.prompts_file else None    # a bad file fails before the model loads
    stops = tuple(a.stop)
    llm = make_llm(a, cfg)
    cfg = llm.config                    # with the gate's threshold resolved
    try:
        if prompts is not None:
            results = []
            for prompt, chat in prompts:
                results.append(ask(llm, llm.encode(prompt, chat), cfg, stops))
                if not a.json:
                    print(results[-1].text, flush=True)
            return {"results": [_result(r) for r in results], "stats": merged([r.stats for r in results], llm)}
        if a.prompt is not None:
            stream = None if a.json else (lambda s: print(s, end="", flush=True))
            r = ask(llm, llm.encode(a.prompt), cfg, stops, on_text=stream)
            if not a.json:
                print()
            if r.stats.extra.get("stopped") == CONTEXT_FULL:
                print(context_full_message(llm), file=sys.stderr)
            return _result(r)
        return interactive(llm, cfg, stops)
    finally:
        llm.close()


def main(argv=None) -> int:
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
