"""TensorRT engine build from the decoder-step ONNX graph: local functions inlined to standard ops, the
`bitnest` nodes bound to the Python IPluginV3 plugins (plugins.trt_plugins), one optimization profile for
the pass size M and the KV capacity C, serialized atomically beside the ONNX file. Runs where TensorRT
>= 10.3 and a CUDA GPU exist (a Jetson on JetPack 6.1/6.2); elsewhere it refuses with the reason."""

import time
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
    ins = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    outs = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    layers = sum(1 for name in ins if name.startswith("kv_base."))
    base = ins.get(kv_inputs(0)[0])
    if not layers or base is None or LOGITS not in outs:
        raise BitNestError("this ONNX file is not a BitNest decoder-step graph: export it with scripts/export.py --onnx")
    return StepShapes(layers=layers, kv_heads=int(base[1]), head_dim=2 * int(base[3]), vocab=int(outs[LOGITS][1]))


def build_engine(onnx_path, profile: ProfileSpec = ProfileSpec(), out=None, workspace_mib: int = 1024) -> dict:
    """Build and serialize the engine of the step graph at `onnx_path` (default out: beside it)."""
    reason = engine_build_unavailable()
    if reason:
        raise BitNestError(f"cannot build a TensorRT engine here: {reason}")
    import onnx
    import onnx.inliner
    import tensorrt as trt

    from plugins.trt_plugins import register_plugins

    t0 = time.time()
    onnx_path = Path(onnx_path)
    out = Path(out) if out else onnx_path.with_name(ENGINE_FILE)
    register_plugins()
    model = onnx.inliner.inline_local_functions(onnx.load(str(onnx_path)))   # TensorRT sees standard ops + plugins
    shapes = step_shapes_of(model)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString(), str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BitNestError(f"TensorRT could not parse {onnx_path}: {errors[:300]}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
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
