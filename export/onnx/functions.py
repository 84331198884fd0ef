"""Model-local ONNX functions of the `bitnest` domain for the step graph's float ops that feed a quantizer
(RMSNorm, the gated SiLU, the R1 rotation, the R4 Hadamard): standard-op bodies that TensorRT inlines,
and names the onnxruntime CPU path maps onto the decoder's own torch math (plugins.decoder_math), so its
INT8 activation and KV codes match the torch backend's bit for bit."""

import numpy as np
from onnx import FunctionProto, helper, numpy_helper

from plugins.contracts import DOMAIN
from plugins.hadamard import hadamard_factor_matrices
from plugins.step_contract import HADAMARD_FACTORS, HADAMARD_ROWS, OPSET, RMS_NORM, ROTATE_ROWS, SILU_MUL


def _function(name: str, inputs: list[str], outputs: list[str], nodes, attributes=()) -> FunctionProto:
    return helper.make_function(DOMAIN, name, inputs, outputs, nodes, [helper.make_opsetid("", OPSET)],
                                attributes=list(attributes))


def rms_norm_function() -> FunctionProto:
    """y = x * 1/sqrt(mean(x*x, -1) + eps) * w; x [M, H], w [H], eps [] (float32)."""
    n = helper.make_node
    return _function(RMS_NORM, ["x", "w", "eps"], ["y"], [
        n("Mul", ["x", "x"], ["sq"]),
        n("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        n("Add", ["ms", "eps"], ["var"]),
        n("Sqrt", ["var"], ["rms"]),
        n("Reciprocal", ["rms"], ["inv"]),
        n("Mul", ["x", "inv"], ["xn"]),
        n("Mul", ["xn", "w"], ["y"]),
    ])


def silu_mul_function() -> FunctionProto:
    """y = g * sigmoid(g) * u."""
    n = helper.make_node
    return _function(SILU_MUL, ["g", "u"], ["y"], [
        n("Sigmoid", ["g"], ["sg"]), n("Mul", ["g", "sg"], ["silu"]), n("Mul", ["silu", "u"], ["y"])])


def rotate_rows_function() -> FunctionProto:
    """y = x @ r."""
    return _function(ROTATE_ROWS, ["x", "r"], ["y"], [helper.make_node("MatMul", ["x", "r"], ["y"])])


def hadamard_rows_function(size: int, factors) -> FunctionProto:
    """y = x [M, size] @ H_size by its Kronecker factors `factors` (the checkpoint's record; constants), one axis at a
    time. The node that calls it carries the same orders as its HADAMARD_FACTORS attribute (the body ignores it; the
    onnxruntime Python op, which runs in place of the body, reads it)."""
    n = helper.make_node
    mats = [m.float().numpy() for m in hadamard_factor_matrices(size, factors)]
    orders = [m.shape[0] for m in mats]
    nodes = [n("Constant", [], [f"h{i}"], value=numpy_helper.from_array(np.ascontiguousarray(m), f"h{i}"))
             for i, m in enumerate(mats)]
    if len(mats) == 1:
        return _function(HADAMARD_ROWS, ["x"], ["y"], nodes + [n("MatMul", ["x", "h0"], ["y"])], [HADAMARD_FACTORS])
    shape = numpy_helper.from_array(np.asarray([-1, *orders], np.int64), "split_shape")
    flat = numpy_helper.from_array(np.asarray([-1, size], np.int64), "flat_shape")
    nodes += [n("Constant", [], ["split_shape"], value=shape), n("Constant", [], ["flat_shape"], value=flat),
              n("Reshape", ["x", "split_shape"], ["y0"])]                        # [M, f1, ..., fk]
    rank = 1 + len(orders)
    for i in range(len(orders)):
        a = 1 + i
        perm = [d for d in range(rank) if d != a] + [a]                          # this factor's axis last
        back = [perm.index(d) for d in range(rank)]
        nodes += [n("Transpose", [f"y{i}"], [f"t{i}"], perm=perm), n("MatMul", [f"t{i}", f"h{i}"], [f"p{i}"]),
                  n("Transpose", [f"p{i}"], [f"y{i + 1}"], perm=back)]
    nodes.append(n("Reshape", [f"y{len(orders)}", "flat_shape"], ["y"]))
    return _function(HADAMARD_ROWS, ["x"], ["y"], nodes, [HADAMARD_FACTORS])
