"""`cpu` backend: the planes re-laid in place (at load) into PyTorch's CPU int4 GEMM layout, one
`_weight_int4pack_mm_for_cpu` call for the draft view and two for the target view.

Numerics (reported in its name and stats): bfloat16 activations and bfloat16 group scales (the op's
only activation and scale dtype); the float16 head is applied to float16 activations. Lossless speculation
needs each row of a verification pass to equal the single-token step bit for bit. On torch 2.13 both the int4
op and the float16 GEMM are row-invariant for M <= 40 under every CPU dispatch this machine offers (default,
avx2, avx512; tests/test_row_invariance.py), but that is a property of the kernels torch picks, not of the
format: every GEMM here goes through `RowInvariance`, which checks each (GEMM, M) once where it runs and
falls back to row-by-row calls where rows differ, reporting it in the stats (`gemm_row_by_row`).
"""

import functools

import torch

from edge.backends.row_check import RowInvariance
from edge.errors import BitNestError
from edge.model.checkpoint import EMBED, HEAD, Checkpoint
from edge.model.draft_head import DRAFT_HEAD_SHORTLIST
from plugins.contracts import REFINE_DIVISOR
from plugins.packing import unpack_nibbles

_INNER_K_TILES = 2
_ROW_BLOCKS = (64, 32, 16)   # rows per block of the op's packed layout: torch 2.13 packs 64 where it dispatches
                             # AVX-512 and 32 on an AVX2-only CPU (`row_block` finds which, on this machine)


def cpu_int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and \
        hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


_RELAY_ROWS = 4096  # rows converted at a time: the int32 codes of a 49152-row head would be 113 MB at once


@functools.lru_cache(maxsize=None)
def row_block() -> int | None:
    """Rows per block of `_convert_weight_to_int4pack_for_cpu`'s layout where this process runs (a property of the
    kernel torch dispatches, not of the format), found by packing 128 rows of known codes on the CPU and reading them
    back; None where the layout is none of `_ROW_BLOCKS` (torch's scalar `default` dispatch: the GEMMs still run, but
    no row of the planes can be read back)."""
    n, k = 128, 64
    cols, rows = torch.arange(k, device="cpu"), torch.arange(n, device="cpu")
    codes = ((rows[:, None] * 7 + cols[None, :] * 3) % 16).to(torch.int32)                        # [n, K]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, _INNER_K_TILES)
    for block in _ROW_BLOCKS:
        if packed.numel() == n * k // 2 and torch.equal(_relaid_rows(packed, rows, k, block), codes):
            return block
    return None


def _relay(plane: torch.Tensor) -> torch.Tensor:
    """Canonical signed-nibble plane uint8 [N, K/2] -> the op's packed layout (same byte count), in blocks of rows
    (the layout is row-block-major: blocks converted apart concatenate to the whole, tests/test_embedding_from_head)."""
    def convert(rows: torch.Tensor) -> torch.Tensor:
        codes = unpack_nibbles(rows).to(torch.int32) + 8                    # [n, K] in [0, 15]
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, _INNER_K_TILES)
    block = row_block()
    if plane.shape[0] <= _RELAY_ROWS or block is None or plane.shape[0] % block:
        return convert(plane)
    return torch.cat([convert(plane[i:i + _RELAY_ROWS]) for i in range(0, plane.shape[0], _RELAY_ROWS)])


def _relaid_rows(packed: torch.Tensor, ids: torch.Tensor, k: int, block: int | None = None) -> torch.Tensor:
    """Codes [T, K] in [0, 15] of rows `ids` read back from the op's packed layout (torch 2.13's CPU layout: blocks
    of `block` rows (`row_block`: 64 or 32) as [N/block, K, block/2] bytes, row block*b + j in the low nibble of
    byte j, row block*b + block/2 + j in the high one; tests/test_embedding_from_head.py checks it against the
    canonical planes bit for bit)."""
    block = block or row_block()
    blocks = packed.view(torch.uint8).reshape(-1, k, block // 2)            # [N/block, K, block/2]
    j = ids % block
    b = blocks[ids // block, :, j % (block // 2)]                           # [T, K] bytes
    return torch.where((j < block // 2).unsqueeze(1), b & 0xF, b >> 4).to(torch.int32)


def _scales_and_zeros(scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """[N, K/G] float16 -> [K/G, N, 2] bfloat16 (scale, zero): the op computes (q - 8) * scale + zero."""
    zero = torch.zeros_like(scale) if offset is None else offset
    return torch.stack((scale.T, zero.T), dim=-1).to(torch.bfloat16).contiguous()


class CpuInt4Backend:
    """Both views from the re-laid planes (the canonical planes are replaced); attention by dequantize + SDPA."""

    name = "cpu"
    activations = "bfloat16"
    device = None
    attention_ops = None

    def __init__(self, ckpt: Checkpoint):
        if not cpu_int4_available():
            raise BitNestError("this torch build lacks _weight_int4pack_mm_for_cpu: use --backend torch")
        self.ckpt, self.dtype = ckpt, torch.float32
        self.layout: dict[str, tuple] = {}
        t = ckpt.tensors
        for name, spec in ckpt.linears.items():
            base, refine, scale, offset = (t.pop(name + s, None) for s in (".base", ".refine", ".scale", ".offset"))
            sz_base = _scales_and_zeros(scale, offset)
            # the refinement reuses the base scales on x/16 (exact in bf16) unless an offset must be left out
            sz_ref = sz_base if offset is None else _scales_and_zeros(scale, None)
            # a `--weights base` load has no refinement plane here (None): the target view is refused before a pass
            self.layout[name] = (_relay(base), None if refine is None else _relay(refine), sz_base,
                                 None if refine is None else sz_ref, spec.group_size)
        rows_read = ckpt.embedding_from_head or ckpt.draft_head == DRAFT_HEAD_SHORTLIST
        if rows_read and row_block() is not None and ckpt.linears[HEAD].shape[0] % row_block():
            raise BitNestError(f"the cpu backend reads rows of the head's planes (embedding, shortlist) in blocks of "
                               f"{row_block()} rows, and this vocabulary is not a multiple of it: use --backend torch")
        self.head_w = None if ckpt.head_nested else \
            t[EMBED if ckpt.config.tie_word_embeddings else "lm_head.weight"]
        self.rows = RowInvariance()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.ckpt.embedding_from_head:
            return self.ckpt.tensors[EMBED][ids].float()
        return self._head_target_rows(ids)

    def _head_target_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [T, K]: target-view rows `ids` [T] of the nested head from the re-laid planes, as this backend's
        target linear computes them: (q4 s + zero) + qr s/16 with its bfloat16 scales."""
        if row_block() is None:     # checked where rows are read: the GEMMs run under any dispatch
            raise BitNestError("the cpu backend reads rows of the head's planes (embedding, shortlist), and this "
                               "torch dispatch packs them in a layout it cannot read rows from: use --backend torch")
        base, refine, sz_base, sz_ref, g = self.layout[HEAD]
        k = self.ckpt.linears[HEAD].shape[1]
        q4 = (_relaid_rows(base, ids, k) - 8).float()                           # [T, K]
        qr = (_relaid_rows(refine, ids, k) - 8).float()
        scale = sz_base[:, ids, 0].T.float().repeat_interleave(g, dim=1)        # [T, K]
        zero = sz_base[:, ids, 1].T.float().repeat_interleave(g, dim=1)
        ref_scale = sz_ref[:, ids, 0].T.float().repeat_interleave(g, dim=1)
        return q4 * scale + zero + qr * ref_scale / REFINE_DIVISOR

    def head_rows(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[M, K]: token m (at this backend's bfloat16 activations) against the head's rows ids[m] at the target view,
        read back from the re-laid planes (K rows per token), in float32."""
        m, k = ids.shape
        rows = self._head_target_rows(ids.reshape(-1)).view(m, k, -1)          # [M, K, H]
        xb = x.to(torch.bfloat16).float()                                      # [M, H]
        return torch.bmm(rows, xb.unsqueeze(-1)).squeeze(-1)                   # [M, K]

    def norm(self, name: str) -> torch.Tensor:
        return self.ckpt.tensors[name + ".weight"].float()

    def gemm(self, name: str, view: str):
        """(key, fn): the raw GEMM of linear `name` at `view`, fn(x [M, K]) -> [M, N] float32 without the bias, and
        the key RowInvariance knows it by. `linear` runs it through RowInvariance."""
        base, refine, sz_base, sz_ref, g = self.layout[name]
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu

        def fn(xx: torch.Tensor) -> torch.Tensor:                       # [M, K] -> [M, N]
            xb = xx.to(torch.bfloat16)
            y = mm(xb, base, g, sz_base).float()
            if view == "target":
                y = y + mm(xb / REFINE_DIVISOR, refine, g, sz_ref).float()
            return y

        n, k = self.ckpt.linears[name].shape
        return f"int4 {view} {n}x{k} g{g}{' offset' if sz_ref is not None and sz_ref is not sz_base else ''}", fn

    def head_gemm(self, view: str):
        """(key, fn): the raw GEMM of the head at `view` (a nested head's is its linear's)."""
        if self.head_w is None:
            return self.gemm(HEAD, view)
        w = self.head_w
        return f"float16 head {w.shape[0]}x{w.shape[1]}", lambda xx: (xx.to(w.dtype) @ w.T).float()

    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor:
        y = self.rows.run(*self.gemm(name, view), x)
        bias = self.ckpt.tensors.get(name + ".bias")
        return y if bias is None else y + bias.float()

    def head(self, x: torch.Tensor, view: str) -> torch.Tensor:
        if self.head_w is None:
            return self.linear(HEAD, x, view)
        return self.rows.run(*self.head_gemm(view), x)

    def numerics(self) -> dict:
        """What the stats report about this backend's arithmetic beyond its activations."""
        return self.rows.report()
