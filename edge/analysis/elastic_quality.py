"""What elastic KV costs in quality (docs/memory.md): perplexity of the target on long real text as a function of the
share of positions read at KV4 (one elastic window per run), and the speculative acceptance in elastic mode; the plot
of both. Runs the native step (the cpu backend where it does not build)."""

import math
import time

import torch

from edge.backends import make_engine, resolve_backend
from edge.decode.config import GenerateConfig
from edge.decode.generate import generate
from edge.engine import draft_slots
from edge.engine.kv_cache import KV8
from edge.memory.plan import elastic_kv
from edge.model.checkpoint import load_checkpoint
from plugins.contracts import TARGET

CHUNK = 64          # tokens per scored pass (the native step's prefill rows)
GAMMA = 7                # rounds of up to 7 proposals: 8 scratch slots (edge.engine.draft_slots)


def kv4_shares(n: int, window: int | None) -> tuple[float, float]:
    """(share of the n positions at KV4 when the last query reads, mean over the n queries of the share of the
    positions each read at KV4) for a window (None: every position at KV8)."""
    if window is None or window >= n:
        return 0.0, 0.0
    mean = sum(max(0, t + 1 - window) / (t + 1) for t in range(n)) / n
    return (n - window) / n, mean


def perplexity(ckpt_path, ids: list[int], window: int | None, backend: str) -> dict:
    """Target perplexity of ids[1:] given the prefix, scored in passes of CHUNK tokens, under an elastic window."""
    n = len(ids)
    elastic = None if window is None or window >= n else elastic_kv(window, n, backend, CHUNK, GAMMA)
    eng = make_engine(backend, load_checkpoint(ckpt_path), n, scratch=draft_slots(GAMMA), prefill_chunk=CHUNK,
                      elastic=elastic)
    nll, t0 = 0.0, time.perf_counter()
    for s in range(0, n, CHUNK):
        chunk = ids[s:s + CHUNK]
        logits = eng.forward(chunk, TARGET, KV8)                                   # [T, V]
        eng.commit(s + len(chunk))
        nxt = torch.tensor(ids[s + 1:s + 1 + len(chunk)])                          # next tokens (the last chunk: T-1)
        lp = torch.log_softmax(logits[:len(nxt)].float(), dim=-1)
        nll -= lp.gather(1, nxt.unsqueeze(1)).sum().item()
    final, mean = kv4_shares(n, window)
    return {"window": window, "positions": n, "kv4_share_final": round(final, 4), "kv4_share_mean": round(mean, 4),
            "perplexity": round(math.exp(nll / (n - 1)), 4), "seconds": round(time.perf_counter() - t0, 1),
            "ring_slots": elastic.ring if elastic else None}


def acceptance(ckpt_path, prompt: list[int], window: int | None, new_tokens: int, backend: str,
               gamma: int = 4) -> dict:
    """Greedy speculative acceptance (γ = gamma) after a long prompt under an elastic window; lossless checked against
    the elastic target's own greedy tokens."""
    n = len(prompt) + new_tokens
    elastic = None if window is None or window >= n else elastic_kv(window, n, backend, CHUNK, GAMMA)
    out = {}
    for policy in ("speculative", "target"):
        eng = make_engine(backend, load_checkpoint(ckpt_path), n, scratch=draft_slots(GAMMA), prefill_chunk=CHUNK,
                          elastic=elastic)
        out[policy] = generate(eng, prompt, GenerateConfig(policy=policy, gamma=gamma, max_new_tokens=new_tokens),
                               set())
    (tokens, stats), (target, _) = out["speculative"], out["target"]
    s = stats.summary()
    return {"window": window, "context": n, "gamma": gamma, "acceptance": s["acceptance"],
            "tokens_per_round": s["tokens_per_round"], "kv4_positions": s.get("kv4_positions", 0),
            "lossless": tokens == target}


def run(ckpt_path, text: str, tokenizer, positions: int, windows: list[int], accept_windows: list[int],
        accept_prompt: int, new_tokens: int, backend: str = "auto", log=print) -> dict:
    """Perplexity at each window (None first: all KV8) and acceptance at each of `accept_windows`."""
    backend = resolve_backend(backend)
    ids = tokenizer(text)["input_ids"][:positions]
    ppl = []
    for w in [None] + windows:
        ppl.append(perplexity(ckpt_path, ids, w, backend))
        log(ppl[-1])
    acc = []
    for w in [None] + accept_windows:
        acc.append(acceptance(ckpt_path, ids[:accept_prompt], w, new_tokens, backend))
        log(acc[-1])
    return {"backend": backend, "positions": len(ids), "perplexity": ppl, "acceptance": acc}


def plot(result: dict, path: str, pyplot) -> None:
    """Perplexity and acceptance against the share of positions at KV4 (the final share), windows labelled."""
    plt = pyplot
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    p = result["perplexity"]
    a1.plot([r["kv4_share_final"] for r in p], [r["perplexity"] for r in p], "o-")
    for r in p:
        a1.annotate(f"W={r['window'] or 'all'}", (r["kv4_share_final"], r["perplexity"]), fontsize=7,
                    textcoords="offset points", xytext=(3, 3))
    a1.set_xlabel("share of positions at KV4 (last query)")
    a1.set_ylabel("target perplexity")
    a1.set_title(f"{result['positions']:,} positions of Shakespeare")
    fig.suptitle(f"elastic KV on {result['model']} ({result['backend']} backend)", fontsize=10)
    a1.grid(alpha=0.3)
    acc = result["acceptance"]
    shares = [kv4_shares(r["context"], r["window"])[0] for r in acc]
    a2.plot(shares, [r["acceptance"] for r in acc], "s-", color="C1")
    for s, r in zip(shares, acc):
        a2.annotate(f"W={r['window'] or 'all'}", (s, r["acceptance"]), fontsize=7, textcoords="offset points",
                    xytext=(3, 3))
    a2.set_xlabel("share of positions at KV4 (last query)")
    a2.set_ylabel("speculative acceptance (γ = 4, greedy)")
    a2.set_title(f"speculative, {acc[0]['context']:,}-position context")
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
