"""The warp-tiled plane layout the decode GEMV streams on a GPU (docs/kernels.md, "The decode GEMV: why this
layout"): the canonical planes re-laid once at load, in place of them (no second copy of any weight).

In the canonical layout (uint8 [N, K/2], docs/contracts.md) a row is contiguous, so a warp whose 32 lanes own 32
rows (the decode kernel: one row per thread, sequential groups, exact int32 group sums) loads 16 bytes from each of
32 rows 2-14 KB apart: 32 cache lines per load instruction and, in DRAM, 32 pages open for 16-64 bytes each. Tiled,
the 16-byte chunk c of group g of the 32 rows of block b lie side by side:

    base / refine  uint8   [ceil(N/32), K/G, G/32, 32, 16]   (block, group, chunk, row in block, byte)
    scale / offset float16 [ceil(N/32), K/G, 32]              (block, group, row in block)

so the same load instruction reads 512 contiguous bytes (four lines), a group of a block is G/2 x 32 contiguous
bytes, and a split of K a block's contiguous run of groups. Only the addresses change: every thread still holds its
own row, the dp4a work and the order of the float32 steps are the canonical kernel's, and the rows it computes are
bit for bit the canonical launch's (tested). Rows past N (the last block's padding) are zeros and never stored.
"""

from dataclasses import dataclass
from typing import Optional

import torch

from plugins.step_contract import TILE_ROWS as WARP_ROWS   # rows of a block: one per lane of a warp
from plugins.step_contract import as_bytes

CHUNK_BYTES = 16      # bytes of a plane row one 128-bit load reads (32 columns of 4-bit codes)


@dataclass
class TiledPlanes:
    """One nested linear's planes in the warp-tiled layout; `n`, `k`, `g` its canonical shape and group size."""

    base: torch.Tensor
    refine: Optional[torch.Tensor]
    scale: torch.Tensor
    offset: Optional[torch.Tensor]
    n: int
    k: int
    g: int

    def rows(self, ids: torch.Tensor) -> tuple:
        """(base, refine, scale, offset) of rows `ids` [R] in the canonical layout ([R, K/2], [R, K/G]): the rows
        the shortlist re-scores and an embedding lookup reads, gathered on the planes' device."""
        ids = ids.to(self.base.device)
        blk, lane = ids // WARP_ROWS, ids % WARP_ROWS

        def plane(t):                    # [NB, K/G, CH, 32, 16] -> [R, K/G, CH, 16] -> [R, K/2]
            return None if t is None else t[blk, :, :, lane, :].reshape(len(ids), self.k // 2)

        def per_group(t):                # [NB, K/G, 32] -> [R, K/G]
            return None if t is None else t[blk, :, lane]
        return plane(self.base), plane(self.refine), per_group(self.scale), per_group(self.offset)

    @classmethod
    def from_words(cls, base, refine, scale, offset=None) -> "TiledPlanes":
        """The planes as the step graph carries them (int32 words [N/32, K/G, G/32, 32, 4], float16 [N/32, K/G, 32];
        export.onnx.planes): viewed as bytes, no copy. ValueError where the shapes are not one tiled linear's."""
        words = (WARP_ROWS, CHUNK_BYTES // 4)
        fits = base.dim() == 5 and tuple(base.shape[3:]) == words and tuple(scale.shape) == (*base.shape[:2], WARP_ROWS)
        if not fits or (refine is not None and refine.shape != base.shape) or \
                (offset is not None and offset.shape != scale.shape):
            raise ValueError(f"planes {tuple(base.shape)} / scale {tuple(scale.shape)} are not one linear's warp-tiled "
                             "words ([N/32, K/G, G/32, 32, 4] int32, scales [N/32, K/G, 32])")
        blocks, groups, chunks = base.shape[:3]
        g = chunks * 32
        view = lambda t: None if t is None else as_bytes(t)
        return cls(view(base), view(refine), scale, offset, blocks * WARP_ROWS, groups * g, g)

    def canonical(self) -> tuple:
        """All rows in the canonical layout (tests and checks; the runtime never holds both)."""
        return self.rows(torch.arange(self.n))


def tileable(n: int, k: int, g: int) -> bool:
    """Whether a linear of N rows, K columns and group size G tiles with no padding row (every real model's
    linears: N a multiple of 32; G a power of two >= 32 dividing K, as the kernels require)."""
    return n % WARP_ROWS == 0 and g >= 32 and not g & (g - 1) and k % g == 0


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return t if t.shape[0] == rows else torch.cat((t, t.new_zeros(rows - t.shape[0], *t.shape[1:])))


def tile_plane(plane: torch.Tensor, g: int) -> torch.Tensor:
    """uint8 [N, K/2] -> [ceil(N/32), K/G, G/32, 32, 16] (zero rows past N)."""
    n, half = plane.shape
    nb = -(-n // WARP_ROWS)
    t = _pad_rows(plane, nb * WARP_ROWS).view(nb, WARP_ROWS, (2 * half) // g, g // 32, CHUNK_BYTES)
    return t.permute(0, 2, 3, 1, 4).contiguous()


def tile_groups(t: torch.Tensor) -> torch.Tensor:
    """float16 [N, K/G] -> [ceil(N/32), K/G, 32] (zero rows past N)."""
    n, groups = t.shape
    nb = -(-n // WARP_ROWS)
    return _pad_rows(t, nb * WARP_ROWS).view(nb, WARP_ROWS, groups).transpose(1, 2).contiguous()


def tile_planes(base: torch.Tensor, refine, scale: torch.Tensor, offset=None) -> TiledPlanes:
    """Canonical planes (uint8 [N, K/2], float16 [N, K/G]) -> TiledPlanes on the same device. The group size must be
    a power of two >= 32 (as the kernels require); a None refinement (a base-only load) stays None."""
    n, k = base.shape[0], base.shape[1] * 2
    g = k // scale.shape[1]
    if scale.shape[0] != n or k % g or g < 32 or g & (g - 1):
        raise ValueError(f"planes {tuple(base.shape)} / scale {tuple(scale.shape)} cannot be tiled: the group size "
                         "must be a power of two >= 32 that divides K")
    tiled = lambda t: None if t is None else tile_plane(t, g)
    groups = lambda t: None if t is None else tile_groups(t)
    return TiledPlanes(tiled(base), tiled(refine), groups(scale), groups(offset), n, k, g)


def stack_rows(parts: list) -> tuple["TiledPlanes", list]:
    """(one TiledPlanes whose rows are the parts' rows one after another, each part again as a view of its own blocks
    in it): the linears that read one input (q/k/v, gate/up) in one launch, and each still readable alone, with no
    second copy once the parts are released. ValueError unless every part has whole blocks (N a multiple of 32), the
    same K and G, and the same planes and offsets present."""
    first = parts[0]
    same = all(p.k == first.k and p.g == first.g and (p.refine is None) == (first.refine is None)
               and (p.offset is None) == (first.offset is None) and p.n % WARP_ROWS == 0 for p in parts)
    if not same:
        raise ValueError("only linears of whole 32-row blocks with one K, group size, planes and offsets stack")
    cat = lambda ts: None if ts[0] is None else torch.cat(ts)                 # along the blocks (dim 0)
    whole = TiledPlanes(cat([p.base for p in parts]), cat([p.refine for p in parts]), cat([p.scale for p in parts]),
                        cat([p.offset for p in parts]), sum(p.n for p in parts), first.k, first.g)
    views, b0 = [], 0
    for p in parts:
        b1 = b0 + p.n // WARP_ROWS
        cut = lambda t: None if t is None else t[b0:b1]                        # contiguous: whole blocks
        views.append(TiledPlanes(cut(whole.base), cut(whole.refine), cut(whole.scale), cut(whole.offset), p.n, p.k,
                                 p.g))
        b0 = b1
    return whole, views
