"""Decode statistics (the metric names of docs/runtime.md): acceptance, tokens per round, escalation rate,
weight and KV bytes per token counted from the passes actually run, and tok/s over the decode phase only.
Counters change only through the `record_*` methods: passes and prefill from the engine, rounds and gated
steps from the generation loop."""

from dataclasses import dataclass, field, replace

from edge.model.checkpoint import HEAD, Checkpoint, LinearSpec
from edge.model.draft_head import DRAFT_HEAD_SHORTLIST, head_view


def linear_bytes_per_pass(spec: LinearSpec, view: str) -> int:
    """Bytes one nested linear gives a pass of `view`: its plane(s), float16 scales and offsets."""
    n, k = spec.shape
    groups = n * (k // spec.group_size)
    return n * k // 2 * (2 if view == "target" else 1) + 2 * groups * (2 if spec.offset else 1)


def head_bytes_per_pass(ckpt: Checkpoint, view: str) -> int:
    """Bytes of the head a pass of `view` reads whatever its width: a float16 head in full; a nested head at the view
    its draft-head setting gives the pass (edge.model.draft_head), the shortlist's base plane and scales (its
    re-scored rows are per token: `head_row_bytes_per_token`)."""
    if not ckpt.head_nested:
        cfg = ckpt.config
        return cfg.vocab_size * cfg.hidden_size * 2
    at = head_view(ckpt.draft_head, view)
    whole = linear_bytes_per_pass(ckpt.linears[HEAD], "draft" if at == DRAFT_HEAD_SHORTLIST else at)
    if view == "target" or ckpt.draft_vocab is None:
        return whole
    return whole // ckpt.config.vocab_size * ckpt.draft_vocab    # the draft reads the rows of its vocabulary only


def head_row_bytes_per_token(ckpt: Checkpoint, view: str) -> int:
    """Bytes each token of a pass of `view` reads of the head beyond `head_bytes_per_pass`: for the shortlist draft,
    its K rows at the target view, i.e. their refinement plane and their scales (and offsets) again; else 0."""
    if not ckpt.head_nested or head_view(ckpt.draft_head, view) != DRAFT_HEAD_SHORTLIST:
        return 0
    spec = ckpt.linears[HEAD]
    k = spec.shape[1]
    return ckpt.shortlist_k * (k // 2 + 2 * (k // spec.group_size) * (2 if spec.offset else 1))


def weight_bytes_per_pass(ckpt: Checkpoint, view: str, tokens: int = 1) -> int:
    """Bytes of weights one pass of `view` over `tokens` tokens reads by the nested format (docs/contracts.md): the
    base plane and scales (and offsets) of every nested linear, the refinement plane too for the target, biases,
    norms, and the head as the draft-head setting reads it (a float16 head in full; the shortlist's rows per token).
    Embedding rows are counted per token apart (`embedding_row_bytes`)."""
    total = sum(linear_bytes_per_pass(spec, view) for name, spec in ckpt.linears.items() if name != HEAD)
    for name, tensor in ckpt.tensors.items():
        if name.endswith(".bias") or "layernorm" in name or name == "model.norm.weight":
            total += tensor.numel() * tensor.element_size()
    return total + head_bytes_per_pass(ckpt, view) + tokens * head_row_bytes_per_token(ckpt, view)


def embedding_row_bytes(ckpt: Checkpoint) -> int:
    """Bytes one token's embedding lookup reads: a float16 row, or (embedding from the nested head) the row of
    both planes and its scales (and offsets) at the target view."""
    if not ckpt.embedding_from_head:
        return ckpt.config.hidden_size * 2
    spec = ckpt.linears[HEAD]
    k = spec.shape[1]
    return k + 2 * (k // spec.group_size) * (2 if spec.offset else 1)


def draft_head_summary(ckpt: Checkpoint) -> dict:
    """What the stats say about the head: `draft_head` (None: a float16 head), for the shortlist `shortlist_k`, and
    `draft_vocab` where the draft scores part of the vocabulary only."""
    out = {"draft_head": ckpt.draft_head}
    if ckpt.draft_head == DRAFT_HEAD_SHORTLIST:
        out["shortlist_k"] = ckpt.shortlist_k
    if ckpt.draft_vocab is not None:
        out["draft_vocab"] = ckpt.draft_vocab
    return out


def fp16_weight_bytes_per_pass(ckpt: Checkpoint) -> int:
    """The same model's weights at float16 (the FP16 AR baseline of the papers)."""
    cfg = ckpt.config
    linear = sum(s.shape[0] * s.shape[1] for n, s in ckpt.linears.items() if n != "lm_head")
    return 2 * (linear + cfg.vocab_size * cfg.hidden_size + (2 * cfg.num_layers + 1) * cfg.hidden_size)


@dataclass
class DecodeStats:
    """Counters of one generation (or a sum of several)."""

    policy: str
    backend: str
    tokens: int = 0                # tokens emitted in the decode phase
    rounds: int = 0                # speculative rounds
    drafted: int = 0
    accepted: int = 0
    steps: int = 0                 # gated decode steps (edge/decode/gates.py)
    escalated: int = 0             # of them, steps run with the target view
    draft_passes: int = 0
    target_passes: int = 0
    weight_bytes: int = 0
    kv_bytes: int = 0
    decode_seconds: float = 0.0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    escalated_at: list = field(default_factory=list)   # gated steps run with the target view (step i chose token i + 1)
    gammas: dict = field(default_factory=dict)         # auto: rounds per γ chosen (γ = 0: a target step)
    probes: int = 0                                    # auto: of them, probe rounds
    alpha: float | None = None                         # auto: the acceptance estimate after the last round
    accepted_per_pos: list = field(default_factory=list)   # [i]: rounds whose draft proposal i was accepted
    extra: dict = field(default_factory=dict)

    def record_pass(self, view: str, weight_bytes: int, kv_bytes: int) -> None:
        """One decode-phase pass and the bytes it read."""
        self.weight_bytes += weight_bytes
        self.kv_bytes += kv_bytes
        if view == "draft":
            self.draft_passes += 1
        else:
            self.target_passes += 1

    def record_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds

    def record_round(self, drafted: int, accepted: int) -> None:
        """One speculative round: proposals drafted, of them accepted."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.accepted_per_pos.extend([0] * (accepted - len(self.accepted_per_pos)))
        for i in range(accepted):                       # proposals are accepted as a prefix: 0 .. accepted - 1
            self.accepted_per_pos[i] += 1

    def record_gated_step(self, escalated: bool) -> None:
        """One gated step, run with the target view when `escalated`."""
        if escalated:
            self.escalated_at.append(self.steps)
        self.steps += 1
        self.escalated += int(escalated)

    def record_choice(self, gamma: int, alpha: float, probe: bool = False) -> None:
        """One auto round: the γ it chose, the acceptance estimate after it, whether it was a probe."""
        self.gammas[gamma] = self.gammas.get(gamma, 0) + 1
        self.probes += int(probe)
        self.alpha = alpha

    def record_decode(self, tokens: int, seconds: float) -> None:
        """The decode phase: tokens emitted after the prefill's, and its wall time."""
        self.tokens, self.decode_seconds = tokens, seconds

    def add(self, other: "DecodeStats") -> None:
        for f in ("tokens", "rounds", "drafted", "accepted", "steps", "escalated", "draft_passes", "target_passes",
                  "weight_bytes", "kv_bytes", "decode_seconds", "prefill_tokens", "prefill_seconds"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.gammas = {g: self.gammas.get(g, 0) + other.gammas.get(g, 0) for g in sorted({*self.gammas, *other.gammas})}
        self.probes += other.probes
        self.alpha = other.alpha if other.alpha is not None else self.alpha
        mine, theirs = self.accepted_per_pos, other.accepted_per_pos
        self.accepted_per_pos = [(mine[i] if i < len(mine) else 0) + (theirs[i] if i < len(theirs) else 0)
                                 for i in range(max(len(mine), len(theirs)))]

    def summary(self) -> dict:
        per = lambda v: round(v / self.tokens, 1) if self.tokens else None
        return {
            "policy": self.policy,
            "backend": self.backend,
            "tokens": self.tokens,
            "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "tokens_per_round": round(self.tokens / self.rounds, 3) if self.rounds else None,
            "escalation_rate": round(self.escalated / self.steps, 4) if self.steps else None,
            "draft_passes": self.draft_passes,
            "target_passes": self.target_passes,
            "weight_bytes_per_token": per(self.weight_bytes),
            "kv_bytes_per_token": per(self.kv_bytes),
            "tok_s": round(self.tokens / self.decode_seconds, 2) if self.decode_seconds > 0 else None,
            "decode_seconds": round(self.decode_seconds, 3),
            "prefill_tokens": self.prefill_tokens,
            "prefill_tok_s": round(self.prefill_tokens / self.prefill_seconds, 1) if self.prefill_seconds > 0 else None,
            **self.auto_summary(),
            **self.extra,
        }

    def auto_summary(self) -> dict:
        """The auto policy's choices (absent for other policies): rounds per γ, probes, the final α estimate."""
        if not self.gammas:
            return {}
        return {"gamma_histogram": {str(g): n for g, n in sorted(self.gammas.items())}, "probe_rounds": self.probes,
                "alpha_estimate": round(self.alpha, 4) if self.alpha is not None else None}


def merged_summary(stats: list[DecodeStats]) -> dict:
    """One summary over several runs (sums of counters, ratios recomputed)."""
    total = replace(stats[0], extra=dict(stats[0].extra))
    for s in stats[1:]:
        total.add(s)
    return total.summary()
