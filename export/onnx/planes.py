"""A nested linear's planes as the step graph carries them (plugins.step_contract, weight layout): warp-tiled int32
words where the linear tiles (plugins.kernels.tiling: every linear of a real model), else canonical words, as
initializers shared by the linear's DualPlaneGemv node and, for a tied nested head, the embedding's row gather
(export.onnx.rows): stored once, in the layout the TensorRT plugin's decode kernel streams in 512-byte warp loads.

The lookup of rows in the tiled layout is built from standard ops TensorRT 10.3's parser imports on int32 (onnx-
tensorrt operators.md: Gather, Transpose, Div, Mul, Sub, Cast; GatherND with `batch_dims`, imported as an IGatherLayer
in kND mode with setNbElementWiseDims(batch_dims), onnxOpImporters.cpp, GatherND): the 32-row blocks of the ids are
gathered (32 rows each: a few KB a token), their lanes put first, and each id's lane picked by GatherND. Ids are
non-negative, so int32 division truncates and floors alike."""

import numpy as np
from onnx import TensorProto

from plugins.kernels.tiling import WARP_ROWS, tile_planes, tileable
from plugins.step_contract import as_words


def plane_inits(b, name: str, planes) -> tuple[str, str, str, str | None, bool]:
    """(base, refine, scale, offset-or-None initializer names, tiled) of the nested linear `name`; `planes` its
    canonical (base, refine, scale, offset-or-None) tensors. The first call adds the initializers, later ones reuse
    them (the head's DualPlaneGemv and its embedding gather)."""
    base, refine, scale, offset = planes
    names = [name + s for s in (".base", ".refine", ".scale", ".offset")]
    if names[0] not in b.inits:
        n, k = base.shape[0], base.shape[1] * 2
        if tileable(n, k, k // scale.shape[1]):
            t = tile_planes(base, refine, scale, offset)          # [N/32, K/G, G/32, 32, 16] bytes, [N/32, K/G, 32]
            base, refine, scale, offset = t.base, t.refine, t.scale, t.offset
        b.init(names[0], as_words(base))
        b.init(names[1], as_words(refine))
        b.init(names[2], scale)
        if offset is not None:
            b.init(names[3], offset)
    tiled = len(b.inits[names[0]].dims) == 5
    return names[0], names[1], names[2], names[3] if names[3] in b.inits else None, tiled


def tiled_row_picker(b, ids: str):
    """A function (initializer name) -> the rows `ids` [M] of a tiled initializer, flattened per row:
    words [N/32, K/G, G/32, 32, 4] -> [M, K/8], scales [N/32, K/G, 32] -> [M, K/G]."""
    block_rows = b.init("tiled.rows", np.asarray(WARP_ROWS, np.int32))
    ids32 = b.op("Cast", [ids], to=TensorProto.INT32)                                              # [M]
    blk = b.op("Div", [ids32, block_rows])                                                        # [M]
    lane = b.op("Sub", [ids32, b.op("Mul", [blk, block_rows])])                                   # [M]
    lane = b.op("Cast", [b.op("Unsqueeze", [lane, b.const_i64("tiled.axis_last", [-1])])], to=TensorProto.INT64)

    def pick(init: str) -> str:
        blocks = b.op("Gather", [init, blk], axis=0)                       # [M, K/G, G/32, 32, 4] or [M, K/G, 32]
        perm = [0, 3, 1, 2, 4] if len(b.inits[init].dims) == 5 else [0, 2, 1]
        rows = b.op("GatherND", [b.op("Transpose", [blocks], perm=perm), lane], batch_dims=1)
        return b.op("Reshape", [rows, b.const_i64("tiled.flat_rows", [0, -1])])                 # [M, K/8] / [M, K/G]
    return pick
