"""What the draft pass reads of a nested LM head (docs/contracts.md, weights: the draft head): the setting's names,
the head view each pass reads, and the shortlist rule (the draft's logits when it re-scores its base-plane top K at
8 bits).

- `8bit`: the draft reads the head at the target view, as the target does (8-bit codes, both planes): the draft's
  argmax is untouched by the head's quantization, and no pass reads a 4-bit head.
- `4bit`: the draft reads the head's base plane (q4 · s), as every other linear of the draft.
- `shortlist`: the draft reads the base plane for every row, keeps the K rows of largest base-plane logits and
  re-scores those rows at the target view; its logits are those 8-bit logits on the shortlist and -inf elsewhere.
- A draft vocabulary (`draft_vocab` V_d, any setting): the draft scores token ids [0, V_d) only and its logit of every
  other id is -inf, so it reads V_d rows of the head, not all of them (byte-level BPE vocabularies are ordered by
  merge rank, so their rare tokens sit at the end: Qwen2.5's 151,936 rows hold CJK and other scripts past ~80k).
  The shortlist takes its K rows among those V_d.
The target view always reads the whole head at 8 bits, so the target's output (and losslessness) never depends on
the setting. A float16 head has no setting (None): both views read it in full."""

import torch

DRAFT_HEAD_8BIT, DRAFT_HEAD_4BIT, DRAFT_HEAD_SHORTLIST = "8bit", "4bit", "shortlist"
DRAFT_HEADS = (DRAFT_HEAD_8BIT, DRAFT_HEAD_4BIT, DRAFT_HEAD_SHORTLIST)
# A checkpoint with a nested head but no manifest field `draft_head` was exported before the setting existed: its
# draft read the base plane, and keeps doing so.
DRAFT_HEAD_UNRECORDED = DRAFT_HEAD_4BIT
# What an export of the default model with a nested head records unless told otherwise, as does every export that
# writes the step graph (docs/export.md: measured; the default model's checks are built on its draft's dense 8-bit
# logits, docs/model-and-data.md).
DRAFT_HEAD_EXPORT_DEFAULT = DRAFT_HEAD_8BIT
# What an export of a model from its own files (an HF folder or a GGUF) records unless told otherwise, where it writes
# no step graph: the 8-bit head's acceptance for about the base plane's bytes; a draft pass 0.5-0.6x a target pass at
# the shapes of the models users run, where the 8-bit head's was up to 0.78x (docs/runtime.md: measured).
DRAFT_HEAD_SOURCE_DEFAULT = DRAFT_HEAD_SHORTLIST
# Rows the shortlist re-scores at 8 bits (docs/quality.md: measured).
SHORTLIST_K = 64


def check_draft_head(name) -> str:
    """`name` if it names a draft-head setting, else ValueError naming them."""
    if name not in DRAFT_HEADS:
        raise ValueError(f"unknown draft head {name!r}: use one of {', '.join(DRAFT_HEADS)}")
    return name


def check_shortlist_k(k, vocab: int) -> int:
    """`k` if it is a shortlist size for a vocabulary of `vocab` rows (1..vocab), else ValueError."""
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= vocab:
        raise ValueError(f"shortlist size {k!r} must be an integer in [1, {vocab}] (the vocabulary)")
    return k


def check_draft_vocab(n, vocab: int, shortlist_k: int = 1) -> int | None:
    """`n` (None: the whole vocabulary) if it is a draft vocabulary for `vocab` rows that holds a shortlist of
    `shortlist_k` rows, else ValueError. The whole vocabulary is returned as None."""
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or not max(1, shortlist_k) <= n <= vocab:
        raise ValueError(f"draft vocabulary (--draft-vocab) {n!r} must be an integer in [{max(1, shortlist_k)}, "
                         f"{vocab}] (the shortlist's rows at least, the vocabulary at most)")
    return None if n == vocab else n


def restrict_draft_vocab(logits: torch.Tensor, draft_vocab: int | None) -> torch.Tensor:
    """The draft's logits [M, V] with every id at or past `draft_vocab` set to -inf (in place; None: unchanged)."""
    if draft_vocab is not None:
        logits[..., draft_vocab:] = float("-inf")
    return logits


def graph_draft_head(draft_head: str | None) -> str | None:
    """The draft head the step graph serves for a checkpoint recording `draft_head`: the same, but the 8-bit head for
    the shortlist, whose top-K the graph has no op for (the view is a run-time input there, so its draft passes read
    the head as its target passes do); the shortlist's chosen token is the 8-bit head's wherever that token is
    within the base plane's top K, as on every step of both real models' runs (docs/model-and-data.md)."""
    return DRAFT_HEAD_8BIT if draft_head == DRAFT_HEAD_SHORTLIST else draft_head


def head_view(draft_head: str | None, view: str) -> str:
    """The view a pass of `view` reads the head at: the target's is always `target`; the draft's is `target` for
    `8bit`, `draft` for `4bit` and a float16 head (None: both views read it in full), `shortlist` for the shortlist."""
    if view == "target" or draft_head is None or draft_head == DRAFT_HEAD_4BIT:
        return view
    return "target" if draft_head == DRAFT_HEAD_8BIT else DRAFT_HEAD_SHORTLIST


def order_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 keys [M, V], all distinct, that order logits [M, V] as the shortlist does: a larger logit first, and
    among equal logits the lower token id first. Built from float32's order-preserving integer image (the sign bit
    set: the other bits flipped; -0.0 taken as +0.0), times V, plus V - 1 - id."""
    v = logits.shape[-1]
    bits = (logits.float() + 0.0).view(torch.int32)                        # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # monotone in the float's value
    ids = torch.arange(v, device=logits.device, dtype=torch.int64)
    return ordered * v + (v - 1 - ids)


def shortlist_ids(base_logits: torch.Tensor, k: int) -> torch.Tensor:
    """Token ids [M, K] of the K largest base-plane logits per row, larger first and the lower id first among equal
    logits: deterministic whatever torch.topk does with ties (its keys here are distinct); no host sync, so a pass
    holding it can be captured as a CUDA graph."""
    k = min(k, base_logits.shape[-1])
    v = base_logits.shape[-1]
    keys = torch.topk(order_keys(base_logits), k, dim=-1).values                 # [M, K], largest first
    return (v - 1) - torch.remainder(keys, v)


def shortlist_logits(base_logits: torch.Tensor, k: int, rescore) -> torch.Tensor:
    """The shortlist draft's logits [M, V]: `rescore(ids)` ([M, K] ids -> [M, K] logits of those rows at the target
    view) on the shortlist of `base_logits` [M, V], -inf elsewhere. Greedy drafting picks the 8-bit argmax within
    the shortlist; sampling draws from softmax over the shortlist only (a proper distribution, exactly zero
    elsewhere), which the target's rejection rule corrects as it does any draft."""
    ids = shortlist_ids(base_logits, k)                                          # [M, K]
    out = torch.full_like(base_logits, float("-inf"))
    return out.scatter_(-1, ids, rescore(ids).to(out.dtype))
