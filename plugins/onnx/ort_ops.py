"""onnxruntime CPU implementations of the `bitnest` ops and functions, as onnxruntime-extensions Python
custom ops: the linear by the reference semantics (plugins.reference.dual_plane_linear_int8: exact INT8
activations, docs/contracts.md, activations), attention and the float functions (RmsNorm, SiluMul, RotateRows, HadamardRows)
by the torch backend's own float math (plugins.decoder_math), so the CPU graph reproduces the torch
backend's quantizer inputs bit for bit; and the session factory that maps the graph onto the extensions.

With `inline_functions` (the independent check, edge.checks.onnx_check) the four functions are instead inlined
into their standard-op bodies (as the TensorRT build does) and run by onnxruntime's own kernels; only the two ops
stay Python ops.

onnxruntime-extensions runs Python ops only in its own domain (`default_opset_domain()`, i.e.
`ai.onnx.contrib`) with a fixed list of input types per op type, so `ort_model` rewrites a copy of
the graph: every `bitnest` node moves to that domain, and a DualPlaneGemv node that carries the optional
`offset` input becomes `DualPlaneGemvOffset` (same semantics, six inputs). Python ops do not take
float16, so float16 inputs (scales, offsets) reach them through a Cast to float32 and float16 outputs
(new KV scales) leave through a Cast back, both exact. The file on disk is untouched.
"""

from pathlib import Path

import numpy as np
import torch

from plugins import reference
from plugins.contracts import CODE_VIEWS, DOMAIN, DUAL_PLANE_LINEAR, NESTED_KV_ATTENTION
from plugins.decoder_math import (
    attention,
    hadamard_rows,
    rms_norm,
    rotate_rows,
    silu_mul,
)
from plugins.kernels.tiling import TiledPlanes
from plugins.kv import dequantize_kv_mixed, quantize_kv
from plugins.step_contract import (
    HADAMARD_FACTORS,
    HADAMARD_ROWS,
    RMS_NORM,
    ROTATE_ROWS,
    SILU_MUL,
    as_bytes,
    as_words,
    parse_factors_attribute,
)

GEMV_WITH_OFFSET = DUAL_PLANE_LINEAR.graph + "Offset"


def dual_plane_gemv(x: np.ndarray, base: np.ndarray, refine: np.ndarray, scale: np.ndarray, view: np.ndarray,
                    offset: np.ndarray | None = None) -> np.ndarray:
    """float32 y [M, N] of DualPlaneGemv over int32-word planes, canonical [N, K/8] or warp-tiled [N/32, K/G, G/32,
    32, 4] (plugins.step_contract, weight layout; re-laid to canonical rows here, the reference's input); the draft
    view never reads `refine`."""
    v = CODE_VIEWS.get(int(view.reshape(-1)[0]))
    if v is None:
        raise ValueError(f"DualPlaneGemv: view code {int(view.reshape(-1)[0])} is not 0 (draft) or 1 (target)")
    t = lambda a: None if a is None else torch.from_numpy(a)
    if base.ndim == 5:
        tiled = TiledPlanes.from_words(t(base), t(refine) if v == "target" else None, t(scale), t(offset))
        planes = tiled.canonical()                                   # [N, K/2] bytes, [N, K/G]
    else:
        planes = (t(as_bytes(base)), t(as_bytes(refine)) if v == "target" else None, t(scale), t(offset))
    return reference.dual_plane_linear_int8(torch.from_numpy(x), *planes).numpy()           # [M, N]


# Positions of the float16 inputs and outputs of each op (they cross the Python-op boundary as float32).
_F16_INPUTS = {DUAL_PLANE_LINEAR.graph: (3, 5), NESTED_KV_ATTENTION.graph: (5,)}
_F16_OUTPUTS = {NESTED_KV_ATTENTION.graph: (3,)}


def nested_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_base: np.ndarray, kv_refine: np.ndarray,
                        kv_scale: np.ndarray, seq_len: np.ndarray, kv8_from: np.ndarray):
    """(out [Hq, T, D] float32, the planes after the pass: base, refine int32 words [2, Hkv, C, D/8], scale
    [2, Hkv, C]) — new arrays: the inputs are not modified (ONNX semantics).

    The reference's semantics (plugins.reference.nested_kv_attention) computed in the torch backend's
    float32 arithmetic (dequantize, then plugins.decoder_math.attention), so its output rounds as the
    torch backend's does and the next INT8 activation codes match."""
    s, t, cap = int(seq_len.reshape(-1)[0]), q.shape[1], kv_base.shape[2]
    if not t <= s <= cap:
        raise ValueError(f"NestedKvAttention: seq_len {s} must lie in [{t} tokens of the pass, capacity {cap}]")
    nb, nr, ns = quantize_kv(torch.stack((torch.from_numpy(k), torch.from_numpy(v))))  # [2, Hkv, T, D/2], [2, Hkv, T]
    base, refine = (torch.from_numpy(as_bytes(a).copy()) for a in (kv_base, kv_refine))  # [2, Hkv, C, D/2] bytes
    scale = torch.from_numpy(kv_scale.copy())                                            # [2, Hkv, C]
    base[:, :, s - t:s], refine[:, :, s - t:s], scale[:, :, s - t:s] = nb, nr, ns
    kv = dequantize_kv_mixed(base[:, :, :s], refine[:, :, :s], scale[:, :, :s], int(kv8_from.reshape(-1)[0]))
    out = attention(torch.from_numpy(q), kv[0], kv[1], s - t)                          # [Hq, T, D]
    return out.numpy(), as_words(base.numpy()), as_words(refine.numpy()), scale.float().numpy()


def rms_norm_op(x: np.ndarray, w: np.ndarray, eps: np.ndarray) -> np.ndarray:
    return rms_norm(torch.from_numpy(x), torch.from_numpy(w), float(eps.reshape(-1)[0])).numpy()


def silu_mul_op(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return silu_mul(torch.from_numpy(g), torch.from_numpy(u)).numpy()


def rotate_rows_op(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    return rotate_rows(torch.from_numpy(x), torch.from_numpy(r)).numpy()


def hadamard_rows_op(x: np.ndarray, factors: str = "") -> np.ndarray:
    """x [M, n] @ H_n of the node's factor orders (HADAMARD_FACTORS; empty: the legacy rule's, as graphs exported
    before the attribute existed were built)."""
    return hadamard_rows(torch.from_numpy(x), x.shape[-1], parse_factors_attribute(factors)).numpy()


_registered = False


def register_ort_ops() -> str:
    """Register both ops with onnxruntime-extensions (once per process); returns the extensions' library path."""
    global _registered
    try:
        from onnxruntime_extensions import PyCustomOpDef as T
        from onnxruntime_extensions import get_library_path, onnx_op
    except ImportError as e:
        raise ImportError(f"onnxruntime-extensions is not installed ({e}): pip install onnxruntime-extensions") from e
    if not _registered:
        gemv_in = [T.dt_float, T.dt_int32, T.dt_int32, T.dt_float, T.dt_int64]
        onnx_op(op_type=DUAL_PLANE_LINEAR.graph, inputs=gemv_in, outputs=[T.dt_float])(dual_plane_gemv)
        onnx_op(op_type=GEMV_WITH_OFFSET, inputs=gemv_in + [T.dt_float], outputs=[T.dt_float])(dual_plane_gemv)
        onnx_op(op_type=RMS_NORM, inputs=[T.dt_float] * 3, outputs=[T.dt_float])(rms_norm_op)
        onnx_op(op_type=SILU_MUL, inputs=[T.dt_float] * 2, outputs=[T.dt_float])(silu_mul_op)
        onnx_op(op_type=ROTATE_ROWS, inputs=[T.dt_float] * 2, outputs=[T.dt_float])(rotate_rows_op)
        onnx_op(op_type=HADAMARD_ROWS, inputs=[T.dt_float], outputs=[T.dt_float],
                attrs={HADAMARD_FACTORS: T.dt_string})(hadamard_rows_op)
        onnx_op(op_type=NESTED_KV_ATTENTION.graph,
                inputs=[T.dt_float] * 3 + [T.dt_int32, T.dt_int32, T.dt_float, T.dt_int64, T.dt_int64],
                outputs=[T.dt_float, T.dt_int32, T.dt_int32, T.dt_float])(nested_kv_attention)
        _registered = True
    return get_library_path()


def ort_model(model, inline_functions: bool = False, expose: tuple[str, ...] = ()):
    """A copy of `model` (ModelProto) whose `bitnest` nodes run as onnxruntime-extensions Python ops; with
    `inline_functions`, the local functions are first inlined to standard ops (only the two ops remain); the
    float32 intermediate values named in `expose` become extra outputs."""
    import onnx.inliner
    from onnx import TensorProto, helper
    from onnxruntime_extensions import default_opset_domain

    contrib = default_opset_domain()
    if inline_functions:
        m = onnx.inliner.inline_local_functions(model)
    else:
        m = type(model)()
        m.CopyFrom(model)
    nodes = []
    for node in m.graph.node:
        if node.domain != DOMAIN:
            nodes.append(node)
            continue
        op = node.op_type
        for i in _F16_INPUTS.get(op, ()):
            if i < len(node.input) and node.input[i]:
                cast = helper.make_node("Cast", [node.input[i]], [f"{node.name}.in{i}.f32"], to=TensorProto.FLOAT)
                nodes.append(cast)
                node.input[i] = cast.output[0]
        after = []
        for i in _F16_OUTPUTS.get(op, ()):
            name = node.output[i]
            node.output[i] = f"{node.name}.out{i}.f32"
            after.append(helper.make_node("Cast", [node.output[i]], [name], to=TensorProto.FLOAT16))
        node.domain = contrib
        if op == DUAL_PLANE_LINEAR.graph and len(node.input) == 6 and node.input[5]:
            node.op_type = GEMV_WITH_OFFSET
        if op == HADAMARD_ROWS and all(at.name != HADAMARD_FACTORS for at in node.attribute):
            node.attribute.append(helper.make_attribute(HADAMARD_FACTORS, ""))   # an older graph: the legacy rule
        nodes += [node] + after
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    del m.functions[:]  # the bitnest functions run as Python ops here (the torch backend's own float math)
    for op in m.opset_import:
        if op.domain == DOMAIN:
            op.domain = contrib
    m.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in expose)
    return m


def ort_session(onnx_path: Path, threads: int = 0, inline_functions: bool = False, expose: tuple[str, ...] = ()):
    """An onnxruntime CPU InferenceSession over the step graph at `onnx_path` with the bitnest ops (and, with
    `inline_functions`, the functions as onnxruntime's standard kernels; `expose`: see `ort_model`)."""
    import onnx
    import onnxruntime as ort

    lib = register_ort_ops()
    model = onnx.load(str(onnx_path))  # external data, if any, is loaded from beside the file
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(ort_model(model, inline_functions, expose).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
