"""`triton` backend: the nested checkpoint on a CUDA GPU, every linear through the Triton dual-plane GEMV/GEMM
(W4A8 draft / W8A8 target, per-token INT8 activations) and attention through the nested-KV flash-decoding kernel
over a KV cache that lives on the GPU (the kernels are its declared `attention_ops`).

The planes move to the GPU in place of the checkpoint's CPU copies and are re-laid there, one linear at a time, in
the warp-tiled layout the decode GEMV streams (plugins.kernels.tiling; the canonical tensors are released: no second
copy, docs/contracts.md); a block's q/k/v, and its gate/up, are then stacked so one launch reads each group
(`linears`), each linear's planes a view of its rows in the stack. In a decode pass every linear's INT8 activations
come from the launch before it (the norms', attention's reduction's, the gated product's: `share_acts`), so no
launch only quantizes. With TRITON_INTERPRET=1 and no GPU, the same kernels run on CPU tensors in the Triton
interpreter: slow, for tests.
"""

import os

import torch

from edge.errors import BitNestError
from edge.model.checkpoint import HEAD, Checkpoint
from plugins.decoder_math import gated_r4, rotate_rows
from plugins.kernels.tiling import stack_rows, tile_planes
from plugins.reference import nested_embedding

FINAL_NORM = "model.norm"
# the linears of a block that read one input, launched as one GEMV over their stacked planes (`linears`)
STACKED = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))
O_PROJ = "self_attn.o_proj"           # the linear that reads attention's output
NORM_READERS = {"input_layernorm": "self_attn.q_proj", "post_attention_layernorm": "mlp.gate_proj"}   # a block's
# norms and the first linear that reads each one's output


def kernel_device() -> torch.device:
    """The device the kernels run on: the GPU, or the CPU under the Triton interpreter or a launch capture (the
    kernels compiled for a GPU, none run: plugins.kernels.launches); else a one-line error."""
    if os.environ.get("TRITON_INTERPRET") == "1" or _capturing():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise BitNestError("the triton backend needs a CUDA GPU (none found): use --backend cpu, or set "
                           "TRITON_INTERPRET=1 to run its kernels in the (slow) Triton interpreter")
    return torch.device("cuda")   # the kernel modules point Triton at the system ptxas (plugins.kernels.common)


def _capturing() -> bool:
    try:
        from plugins.kernels.common import capture_arch
    except ImportError:          # no triton: no capture either (`_kernels` says what to install)
        return False
    return capture_arch() is not None


def _kernels():
    try:
        import triton  # noqa: F401  (fail here, with the fix, rather than at the first pass)

        import plugins.kernels as k
    except ImportError as e:
        raise BitNestError(f"the triton backend needs triton ({e}): pip install triton") from e
    return k


class TritonBackend:
    """Linears and attention through the Triton kernels on the kernel device."""

    name = "triton"
    activations = "int8"
    dtype = torch.float32

    def __init__(self, ckpt: Checkpoint):
        self.device = kernel_device()
        self.k = _kernels()
        self.ckpt = ckpt
        t = ckpt.tensors
        self.layout = {}                               # nested linear -> TiledPlanes on the device
        for name in ckpt.linears:                      # move, tile, release: one linear's planes twice at most
            planes = [t.pop(name + s, None) for s in (".base", ".refine", ".scale", ".offset")]
            self.layout[name] = tile_planes(*(None if p is None else p.to(self.device) for p in planes))
            del planes
        for key, tensor in t.items():                  # the rest moves as it is: norms, biases, float16 weights
            t[key] = tensor.to(self.device)
        self.stacks = {}                               # linears read together -> (TiledPlanes, bias or None, widths)
        for layer in range(ckpt.config.num_layers):
            for group in STACKED:
                self._stack(tuple(f"model.layers.{layer}.{name}" for name in group))
        self.k.reserve(self.device)                    # the GEMV's split-K counters, before any graph capture
        groups = {planes.g for name, planes in self.layout.items() if name.endswith(O_PROJ)}
        self.attention_ops = AttentionOps(self, groups.pop() if len(groups) == 1 else None)
        from plugins.kernels.gemv_decode import DECODE_MAX_M
        from plugins.kernels.swiglu import MAX_FACTORS
        self.decode_max_m = DECODE_MAX_M               # the widest pass whose activations the decode GEMV reads
        self.gated_max_factors = MAX_FACTORS           # the R4 layouts `gated`'s one launch serves
        self._acts = (None, -1, 0, None)               # (x, its version, group size, its decode activations)

    def _stack(self, names: tuple) -> None:
        """Stack the planes of `names` (one launch reads them all, `linears`; each linear's planes become a view of
        its rows: one group's planes twice at most while it is made), where their shapes allow and their biases are
        all present or all absent."""
        parts, biases = [self.layout.get(n) for n in names], [self.ckpt.tensors.get(n + ".bias") for n in names]
        if None in parts or len({b is None for b in biases}) > 1:
            return
        try:
            whole, views = stack_rows(parts)
        except ValueError:
            return                                     # each launched on its own, as `linear`
        del parts
        self.layout.update(zip(names, views))
        bias = None if biases[0] is None else torch.cat([b.float() for b in biases])
        self.stacks[names] = (whole, bias, [v.n for v in views])

    def linears(self, names, x: torch.Tensor, view: str) -> tuple:
        """The outputs [M, N_i] of the linears `names` that read x, in one GEMV launch over their stacked planes
        (column views of its [M, sum N_i] output) where they were stacked at load, else one launch each. Each row
        is the decode kernel's over that linear's planes; only the split of K, planned for the stack's rows, may
        differ from a launch of its own (a float32 sum's order): every pass of the backend reads the same stack."""
        stack = self.stacks.get(tuple(names))
        if stack is None:
            return tuple(self.linear(n, x, view) for n in names)
        planes, bias, widths = stack
        y = self.k.dual_plane_linear_tiled(x, planes, view, acts=self._shared_acts(x, planes.g))
        return (y if bias is None else y + bias).split(widths, dim=1)

    def gated(self, names, x: torch.Tensor, view: str, r4_size, r4_factors) -> torch.Tensor:
        """down_proj's input [M, I]: silu(gate) * up of gate/up's one launch (`linears`), rotated by R4 (the Kronecker
        product of `r4_factors`; None: none). In a decode pass (M <= 8) one more launch computes it and quantizes it
        for down_proj (plugins.kernels.swiglu: down_proj's `_shared_acts` finds them), where torch takes ~4 ops a
        token; a prefill chunk, or a legacy R4 layout of three factors, takes torch's ops."""
        gate, up = self.linears(names, x, view)
        down = self.layout.get(names[0].rsplit(".", 1)[0] + ".down_proj")
        factors = tuple(r4_factors or ())
        if x.shape[0] > self.decode_max_m or down is None or len(factors) > self.gated_max_factors:
            return gated_r4(gate, up, r4_size, r4_factors)
        out, acts = self.k.swiglu_decode(gate, up, factors, down.g)
        self.share_acts(out, down.g, acts)
        return out

    def rms_norm(self, x: torch.Tensor, name: str, eps: float) -> torch.Tensor:
        """The decoder's RMSNorm [T, H] in one kernel launch (plugins.kernels.decoder_ops), on the float16 weight;
        in a decode pass (T <= 8) the same launch quantizes the result for the linears that read it next (q/k/v,
        gate/up, the head), where they would quantize it in a launch of their own (`_shared_acts`: the same bits)."""
        weight = self.ckpt.tensors[name + ".weight"]
        reader = self._reader(name)
        if x.shape[0] > self.decode_max_m or reader is None:
            return self.k.rms_norm(x.contiguous(), weight, eps)
        out, acts = self.k.rms_norm_decode(x.contiguous(), weight, eps, reader.g)
        self.share_acts(out, reader.g, acts)
        return out

    def rotate(self, x: torch.Tensor, r: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """An online rotation (R1) of x [T, H], x @ r or @ r^T: in a decode pass one launch that reads r once for every
        token (plugins.kernels.decoder_ops.rotate_decode, each row's bits independent of T), where torch's row-wise
        form reads the [H, H] matrix once a token; a prefill chunk takes torch's."""
        if x.shape[0] > self.decode_max_m:
            return rotate_rows(x, r, transpose)
        return self.k.rotate_decode(x, r, transpose)

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q, k rotated by position in one kernel launch (plugins.kernels.decoder_ops), bit for bit apply_rope's."""
        return self.k.rope(q, k, cos, sin)

    def _reader(self, norm: str):
        """The tiled planes of the nested linear that reads norm `norm`'s output first (its group size is the one
        the output is quantized at), or None (a float16 head, a norm this map does not know)."""
        if norm == FINAL_NORM:
            return self.layout.get(HEAD)
        prefix, _, kind = norm.rpartition(".")
        return self.layout.get(f"{prefix}.{NORM_READERS[kind]}") if kind in NORM_READERS else None

    def _shared_acts(self, x: torch.Tensor, g: int):
        """x's decode-layout INT8 activations at group size g, quantized once for the linears that read the same x
        (q/k/v, gate/up: one launch where there were three and two); None where x is no decode pass's (M > 8)."""
        if x.shape[0] > self.decode_max_m:
            return None
        last, version, group, acts = self._acts
        if not _same(last, x) or version != x._version or group != g:
            acts = self.k.quantize_decode(x.contiguous(), g)
            self.share_acts(x, g, acts)
        return acts

    def share_acts(self, x: torch.Tensor, g: int, acts) -> None:
        """Hand x's decode activations at group size g, made by another launch, to the linear that reads x next."""
        self._acts = (x, x._version, g, acts)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.device)
        if self.ckpt.embedding_from_head:   # the looked-up rows of the head's planes, target view
            rows = self.layout[HEAD].rows(ids)
            return nested_embedding(torch.arange(len(ids), device=self.device), *rows)
        return self.ckpt.tensors["model.embed_tokens.weight"][ids].float()

    def norm(self, name: str) -> torch.Tensor:
        return self.ckpt.tensors[name + ".weight"].float()

    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor:
        planes = self.layout[name]
        y = self.k.dual_plane_linear_tiled(x, planes, view, acts=self._shared_acts(x, planes.g))
        bias = self.ckpt.tensors.get(name + ".bias")
        return y if bias is None else y + bias.float()

    def linear_add(self, name: str, x: torch.Tensor, view: str, residual: torch.Tensor) -> torch.Tensor:
        """residual + linear(name, x): the residual stream added in the GEMV's own launch as each row finishes (one
        float32 add, torch's `residual + y` bits: o_proj's and down_proj's adds need no launch of their own); a
        linear with a bias adds both after it, in torch's order."""
        if self.ckpt.tensors.get(name + ".bias") is not None:
            return residual + self.linear(name, x, view)
        planes = self.layout[name]
        return self.k.dual_plane_linear_tiled(x, planes, view, acts=self._shared_acts(x, planes.g), residual=residual)

    def head_rows(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[M, K]: token m against the head's rows ids[m] at the target view (their planes gathered on the device,
        K rows each, in the canonical layout, through the same decode kernel as the whole head)."""
        head = self.layout[HEAD]
        out = []
        for m, r in enumerate(ids):
            base, refine, scale, offset = head.rows(r)
            out.append(self.k.dual_plane_linear(x[m:m + 1], base, refine, scale, "target", offset))
        return torch.cat(out)

    def head(self, x: torch.Tensor, view: str) -> torch.Tensor:
        """Logits [M, V] on the kernel device (the engine copies them to the CPU, where the sampler runs)."""
        if self.ckpt.head_nested:
            return self.linear(HEAD, x, view)
        t = self.ckpt.tensors
        w = t["model.embed_tokens.weight"] if self.ckpt.config.tie_word_embeddings else t["lm_head.weight"]
        return torch.cat([(r.half() @ w.T).float() for r in x.split(1)])   # row by row: batch invariant


def _same(a, b: torch.Tensor) -> bool:
    """a and b are the same values by construction: one tensor, or views of one memory with one shape and layout (the
    decoder's [T, Hq*D] view of attention's output is a new tensor object over the same bytes)."""
    return a is b or (a is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape and
                      a.stride() == b.stride() and a.device == b.device)


class AttentionOps:
    """The backend's `attention_ops` (edge.engine.kv_cache.AttentionOps): the kernels' KV writes and nested-KV flash
    decoding, where in a decode pass (T <= 8) the attention's chunk reduction also writes its output's INT8
    activations for o_proj (the token's last program quantizes its row: the launch o_proj's quantization took),
    handed to o_proj through the backend (`share_acts`); `group` None (o_projs of several group sizes) leaves
    o_proj to quantize its own."""

    def __init__(self, backend: TritonBackend, group):
        self.backend, self.k, self.group = backend, backend.k, group

    def write_kv(self, k, v, base, refine, scale, pos):
        return self.k.write_kv(k, v, base, refine, scale, pos)

    def write_kv_at(self, k, v, base, refine, scale, end):
        return self.k.write_kv_at(k, v, base, refine, scale, end)

    def rope_write_kv_at(self, q, k, v, cos, sin, base, refine, scale, end):
        """q rotated by position; k rotated and v written to the planes, in one launch (plugins.kernels.kv_write)."""
        return self.k.rope_write_kv_at(q, k, v, cos, sin, base, refine, scale, end)

    def nested_kv_attention(self, q, base, refine, scale, main_len, kv8_from, scratch=None, scratch_len=0):
        if not self._fused(q):
            return self.k.nested_kv_attention(q, base, refine, scale, main_len, kv8_from, scratch, scratch_len)
        return self._share(*self.k.nested_kv_attention(q, base, refine, scale, main_len, kv8_from, scratch,
                                                       scratch_len, quantize=self.group))

    def nested_kv_attention_at(self, q, base, refine, scale, main_len, seq_len, kv8_from, scratch=None):
        if not self._fused(q):
            return self.k.nested_kv_attention_at(q, base, refine, scale, main_len, seq_len, kv8_from, scratch)
        return self._share(*self.k.nested_kv_attention_at(q, base, refine, scale, main_len, seq_len, kv8_from,
                                                          scratch, quantize=self.group))

    def _fused(self, q) -> bool:
        hq, t, d = q.shape
        return self.group is not None and t <= self.backend.decode_max_m and (hq * d) % self.group == 0

    def _share(self, y: torch.Tensor, acts) -> torch.Tensor:
        """y [Hq, T, D] (a token-major buffer's view); its rows [T, Hq*D], the view the decoder hands o_proj."""
        self.backend.share_acts(y.transpose(0, 1).reshape(y.shape[1], -1), self.group, acts)
        return y
