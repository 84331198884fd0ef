"""A prompt set with a closing tag, for the phase gate: SmolLM2 has no thinking mode, so each prompt is
raw text holding three worked examples in a thinking format built from ShareGPT conversations of the
calibration range (question = the first user turn; inside `<think>`…`</think>` the question restated,
`The user asks: …`; after it `Answer:` and the first two sentences of the assistant's answer), then a
held-out ShareGPT request and an open `<think>`. Kept: the requests whose target greedy continuation
closes the span."""

import re

from edge.corpora import SHAREGPT_EVAL_START, sharegpt_conversations
from edge.decode.config import GenerateConfig

TAG = "</think>"
SHOTS = 3
MAX_QUESTION = 100


def _sentences(text: str, start: int, count: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    return " ".join(parts[start:start + count])[:300]


def few_shot_header(shots: int = SHOTS) -> str:
    """The worked examples, from the first calibration-range conversations with a short question and an
    answer of at least three sentences."""
    blocks = []
    for conv in sharegpt_conversations(0):
        if len(conv) >= 2 and len(conv[0]["content"]) < MAX_QUESTION and len(conv[1]["content"]) > 200:
            q, a = " ".join(conv[0]["content"].split()), conv[1]["content"]
            blocks.append(f"Question: {q}\n<think>\nThe user asks: {q}\n{TAG}\nAnswer: {_sentences(a, 0, 2)}\n\n")
            if len(blocks) == shots:
                return "".join(blocks)
    raise ValueError("ShareGPT holds too few conversations for the phase prompts")


def phase_candidates(rt):
    """Token ids of the candidate prompts, in order: the worked examples, a held-out request, an open <think>."""
    header = few_shot_header()
    for conv in sharegpt_conversations(SHAREGPT_EVAL_START):
        q = " ".join(conv[0]["content"].split())
        if q and len(q) < MAX_QUESTION:
            yield rt.encode(f"{header}Question: {q}\n<think>\n", chat=False)


def phase_prompts(rt, n: int, max_new_tokens: int, tag: str = TAG) -> tuple[list[list[int]], list[dict], dict]:
    """Token ids of up to `n` phase prompts, the target's runs on them (the reference, reused), and how
    they were built. Candidates are tried in order until `n` are kept (their continuation writes `tag`) or 3n
    were tried."""
    cfg = GenerateConfig(policy="target", max_new_tokens=max_new_tokens)
    kept, runs, tried = [], [], 0
    for ids in phase_candidates(rt):
        tried += 1
        r = rt.generate(ids, config=cfg)
        if tag in rt.tokenizer.decode(r.tokens):
            kept.append(ids)
            runs.append(r)
        if len(kept) == n or tried >= 3 * n:
            break
    info = {"tag": tag, "candidates": tried, "kept": len(kept),
            "construction": f"raw text: {SHOTS} worked examples (Question / <think> The user asks: the question "
                            f"{TAG} / Answer: two sentences of the reply) from ShareGPT calibration-range "
                            f"conversations, then a held-out ShareGPT request (< {MAX_QUESTION} chars) and an open "
                            "<think>; kept where the target's greedy continuation writes the closing tag"}
    return kept, runs, info
