"""An independent reference of the decoder step for the ONNX check: numpy, float64, written from the contracts
(docs/contracts.md: the weight and KV formats, per-token INT8 activations, the step graph's I/O) and HF Llama's
math, reading the checkpoint's safetensors and manifest itself. It shares no code with what it checks: nothing
from plugins.reference, plugins.kv, plugins.packing, plugins.nesting or plugins.decoder_math (which the torch
backend and the onnxruntime Python ops run), nor edge.model. The one import from the project is the definition
of the R4 Hadamard matrix (plugins.hadamard.hadamard_matrix, dense, of the factors the manifest records, or the
legacy rule's where it records none): it is what the export fused into down_proj, while the graph under test applies
it through its own factored Reshape/Transpose/MatMul body."""

import json
from pathlib import Path

import numpy as np


def unpack(plane: np.ndarray) -> np.ndarray:
    """uint8 [..., K/2] -> signed codes int8 [..., K]: byte j holds column 2j (low nibble) and 2j+1 (high). Each byte
    as a little-endian int16 with its high nibble moved to the second byte reads as the two columns' bytes in order;
    a nibble's two's complement is sign-extended by shifting it to the top of an int8 and back."""
    w = np.ascontiguousarray(plane, dtype="<i2")                                       # [..., K/2]
    w = (w | (w << 4)) & 0x0F0F
    return ((w.view(np.int8) << 4) >> 4).reshape(*plane.shape[:-1], plane.shape[-1] * 2)


def pack(codes: np.ndarray) -> np.ndarray:
    """Inverse of `unpack`: codes in [-8, 7] [..., K] -> uint8 [..., K/2]."""
    c = codes.astype(np.int64) & 0xF
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def quantize_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token symmetric INT8: s = max|x| / 127, q = clip(round_half_even(x / s), -127, 127)."""
    s = np.maximum(np.abs(x).max(axis=-1, keepdims=True) / 127.0, 1e-12)                  # [M, 1]
    return np.clip(np.rint(x / s), -127, 127), s


def quantize_kv(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [..., D] -> (base, refine uint8 [..., D/2], scale float16 [...]): s = fp16(max|x| / 7) (the stored value
    is the one used), q4 = clip(round(x/s), -8, 7), qr = clip(round((x - q4 s) / (s/16)), -8, 7)."""
    s16 = np.maximum(np.abs(x).max(axis=-1) / 7.0, 2.0 ** -24).astype(np.float16)         # [...]
    s = s16.astype(np.float64)[..., None]
    q4 = np.clip(np.rint(x / s), -8, 7)
    qr = np.clip(np.rint((x - q4 * s) / (s / 16.0)), -8, 7)
    return pack(q4), pack(qr), s16


def dequantize_kv(base: np.ndarray, refine: np.ndarray, scale: np.ndarray, kv8_from: int) -> np.ndarray:
    """[..., S, D] float64: KV4 (q4 s) before position kv8_from, KV8 ((16 q4 + qr) s/16) from it on."""
    s = scale.astype(np.float64)[..., None]
    q4 = unpack(base).astype(np.float64)
    kv8 = (16.0 * q4 + unpack(refine)) * (s / 16.0)
    at_kv8 = (np.arange(base.shape[-2]) >= kv8_from)[:, None]
    return np.where(at_kv8, kv8, q4 * s)


class StepReference:
    """One sequence's decoder steps over a checkpoint folder, with its own nested KV planes: `step(ids, view,
    seq_len, kv8_from)` has the step graph's semantics (plugins.step_contract) and returns logits [M, V]. A nested
    head is read at the view its draft head gives the pass (docs/contracts.md, weights: the draft head): `8bit` the
    target view in both views, `4bit` the pass's view; `draft_head` None takes the manifest's (absent: `4bit`; a
    shortlist: `8bit`, as the step graph serves it)."""

    def __init__(self, checkpoint, capacity: int, draft_head: str | None = None):
        from safetensors.numpy import load_file
        folder = Path(checkpoint)
        m = json.loads((folder / "manifest.json").read_text())
        c = m["config"]
        self.layers, self.h, self.heads, self.kv_heads = c["num_layers"], c["hidden_size"], c["num_heads"], \
            c["num_kv_heads"]
        self.d, self.eps, self.theta = c["head_dim"], c["rms_norm_eps"], c["rope_theta"]
        self.tied = c["tie_word_embeddings"]
        self.embedding = m.get("embedding", "float16")
        # a recorded shortlist is read as the step graph serves it, at 8 bits (edge.model.draft_head.graph_draft_head,
        # written again here: this reference imports nothing from edge.model)
        recorded = m.get("draft_head", "4bit")
        self.draft_head = draft_head or ("8bit" if recorded == "shortlist" else recorded)
        if self.draft_head not in ("8bit", "4bit"):
            raise ValueError(f"the step reference reads the head at 8 or 4 bits, not {self.draft_head!r}")
        if m["format_version"] == 1:
            self.t = load_file(str(folder / "model.safetensors"))
        else:                        # the shards the index names, read one after another into one table
            shards = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()
            self.t = {k: v for f in dict.fromkeys(shards) for k, v in load_file(str(folder / f)).items()}
        self.groups = {n: s["group_size"] for n, s in m["linears"].items()}
        rot = m.get("rotation") or {}
        self.r1 = self.t["rotation.r1"].astype(np.float64) if rot.get("r1") else None
        self.r4 = None
        if rot.get("r4_size"):
            from plugins.hadamard import hadamard_matrix
            recorded = (rot.get("r4") or {}).get("factors")                         # None: the legacy rule's
            self.r4 = hadamard_matrix(rot["r4_size"], recorded).numpy()             # [I, I] float64
        shape = (2, self.kv_heads, capacity, self.d // 2)
        self.kv = [(np.zeros(shape, np.uint8), np.zeros(shape, np.uint8), np.zeros(shape[:3], np.float16))
                   for _ in range(self.layers)]
        self.new_entries: dict[int, tuple] = {}        # layer -> the last pass's quantized K/V entries
        self.capacity = capacity

    def linear(self, name: str, x: np.ndarray, view: str) -> np.ndarray:
        """x [M, K] -> [M, N] with INT8 activations: per group the exact integer dot product of the activation
        codes and the weight codes (16 q4 + qr at scale/16 for the target, q4 at scale for the draft), plus
        offset * sum(x codes) where the checkpoint has offsets (top4of8), times s_x."""
        t, g = self.t, self.groups[name]
        codes = unpack(t[name + ".base"]).astype(np.float64)                            # [N, K]
        step = t[name + ".scale"].astype(np.float64)                                    # [N, K/G]
        if view == "target":
            codes, step = 16.0 * codes + unpack(t[name + ".refine"]), step / 16.0
        xq, sx = quantize_act(x)
        m, k = xq.shape
        n, c = codes.shape[0], k // g
        xg = xq.reshape(m, c, g)
        # integer-valued float64: every product and group sum is exact (|x| <= 127, |code| <= 136, G <= 256)
        dots = np.matmul(xg.transpose(1, 0, 2), codes.reshape(n, c, g).transpose(1, 2, 0))  # [K/G, M, N]
        y = (dots * step.T[:, None, :]).sum(0)                                          # [M, N]
        if name + ".offset" in t:
            y = y + xg.sum(-1) @ t[name + ".offset"].astype(np.float64).T
        y = y * sx
        bias = t.get(name + ".bias")
        return y if bias is None else y + bias.astype(np.float64)

    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        w = self.t[name + ".weight"].astype(np.float64)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """HF Llama rotate-half RoPE of x [H, M, D] at positions pos [M]."""
        inv = 1.0 / self.theta ** (np.arange(0, self.d, 2) / self.d)                    # [D/2]
        ang = np.concatenate([pos[:, None] * inv[None]] * 2, axis=-1)                   # [M, D]
        half = self.d // 2
        rot = np.concatenate((-x[..., half:], x[..., :half]), axis=-1)
        return x * np.cos(ang) + rot * np.sin(ang)

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, seq_len: int, kv8_from: int):
        """Quantize the pass's K/V into positions [S - M, S) of the planes (kept in `new_entries`), then causal
        GQA attention over [0, S)."""
        m = q.shape[1]
        base, refine, scale = self.kv[layer]
        nb, nr, ns = quantize_kv(np.stack((k, v)))                                      # [2, Hkv, M, ...]
        self.new_entries[layer] = nb, nr, ns
        new = slice(seq_len - m, seq_len)
        base[:, :, new], refine[:, :, new], scale[:, :, new] = nb, nr, ns
        kv = dequantize_kv(base[:, :, :seq_len], refine[:, :, :seq_len], scale[:, :, :seq_len], kv8_from)
        group = self.heads // self.kv_heads
        keys, vals = np.repeat(kv[0], group, axis=0), np.repeat(kv[1], group, axis=0)   # [Hq, S, D]
        scores = q @ keys.transpose(0, 2, 1) / np.sqrt(self.d)                          # [Hq, M, S]
        visible = np.arange(seq_len)[None, :] <= (seq_len - m + np.arange(m))[:, None]
        scores = np.where(visible, scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ vals                                    # [Hq, M, D]

    def embed(self, ids: list[int]) -> np.ndarray:
        """The residual stream entering layer 0: embedding rows (after R1 where the checkpoint has it) [M, H]."""
        rows = np.asarray(ids)
        if self.embedding == "head_target":   # the head's target view: (16 q4 + qr) s/16 (+ offset) per group
            t, g = self.t, self.groups["lm_head"]
            codes = 16.0 * unpack(t["lm_head.base"][rows]) + unpack(t["lm_head.refine"][rows])       # [M, H]
            step = np.repeat(t["lm_head.scale"][rows].astype(np.float64) / 16.0, g, axis=-1)
            x = codes * step
            if "lm_head.offset" in t:
                x = x + np.repeat(t["lm_head.offset"][rows].astype(np.float64), g, axis=-1)
        else:
            x = self.t["model.embed_tokens.weight"][rows].astype(np.float64)                         # [M, H]
        return x @ self.r1 if self.r1 is not None else x

    def block(self, i: int, x: np.ndarray, view: str, seq_len: int, kv8_from: int) -> np.ndarray:
        """Layer i on the residual stream x [M, H] at positions [seq_len - M, seq_len)."""
        m, p = x.shape[0], f"model.layers.{i}."
        pos = np.arange(seq_len - m, seq_len, dtype=np.float64)
        heads = lambda y, n: y.reshape(m, n, self.d).transpose(1, 0, 2)                # [M, n*D] -> [n, M, D]
        h = self.norm(x, p + "input_layernorm")
        q = self.rope(heads(self.linear(p + "self_attn.q_proj", h, view), self.heads), pos)
        k = self.rope(heads(self.linear(p + "self_attn.k_proj", h, view), self.kv_heads), pos)
        v = heads(self.linear(p + "self_attn.v_proj", h, view), self.kv_heads)
        a = self.attend(i, q, k, v, seq_len, kv8_from).transpose(1, 0, 2).reshape(m, self.heads * self.d)
        x = x + self.linear(p + "self_attn.o_proj", a, view)
        h = self.norm(x, p + "post_attention_layernorm")
        gate = self.linear(p + "mlp.gate_proj", h, view)
        g = gate / (1.0 + np.exp(-gate)) * self.linear(p + "mlp.up_proj", h, view)      # silu(gate) * up
        if self.r4 is not None:
            g = g @ self.r4
        return x + self.linear(p + "mlp.down_proj", g, view)

    def final(self, x: np.ndarray, view: str) -> np.ndarray:
        """The residual stream leaving the last layer [M, H] -> logits [M, V]."""
        if self.r1 is not None:
            x = x @ self.r1.T
        x = self.norm(x, "model.norm")
        if "lm_head.base" in self.t:
            return self.linear("lm_head", x, "target" if self.draft_head == "8bit" else view)
        w = self.t["model.embed_tokens.weight" if self.tied else "lm_head.weight"]                 # float16 [V, H]
        return np.concatenate([x @ w[i:i + 8192].astype(np.float64).T for i in range(0, w.shape[0], 8192)], -1)

    def step(self, ids: list[int], view: str, seq_len: int, kv8_from: int) -> np.ndarray:
        """Logits float64 [M, V] of a pass over `ids` at positions [seq_len - M, seq_len)."""
        if not 1 <= len(ids) <= seq_len <= self.capacity:
            raise ValueError(f"a pass of {len(ids)} tokens ending at {seq_len} does not fit the capacity "
                             f"{self.capacity}")
        x = self.embed(ids)
        for i in range(self.layers):
            x = self.block(i, x, view, seq_len, kv8_from)
        return self.final(x, view)
