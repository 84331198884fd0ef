"""TensorRT engine build from the decoder-step ONNX graph: checked against TensorRT 10.3's rules first
(export.trt_readiness), local functions inlined to standard ops, parsed from a file, the `bitnest` nodes bound to
the Python IPluginV3 plugins (plugins.trt_plugins, their plane outputs aliased to their inputs), TF32 off, one
optimization profile for the pass size M and the KV capacity C, serialized atomically beside the ONNX file.
Runs where TensorRT >= 10.3 and a CUDA GPU exist (a Jetson on JetPack 6.1/6.2); elsewhere it refuses with the
reason."""

import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from edge.atomic import write_atomic
from edge.errors import BitNestError
from plugins.step_contract import (
    ENGINE_FILE,
    LOGITS,
    ProfileSpec,
    StepShapes,
    kv_inputs,
)


def engine_build_unavailable() -> str | None:
    """None where an engine can be built here, else the one-line reason."""
    from plugins.trt_plugins import tensorrt_unavailable
    return tensorrt_unavailable()


def step_shapes_of(model) -> StepShapes:
    """The step graph's model dimensions, read from its declared I/O (an onnx ModelProto)."""
    from plugins.step_contract import WORD_BYTES
    ins = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    outs = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    layers = sum(1 for name in ins if name.startswith("kv_base."))
    base = ins.get(kv_inputs(0)[0])
    if not layers or base is None or LOGITS not in outs:
        raise BitNestError("this ONNX file is not a BitNest decoder-step graph: export it with scripts/export.py --onnx")
    return StepShapes(layers=layers, kv_heads=int(base[1]), head_dim=2 * WORD_BYTES * int(base[3]),
                      vocab=int(outs[LOGITS][1]))


@contextmanager
def inlined_copy(onnx_path):
    """The step graph with its local functions inlined (standard ops + plugin nodes: what the parser is handed),
    as a temporary file beside the original (removed on exit): its external-data locations are relative, so they
    resolve to the original weights file; external weights are never loaded here nor copied."""
    import onnx
    import onnx.inliner
    onnx_path = Path(onnx_path)
    model = onnx.inliner.inline_local_functions(onnx.load(str(onnx_path), load_external_data=False))
    fd, tmp = tempfile.mkstemp(prefix=f".{onnx_path.stem}.inlined-", suffix=".onnx", dir=onnx_path.parent)
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        yield Path(tmp)
    finally:
        os.unlink(tmp)


def build_engine(onnx_path, profile: ProfileSpec = ProfileSpec(), out=None, workspace_mib: int = 1024) -> dict:
    """Build and serialize the engine of the step graph at `onnx_path` (default out: beside it)."""
    reason = engine_build_unavailable()
    if reason:
        raise BitNestError(f"cannot build a TensorRT engine here: {reason}")
    import onnx
    import tensorrt as trt

    from export.trt_readiness import check_file
    from plugins.trt_plugins import register_plugins

    t0 = time.time()
    onnx_path = Path(onnx_path)
    out = Path(out) if out else onnx_path.with_name(ENGINE_FILE)
    problems = check_file(onnx_path)
    if problems:
        raise BitNestError(f"{onnx_path} breaks {len(problems)} TensorRT 10.3 rule(s), first: {problems[0]} "
                           "(re-export it with scripts/export.py --existing --onnx)")
    register_plugins()
    shapes = step_shapes_of(onnx.load(str(onnx_path), load_external_data=False))
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    # parse_from_file: the parser reads the file and its external weights itself; parse(bytes) would hold a second
    # serialized copy of the model in memory and stops at protobuf's 2 GiB message limit (a 7B model's weights).
    with inlined_copy(onnx_path) as inlined:
        ok = parser.parse_from_file(str(inlined))
    if not ok:
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BitNestError(f"TensorRT could not parse {onnx_path}: {errors[:300]}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    # TF32 is on by default (NvInfer.h, BuilderFlag::kTF32: "Enabled by default"): it would round the float32
    # head, rotations and norms to 10-bit mantissas before the INT8 quantizers read them.
    config.clear_flag(trt.BuilderFlag.TF32)
    # the attention plugin writes the KV entries into its plane inputs: legal only as declared aliasing
    config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, True)
    opt = builder.create_optimization_profile()
    for name, (lo, mid, hi) in profile.shapes(shapes).items():
        opt.set_shape(name, lo, mid, hi)
    config.add_optimization_profile(opt)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BitNestError("TensorRT failed to build the engine (see its log above)")
    write_atomic(bytes(serialized), out)
    return {"engine": str(out), "bytes": out.stat().st_size, "tensorrt": trt.__version__,
            "profile": {"max_tokens": profile.max_tokens, "max_context": profile.max_context},
            "seconds": round(time.time() - t0, 1)}
