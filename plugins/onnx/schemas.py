"""ONNX OpSchemas of the `bitnest` domain (DualPlaneGemv, NestedKvAttention) with type and shape
inference, registered once into the installed onnx so `onnx.checker.check_model(full_check=True)` and
shape inference understand exported graphs."""

import onnx
from onnx import TensorProto
from onnx.defs import OpSchema

from plugins.contracts import (
    DOMAIN,
    DOMAIN_VERSION,
    DUAL_PLANE_LINEAR,
    NESTED_KV_ATTENTION,
)
from plugins.step_contract import TILE_ROWS

_P = OpSchema.FormalParameter
_OPTIONAL = OpSchema.FormalParameterOption.Optional

_GEMV_DOC = """y[M, N] = x[M, K] @ W_view^T from packed nested planes (int32 words of 4 bytes, plugins.step_contract) (docs/contracts.md, weights and ops; reference:
plugins.reference.dual_plane_linear with act_int8=True). x is quantized per token to symmetric INT8
(docs/contracts.md, activations); each group's integer dot product is exact before its float16 group scale is applied.
`view` = 0 (draft) reads base + scale only and never touches `refine`; 1 (target) reads both planes as
the 8-bit code 16*q4 + qr on scale/16. Optional `offset` [N, K/G] adds offset * sum(x_group) (top4of8)."""

_ATTN_DOC = """Causal GQA attention of q over one layer's nested KV cache (docs/contracts.md, KV cache and ops; reference:
plugins.reference.nested_kv_attention). k, v [Hkv, T, D] (after RoPE) are quantized into new KV4+KV4
entries (plugins.kv.quantize_kv) for positions [seq_len - T, seq_len); the op attends over positions
[0, seq_len) of the planes with those T positions taken from the new entries, reading positions before
`kv8_from` at KV4 and the rest at KV8, and returns the output and the planes with the entries written. Planes
are int32 words of 4 packed bytes. See plugins.step_contract for the in-place contract (TensorRT aliases each
plane output to its plane input and writes in place)."""


def _tensor_type(elem: int, dims) -> onnx.TypeProto:
    """TypeProto of a tensor whose dims are ints, dim_param strings, or Dimension protos to copy."""
    t = onnx.TypeProto()
    t.tensor_type.elem_type = elem
    shape = t.tensor_type.shape
    for d in dims:
        nd = shape.dim.add()
        if isinstance(d, int):
            nd.dim_value = d
        elif isinstance(d, str):
            nd.dim_param = d
        else:
            nd.CopyFrom(d)
    return t


def _dims(ctx, i: int):
    """Dimension protos of input i (None where its rank is unknown)."""
    tt = ctx.get_input_type(i).tensor_type
    return list(tt.shape.dim) if tt.HasField("shape") else None


def _infer_gemv(ctx) -> None:
    x, base = _dims(ctx, 0), _dims(ctx, 1)
    if x is None or base is None:
        ctx.set_output_type(0, _unranked(TensorProto.FLOAT))
        return
    rows = base[0]
    if len(base) == 5:       # warp-tiled words [N/32, K/G, G/32, 32, 4] (plugins.step_contract): N = 32 x dim 0
        rows = rows.dim_value * TILE_ROWS if rows.HasField("dim_value") else onnx.TensorShapeProto.Dimension()
    ctx.set_output_type(0, _tensor_type(TensorProto.FLOAT, [x[0], rows]))


def _infer_attention(ctx) -> None:
    q = _dims(ctx, 0)
    elems = (TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT32, TensorProto.FLOAT16)
    for i, (elem, dims) in enumerate(zip(elems, (q, _dims(ctx, 3), _dims(ctx, 4), _dims(ctx, 5)))):
        ctx.set_output_type(i, _unranked(elem) if dims is None else _tensor_type(elem, dims))   # planes: as input


def _unranked(elem: int) -> onnx.TypeProto:
    t = onnx.TypeProto()
    t.tensor_type.elem_type = elem
    return t


def _gemv_schema() -> OpSchema:
    s = OpSchema(
        DUAL_PLANE_LINEAR.graph, DOMAIN, DOMAIN_VERSION, _GEMV_DOC,
        inputs=[
            _P("x", "tensor(float)", "activations [M, K]"),
            _P("base", "tensor(int32)", "base plane [N, K/8] words ([N, K/2] bytes), signed nibbles, low = even "
               "column; or warp-tiled [N/32, K/G, G/32, 32, 4] (plugins.step_contract, weight layout)"),
            _P("refine", "tensor(int32)", "refinement plane, as base (not read by the draft view)"),
            _P("scale", "tensor(float16)", "group scales [N, K/G], or [N/32, K/G, 32] with tiled planes"),
            _P("view", "tensor(int64)", "[1]: 0 = draft, 1 = target"),
            _P("offset", "tensor(float16)", "optional group offsets (top4of8), as scale", param_option=_OPTIONAL),
        ],
        outputs=[_P("y", "tensor(float)", "[M, N]")],
        node_determinism=OpSchema.NodeDeterminism.Deterministic,
    )
    return s.set_type_and_shape_inference_function(_infer_gemv) or s


def _attention_schema() -> OpSchema:
    s = OpSchema(
        NESTED_KV_ATTENTION.graph, DOMAIN, DOMAIN_VERSION, _ATTN_DOC,
        inputs=[
            _P("q", "tensor(float)", "queries [Hq, T, D] after RoPE"),
            _P("k", "tensor(float)", "new keys [Hkv, T, D] after RoPE"),
            _P("v", "tensor(float)", "new values [Hkv, T, D]"),
            _P("kv_base", "tensor(int32)", "KV4 base plane [2, Hkv, C, D/8] words (K then V)"),
            _P("kv_refine", "tensor(int32)", "KV4 refinement plane [2, Hkv, C, D/8] words"),
            _P("kv_scale", "tensor(float16)", "per-vector scales [2, Hkv, C]"),
            _P("seq_len", "tensor(int64)", "[1]: S, sequence length including this pass"),
            _P("kv8_from", "tensor(int64)", "[1]: first position read at KV8"),
        ],
        outputs=[
            _P("out", "tensor(float)", "[Hq, T, D]"),
            _P("kv_base_out", "tensor(int32)", "kv_base with the entries of positions [S - T, S) written"),
            _P("kv_refine_out", "tensor(int32)", "kv_refine with the entries written"),
            _P("kv_scale_out", "tensor(float16)", "kv_scale with the entries written"),
        ],
        node_determinism=OpSchema.NodeDeterminism.Deterministic,
    )
    return s.set_type_and_shape_inference_function(_infer_attention) or s


_registered = False


def register_schemas() -> None:
    """Register both schemas into the onnx library of this process (idempotent)."""
    global _registered
    if _registered:
        return
    for schema in (_gemv_schema(), _attention_schema()):
        try:
            onnx.defs.get_schema(schema.name, DOMAIN_VERSION, DOMAIN)
        except onnx.defs.SchemaError:
            onnx.defs.register_schema(schema)
    _registered = True


def bitnest_node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """{op type: count} of the graph's `bitnest` nodes."""
    counts: dict[str, int] = {}
    for n in model.graph.node:
        if n.domain == DOMAIN:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts
