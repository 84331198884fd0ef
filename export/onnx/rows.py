"""The step graph's lookup of nested rows: the target view (16 q4 + qr) s/16 (+ offset) of rows `ids` of a nested
linear whose planes travel as int32 words (plugins.step_contract), built from standard ONNX ops that TensorRT 10.3
imports on int32 (the input embedding of a checkpoint whose tied head is nested, manifest embedding `head_target`).

Why these ops (onnx-tensorrt operators.md at 10.1-GA, the parser 10.3 ships with the same table for these ops):
BitShift and BitwiseAnd are "N" (not imported), uint8 only at network I/O; Gather, Less, Where, Add, Sub, Mul, Div
and Cast take INT32. So a word's eight nibbles come from integer division by powers of 16 of NON-NEGATIVE values
only (truncating and flooring division agree there, whichever TensorRT's kDIV does on int32): a negative word (its
top nibble >= 8) first has 2^31 added in two steps of 2^30 (no int32 overflow), which clears the sign bit and keeps
bits 0..30, and its top nibble gets the 8 back. Nibble i of word j is column 8j + i (byte j of a row holds columns
2j, 2j + 1 in its low and high nibble; words are 4 bytes, little-endian). A nibble n in [0, 15] is the code
n - 16 (n >= 8), i.e. n - 16 ((n + 8) / 16). Codes and the 8-bit code 16 q4 + qr stay exact int32; one Cast to
float32, and c · s/16 is exact in float32 (|c| <= 136, an 11-bit float16 significand), so the rows equal the
torch backend's and the reference's bit for bit."""

import numpy as np
from onnx import TensorProto

WORD_NIBBLES = 8
NIBBLE = 16


def _unpack_words(b, words: str, cols: int) -> str:
    """int32 words [M, W] -> signed 4-bit codes int32 [M, cols = 8W] (column 8j + i = nibble i of word j)."""
    i32 = lambda name, v: b.init(f"rows.{name}", np.asarray(v, np.int32))
    zero, eight, sixteen, half = i32("zero", 0), i32("eight", 8), i32("sixteen", NIBBLE), i32("two30", 1 << 30)
    powers = i32("nibble_divisors", [NIBBLE ** i for i in range(WORD_NIBBLES)])               # [8]: 16^i
    last = i32("last_nibble", [0] * (WORD_NIBBLES - 1) + [1])                                # [8]
    axis = b.const_i64("rows.axis_last", [-1])
    negative = b.op("Less", [words, zero])                                                     # [M, W] bool
    low31 = b.op("Where", [negative, b.op("Add", [b.op("Add", [words, half]), half]), words])   # bits 0..30, >= 0
    spread = b.op("Div", [b.op("Unsqueeze", [low31, axis]), powers])                           # [M, W, 8], >= 0
    nibbles = b.op("Sub", [spread, b.op("Mul", [b.op("Div", [spread, sixteen]), sixteen])])    # spread mod 16
    bit31 = b.op("Unsqueeze", [b.op("Where", [negative, eight, zero]), axis])                  # [M, W, 1]: 8 or 0
    nibbles = b.op("Add", [nibbles, b.op("Mul", [bit31, last])])                               # top nibble's bit 3
    codes = b.op("Sub", [nibbles, b.op("Mul", [b.op("Div", [b.op("Add", [nibbles, eight]), sixteen]), sixteen])])
    return b.op("Reshape", [codes, b.const_i64(f"rows.shape_{cols}", [-1, cols])])            # [M, 8W]


def nested_rows(b, name: str, planes, group_size: int, ids: str, out: str | None = None) -> str:
    """float32 [M, K] target-view rows `ids` [M] of the nested linear `name` (planes: its canonical base, refine,
    scale, offset-or-None; the initializers are the ones its DualPlaneGemv node reads, stored once, warp-tiled where
    the linear tiles: export.onnx.planes)."""
    from export.onnx.planes import plane_inits, tiled_row_picker
    k = planes[0].shape[1] * 2
    base, refine, scale, offset, tiled = plane_inits(b, name, planes)
    # rows `ids` of a words initializer -> [M, K/8], of a scales one -> [M, K/G]
    rows_of = tiled_row_picker(b, ids) if tiled else lambda init: b.op("Gather", [init, ids], axis=0)
    q4 = _unpack_words(b, rows_of(base), k)
    qr = _unpack_words(b, rows_of(refine), k)
    sixteen = b.init("rows.sixteen", np.asarray(NIBBLE, np.int32))
    code8 = b.op("Cast", [b.op("Add", [b.op("Mul", [q4, sixteen]), qr])], to=TensorProto.FLOAT)   # [M, K] exact
    grouped = b.const_i64(f"rows.groups_{k}_{group_size}", [-1, k // group_size, group_size])
    step = b.op("Div", [b.op("Cast", [rows_of(scale)], to=TensorProto.FLOAT),
                        b.init("rows.sixteen_f32", np.asarray(NIBBLE, np.float32))])               # [M, K/G]
    rows = b.op("Mul", [b.op("Reshape", [code8, grouped]),
                        b.op("Unsqueeze", [step, b.const_i64("rows.axis_last", [-1])])])             # [M, K/G, G]
    if offset is not None:
        off = b.op("Cast", [rows_of(offset)], to=TensorProto.FLOAT)
        rows = b.op("Add", [rows, b.op("Unsqueeze", [off, b.const_i64("rows.axis_last", [-1])])])
    return b.op("Reshape", [rows, b.const_i64(f"rows.shape_{k}", [-1, k])], out=out)
