"""TensorRT engine build from the decoder-step ONNX graph: checked against TensorRT 10.3's rules first
(export.trt.readiness), local functions inlined to standard ops, parsed from a file, the `bitnest` nodes bound to
the Python IPluginV3 plugins (plugins.trt.plugins, their plane outputs aliased to their inputs), TF32 off, one
optimization profile for the pass size M and the KV capacity C, serialized atomically beside the ONNX file.
The KV planes are bound ping-pong by default (separate input and output buffers, edge.backends.tensorrt_kv) or, on
request, aliased (in place); the engine is built at ProfilingVerbosity.DETAILED and its inspector's layer list decides
whether TensorRT inserted copies of the planes (export.trt.inspect; the verbose log's copy lines, export.trt.log, are
kept as evidence). A ping-pong build with a plane copy is refused; `auto` takes the aliased build unless it holds one.
The choice, the copies and the catch-up window the runtime plugin read go to the engine's build record beside it.
Runs where TensorRT >= 10.3 and a CUDA GPU exist (a Jetson on JetPack 6.1/6.2); elsewhere it refuses with the
reason."""

import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from edge.atomic import write_atomic
from edge.backends.tensorrt_kv import ALIASED, KV_BINDINGS, PINGPONG
from edge.backends.tensorrt_record import record_path
from edge.errors import BitNestError
from export.trt.readiness import check_file
from plugins.step_contract import (
    ENGINE_FILE,
    LOGITS,
    ProfileSpec,
    StepShapes,
    kv_inputs,
)

AUTO = "auto"


def engine_build_unavailable() -> str | None:
    """None where an engine can be built here, else the one-line reason."""
    from plugins.trt.plugins import tensorrt_unavailable
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


def attention_layers(model) -> list[str]:
    """Names of the attention plugin nodes of a step graph (the layers TensorRT names after them)."""
    from plugins.contracts import NESTED_KV_ATTENTION
    return [n.name for n in model.graph.node if n.op_type == NESTED_KV_ATTENTION.graph]


def _build_once(trt, onnx_path: Path, shapes: StepShapes, profile: ProfileSpec, aliasing: bool,
                workspace_mib: int):
    """(serialized engine, what it holds) of one build, KV planes aliased or not: the engine inspector's plane copies,
    the verbose build log's copy lines and the catch-up window of the runtime plugins made from it (runtime_facts)."""
    from export.trt.log import capturing_logger, plane_copies
    logger = capturing_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    # parse_from_file: the parser reads the file and its external weights itself; parse(bytes) would hold a second
    # serialized copy of the model in memory and stops at protobuf's 2 GiB message limit (a 7B model's weights).
    with inlined_copy(onnx_path) as inlined:
        import onnx
        layers = attention_layers(onnx.load(str(inlined), load_external_data=False))
        ok = parser.parse_from_file(str(inlined))
    if not ok:
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BitNestError(f"TensorRT could not parse {onnx_path}: {errors[:300]}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    # TF32 is on by default (NvInfer.h, BuilderFlag::kTF32: "Enabled by default"): it would round the float32
    # head, rotations and norms to 10-bit mantissas before the INT8 quantizers read them.
    config.clear_flag(trt.BuilderFlag.TF32)
    # each layer's inputs and outputs in the engine inspector's JSON (NvInfer.h v10.3.0, ProfilingVerbosity::kDETAILED:
    # "Register layer names and layer parameters"; the default kLAYER_NAMES_ONLY lists names alone)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    # aliased: the attention plugin writes the KV entries into its plane inputs, legal only as declared aliasing;
    # ping-pong: the feature stays off, so get_aliased_input is never called (NvInferRuntime.h v10.3.0 line 1119)
    # and the plugin writes only its own outputs (plugins.trt.plugins._attention)
    config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, aliasing)
    opt = builder.create_optimization_profile()
    for name, (lo, mid, hi) in profile.shapes(shapes).items():
        opt.set_shape(name, lo, mid, hi)
    config.add_optimization_profile(opt)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BitNestError("TensorRT failed to build the engine (see its log above)")
    return serialized, runtime_facts(trt, serialized, logger, plane_copies(logger.lines, layers))


def runtime_facts(trt, serialized, logger, log_copies: list[str]) -> dict:
    """What the built engine holds: the plane copies its inspector lists, the log's copy lines, and the kv_window each
    runtime attention plugin was created with (deserializing it creates them from their serialized fields, as a run
    does: a window of 0 would copy whole planes every pass)."""
    from export.trt.inspect import engine_information, inspector_plane_copies
    from plugins.trt.plugins import runtime_windows
    before = len(runtime_windows())
    copies = inspector_plane_copies(engine_information(trt, serialized, logger))
    return {"plane_copies": copies, "log_plane_copies": log_copies, "kv_window": sorted(set(runtime_windows()[before:]))}


def choose_binding(kv_binding: str, build) -> tuple:
    """(binding, serialized engine, its facts, record extras) by the rule of build_engine, `build(aliasing)` giving
    (serialized, facts) of one build."""
    extra = {}
    if kv_binding in (AUTO, ALIASED):
        serialized, facts = build(True)
        if kv_binding == ALIASED or not facts["plane_copies"]:
            return ALIASED, serialized, facts, extra
        extra["aliased_build_copies"] = facts["plane_copies"]
    serialized, facts = build(False)
    if facts["plane_copies"]:
        raise BitNestError(f"the ping-pong build still copies a KV plane ({facts['plane_copies'][0]}; "
                           f"{len(facts['plane_copies'])} in all): every pass would copy whole planes, so no engine "
                           "is written (report it with the build log)")
    return PINGPONG, serialized, facts, extra


def build_engine(onnx_path, profile: ProfileSpec = ProfileSpec(), out=None, workspace_mib: int = 1024,
                 kv_binding: str = PINGPONG) -> dict:
    """Build and serialize the engine of the step graph at `onnx_path` (default out: beside it) and its build record
    (edge.backends.tensorrt_record). `kv_binding`: `pingpong` (the default: separate input and output plane buffers,
    swapped each pass, edge.backends.tensorrt_kv; refused where the engine still copies a plane), `aliased` (planes
    in place, TensorRT's aliased plugin I/O: it may insert copies, recorded), or `auto`: aliased unless the engine
    inspector shows copies of the planes, then ping-pong (the aliased build's copies recorded)."""
    if kv_binding not in (AUTO, *KV_BINDINGS):
        raise ValueError(f"unknown KV binding {kv_binding!r}: use {AUTO}, {', '.join(KV_BINDINGS)}")
    onnx_path = Path(onnx_path)
    problems = check_file(onnx_path)            # bad input first: one line, wherever TensorRT is or is not
    if problems:
        raise BitNestError(f"{onnx_path} breaks {len(problems)} TensorRT 10.3 rule(s), first: {problems[0]} "
                           "(re-export it with scripts/export.py --existing --onnx)")
    reason = engine_build_unavailable()
    if reason:
        raise BitNestError(f"cannot build a TensorRT engine here: {reason}")
    import onnx
    import tensorrt as trt

    from plugins.trt.plugins import register_plugins

    t0 = time.time()
    out = Path(out) if out else onnx_path.with_name(ENGINE_FILE)
    register_plugins()
    shapes = step_shapes_of(onnx.load(str(onnx_path), load_external_data=False))
    record = {"tensorrt": trt.__version__, "profile": {"max_tokens": profile.max_tokens,
                                                       "max_context": profile.max_context}}
    mode, serialized, facts, extra = choose_binding(
        kv_binding, lambda aliasing: _build_once(trt, onnx_path, shapes, profile, aliasing, workspace_mib))
    record.update(kv_binding=mode, **facts, **extra,
                  copies_from="engine inspector (LayerInformationFormat.JSON, ProfilingVerbosity.DETAILED)")
    write_atomic(bytes(serialized), out)
    write_atomic(json.dumps(record, indent=1).encode(), record_path(out))
    return {"engine": str(out), "bytes": out.stat().st_size, **record, "seconds": round(time.time() - t0, 1)}
