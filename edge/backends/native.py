"""`native` backend: the whole decoder step in C++ (plugins.native: AVX-512 VNNI / AVX-VNNI / AVX2 / NEON / portable
kernels, on the step's own threads), one call per pass. At load the canonical planes are handed to the step, which
re-lays them in place (offset-binary nibbles, rows interleaved in blocks: docs/contracts.md allows a backend's own
layout in place of the canonical one, never beside it), with the norms, the head, the online rotations, RoPE tables
and this engine's nested KV cache; the step's workspace is allocated once for the largest chunk a pass computes at a
time. INT8 activations and exact int32 group sums, as the reference."""

import platform

import torch

from edge.engine.interface import Engine
from edge.engine.kv_cache import ElasticKV, NestedKVCache
from edge.errors import BitNestError
from edge.model.checkpoint import R1_TENSOR, Checkpoint
from edge.model.decoder import rope_tables
from plugins.contracts import TARGET
from plugins.hadamard import hadamard_factor_matrices

PLANES = (".base", ".refine")
QUERY_TILE = 8               # plugins/native/native.h kQueryTile: queries sharing one dequantized K/V entry
POS_BLOCK = 64               # plugins/native/native.h kPosBlock: cached positions dequantized at a time
DRAFT_HEADS = {"4bit": 0, "8bit": 1, "shortlist": 2}   # plugins/native/step.h DraftHead
MAX_PREFILL_CHUNK = 64       # rows of the step's workspace for prefill; a longer pass runs in chunks of its rows
_threads: int | None = None


def native_threads() -> int:
    """The step's thread count: torch's intra-op thread count as it was before the first native engine set
    torch's own to one (see NativeEngine)."""
    global _threads
    if _threads is None:
        _threads = torch.get_num_threads()
    return _threads


def workspace_rows(prefill_chunk: int, scratch: int) -> int:
    """Rows of the step's workspace: the prefill chunk (at most MAX_PREFILL_CHUNK) or a full verification pass."""
    return max(min(prefill_chunk, MAX_PREFILL_CHUNK), scratch + 1)


def workspace_bytes(cfg, rows: int, threads: int, capacity: int, r4: bool, shortlist: int = 0) -> dict[str, int]:
    """What the step allocates besides weights and KV (plugins/native/step.cpp, DecoderStep's constructor, and this
    engine's RoPE tables), and the logits of one verification pass: the memory plan's `native` workspace.
    `shortlist`: the rows a shortlist draft head re-scores (0: no shortlist)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    a, q = cfg.num_heads * d, (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    widest = max(h, i, a)
    shared = 4 * rows * (h + q + a + h + 2 * i) + 8 * rows * shortlist
    own_kv = 2 * cfg.num_kv_heads * rows * (d // 2)                 # this pass's K/V entries: two planes, scales
    per_thread = 4 * rows * widest + rows * widest + 4 * (rows * widest // 64) + 4 * rows \
        + 4 * min(rows, QUERY_TILE) * (cfg.num_heads // cfg.num_kv_heads) * capacity + (4 * (rows * i + i) if r4 else 0) \
        + 4 * d + 4 * POS_BLOCK * d + 2 * own_kv + 2 * (own_kv // (d // 2)) + 4 * rows * shortlist
    return {"step_buffers": shared + threads * per_thread, "rope_tables": 2 * capacity * d * 4,
            "logits": rows * cfg.vocab_size * 4}


def draft_head_setting(ckpt: Checkpoint) -> tuple[str, int]:
    """What the draft pass reads of the head: "4bit" (a nested head's base plane), "8bit" (its target view) or
    "shortlist" (base plane, then its best `shortlist_k` rows at 8 bits), from the checkpoint (ckpt.draft_head,
    ckpt.shortlist_k); a float16 head is read whole by both views ("float16", 0)."""
    if not ckpt.head_nested:
        return "float16", 0
    setting = getattr(ckpt, "draft_head", None) or "4bit"
    if setting not in DRAFT_HEADS:
        raise BitNestError(f"unknown draft head {setting!r}: use one of {', '.join(DRAFT_HEADS)}")
    return setting, int(getattr(ckpt, "shortlist_k", 0) or 0) if setting == "shortlist" else 0


def native_unavailable() -> str | None:
    """None where the native backend runs here, else the one-line reason."""
    from plugins import native
    reason = native.unavailable() or native.isa_problem()
    if reason is None and not native.requested_isa() and platform.machine() in ("x86_64", "AMD64") \
            and native.best_isa() == "generic":
        reason = "this CPU lacks AVX2/FMA/F16C (set BITNEST_NATIVE_ISA=generic to run the slow portable kernels)"
    return reason


class NativeEngine(Engine):
    """Passes through `torch.classes.bitnest.DecoderStep`: one C++ call per pass (chunks of `max_tokens`)."""

    def __init__(self, ckpt: Checkpoint, capacity: int, scratch: int = 8, prefill_chunk: int = MAX_PREFILL_CHUNK,
                 threads: int | None = None, elastic: ElasticKV | None = None):
        reason = native_unavailable()
        if reason:
            raise BitNestError(f"the native backend cannot run here: {reason}; use --backend cpu")
        from plugins import native
        super().__init__(ckpt, capacity, "native", "int8", prefill_chunk=min(prefill_chunk, MAX_PREFILL_CHUNK),
                         elastic=elastic)
        self.check_elastic(workspace_rows(self.prefill_chunk, scratch))
        cfg = ckpt.config
        self.cache = NestedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, scratch, elastic=elastic)
        tensors = self._relaid_tensors(ckpt)
        cos, sin = rope_tables(cfg, torch.arange(capacity), torch.float32)            # [C, D] each
        tensors.update({"rope.cos": cos.contiguous(), "rope.sin": sin.contiguous(),
                        "kv.base": self.cache.main.base, "kv.refine": self.cache.main.refine,
                        "kv.scale": self.cache.main.scale, "scratch.base": self.cache.draft.base,
                        "scratch.refine": self.cache.draft.refine, "scratch.scale": self.cache.draft.scale})
        rot = ckpt.rotations
        if rot.r4_size is not None:       # the checkpoint's recorded factors (plugins/native/step.cpp kron_rows)
            for i, f in enumerate(hadamard_factor_matrices(rot.r4_size, rot.r4_factors)):
                tensors[f"rotation.r4.{i}"] = f.float().contiguous()
        self.threads = threads or native_threads()
        # The step runs on its own threads; torch's idle OpenMP workers spin for a while after every parallel torch
        # op (the sampler's argmax over the vocabulary is one) and would take the cores the step's threads need.
        torch.set_num_threads(1)
        self.draft_head, shortlist = draft_head_setting(ckpt)
        dims = {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size,
                "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                "vocab": cfg.vocab_size, "max_tokens": workspace_rows(self.prefill_chunk, scratch),
                "threads": self.threads, "draft_head": DRAFT_HEADS.get(self.draft_head, 0), "shortlist": shortlist,
                "draft_vocab": ckpt.draft_vocab or 0, "kv_window": elastic.window if elastic is not None else 0}
        try:
            self.step = torch.classes.bitnest.DecoderStep(tensors, dims, cfg.rms_norm_eps, native.requested_isa())
        except RuntimeError as e:
            raise BitNestError(f"the native backend cannot run this checkpoint "
                               f"({str(e).splitlines()[0][:200]}): use --backend cpu") from None
        self.isa = self.step.isa()

    @staticmethod
    def _relaid_tensors(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
        """Every tensor the step reads; the planes, scales and offsets leave the checkpoint (the step re-lays them
        in place), so no canonical copy remains for another reader to misread."""
        t = ckpt.tensors
        out = {}
        for name in ckpt.linears:
            for suffix in PLANES + (".scale", ".offset"):
                if name + suffix in t:
                    out[name + suffix] = t.pop(name + suffix).contiguous()
            if name + ".bias" in t:
                out[name + ".bias"] = t[name + ".bias"]
        for name, tensor in t.items():
            if name.endswith(".weight") or name == R1_TENSOR:
                out[name] = tensor if name != R1_TENSOR else tensor.float().contiguous()
        if not ckpt.head_nested:
            out["lm_head.weight"] = t["model.embed_tokens.weight" if ckpt.config.tie_word_embeddings
                                      else "lm_head.weight"]
        return out

    def numerics(self) -> dict:
        return {"isa": self.isa, "threads": self.threads, "draft_head": self.draft_head}

    def _forward(self, ids, view, start, kv, draft_slot, last_only):
        end = start + len(ids)
        return self.step.forward(torch.tensor(ids, dtype=torch.long), view == TARGET, start, self.length,
                                 draft_slot is not None, kv.kv8_from(end), last_only)
