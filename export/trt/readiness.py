"""Whether a decoder-step ONNX graph can become a TensorRT 10.3 engine, checked without TensorRT: the rules of
TensorRT 10.3 and its ONNX parser that a graph and its plugins must follow, each violation named in one line.

Rules (evidence: NVIDIA/TensorRT v10.3.0 include/NvInferRuntime.h, onnx-tensorrt ModelImporter.cpp,
WeightsContext.cpp, onnxOpImporters.cpp and its operator list, operators.md):
- `uint8`: TensorRT takes no kUINT8 (nor kBOOL) plugin tensor ("DataType:kBOOL and DataType::kUINT8 are not
  supported", IPluginV3OneBuild::getOutputDataTypes); the parser refuses a uint8 tensor that is not a graph input
  or output ("TensorRT does not support UINT8 types for intermediate tensors!") and widens uint8 initializers to
  one int32 per byte (convertUINT8), which no plugin declared for bytes would accept.
- `plugin-type`: every input and output of a plugin node has the element type the plugin declares
  (plugins.trt.plugins.PLUGIN_IO, what its supports_format_combination accepts), and that type is one TensorRT
  allows for plugins.
- `shape-tensor`: no run-time scalar (seq_len, kv8_from, view) and no token id may reach a shape computation. The
  parser imports the operands of Range, Reshape, Expand, Tile, Slice, ConstantOfShape, ... as shape tensors (e.g.
  Range: "using only operations allowed on shape tensors"); a graph input that feeds one becomes a shape tensor,
  which lives in host memory and needs values in every optimization profile.
- `alias`: a plugin output aliased to an input (IPluginV3OneBuildV2::getAliasedInput) is a graph output itself,
  with the input's type and shape, and the aliased input is a graph input read by that plugin node only ("If a
  given tensor is requested to be aliased by two different plugins, this may result in divergent copies");
  anything between them (an Identity) would be a copy of the whole plane per pass.
- `opset`: the default-domain opset is within what the parser imports (9..20).
- `namespace` (a project rule): every node is a standard op (domain '' or ai.onnx) or a `bitnest` op. The parser
  imports a node it has no importer for as a plugin looked up by (op_type, attribute `plugin_version`, default "1",
  attribute `plugin_namespace`, default ""), and from TensorRT 10.10, where that finds no creator, again with the
  node's domain as the namespace (onnx-tensorrt onnxOpImporters.cpp, FallbackPluginImporter; PR #1025, the 10.10-GA
  release; at 10.1-GA the attribute alone, onnxOpImporters.cpp line 6443). The plugin creators are registered
  under '' (found first on every version: the graph's nodes carry no `plugin_namespace`) and under `bitnest`. A
  node of another domain is not one of this graph's ops: the parser would take it for a plugin named by its op_type.
- `op`: every standard op is one the parser imports: onnx-tensorrt operators.md (10.1-GA, the newest in this
  index; 10.3 imports the same set for these ops) marks those in UNSUPPORTED_OPS "N" (BitShift and the Bitwise* ops
  among them, which is why the embedding gather unpacks nibbles by int32 division: export.onnx.rows).
"""

from dataclasses import dataclass

import onnx
import onnx.inliner
from onnx import helper

from plugins.contracts import DOMAIN
from plugins.onnx.schemas import register_schemas
from plugins.step_contract import INPUT_IDS, RUNTIME_SCALARS
from plugins.trt.plugins import PLUGIN_IO, TRT_PLUGIN_TYPES

PARSER_OPSETS = (9, 20)
# Standard ops the parser does not import (onnx-tensorrt operators.md, "Supported: N"), by name.
UNSUPPORTED_OPS = frozenset((
    "AffineGrid", "Bernoulli", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "BlackmanWindow",
    "CenterCropPad", "Compress", "ConcatFromSequence", "ConvInteger", "DFT", "Det", "DynamicQuantizeLinear",
    "HammingWindow", "HannWindow", "ImageDecoder", "MatMulInteger", "MaxRoiPool", "MaxUnpool", "MelWeightMatrix",
    "Multinomial", "NegativeLogLikelihoodLoss", "Optional", "OptionalGetElement", "OptionalHasElement", "QLinearConv",
    "QLinearMatMul", "RegexFullMatch", "STFT", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
    "SequenceInsert", "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss", "SplitToSequence", "StringConcat",
    "StringNormalizer", "StringSplit", "TfIdfVectorizer", "Unique"))

# Inputs the parser imports as shape tensors, by op type and input position (None: every input).
SHAPE_INPUTS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Range": None, "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,),
    "Squeeze": (1,), "Unsqueeze": (1,), "Resize": (2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,),
    "Split": (1,), "Pad": (1, 3), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL2": (1,), "NonMaxSuppression": (2,), "CenterCropPad": (1,),
}
# Ops whose output is a shape but whose input is execution data: a shape computation stops at them.
SHAPE_SOURCES = ("Shape", "Size")


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str
    what: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.where}: {self.what}"


def _types(model: onnx.ModelProto) -> dict[str, str]:
    """{tensor name: numpy type name} of every typed tensor after shape inference."""
    register_schemas()
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    out = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type:
            out[vi.name] = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name
    for init in g.initializer:
        out[init.name] = helper.tensor_dtype_to_np_dtype(init.data_type).name
    return out


def _shapes(model: onnx.ModelProto) -> dict[str, list]:
    g = onnx.shape_inference.infer_shapes(model).graph
    return {vi.name: [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim]
            for vi in list(g.input) + list(g.output) + list(g.value_info)}


def shape_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors TensorRT would treat as shape tensors: the shape operands of the ops in SHAPE_INPUTS and every tensor
    they are computed from, back to a Shape/Size op (whose input is ordinary data)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    todo = []
    for n in model.graph.node:
        pos = SHAPE_INPUTS.get(n.op_type, ())
        todo += [x for i, x in enumerate(n.input) if x and (pos is None or i in pos)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in SHAPE_SOURCES:
            todo += [x for x in node.input if x]
    return seen


def check_graph(model: onnx.ModelProto) -> list[Violation]:
    """Every rule of the module docstring on `model` (a step graph, local functions inlined here)."""
    model = onnx.inliner.inline_local_functions(model)
    g = model.graph
    out: list[Violation] = []
    for n in g.node:
        if n.domain not in ("", "ai.onnx", DOMAIN):
            out.append(Violation("namespace", n.name, f"{n.domain}::{n.op_type} is outside the graph's domains ('', "
                                 f"ai.onnx, '{DOMAIN}'): TensorRT's parser would look it up as a plugin named "
                                 f"{n.op_type!r}"))
    if out:         # the other rules read types inferred through the bitnest schemas: not this graph's nodes
        return out
    graph_io = {i.name for i in g.input} | {o.name for o in g.output}
    types = _types(model)
    for name, t in types.items():
        if t == "uint8" and name not in graph_io:
            out.append(Violation("uint8", name, "uint8 tensor inside the graph (the parser refuses it; an initializer "
                                 "would be widened to one int32 per byte): pack bytes into int32 words"))
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and not PARSER_OPSETS[0] <= opset.version <= PARSER_OPSETS[1]:
            out.append(Violation("opset", "model", f"opset {opset.version} outside the parser's {PARSER_OPSETS}"))
    for n in g.node:
        if n.domain in ("", "ai.onnx") and n.op_type in UNSUPPORTED_OPS:
            out.append(Violation("op", n.name, f"{n.op_type} is not imported by the TensorRT 10.3 ONNX parser"))
    out += _plugin_rules(g, types, _shapes(model))
    shapes = shape_tensors(model)
    for name in (*RUNTIME_SCALARS, INPUT_IDS):
        if name in shapes:
            out.append(Violation("shape-tensor", name, "a run-time input reaches a shape computation (it would become "
                                 "a host-memory shape tensor bound by the profile): compute it on the device"))
    return out


def _plugin_rules(g, types: dict[str, str], shapes: dict[str, list]) -> list[Violation]:
    out = []
    consumers: dict[str, list] = {}
    for n in g.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    inputs, outputs = {i.name for i in g.input}, {o.name for o in g.output}
    for n in g.node:
        if n.domain != DOMAIN:
            continue
        io = PLUGIN_IO.get(n.op_type)
        if io is None:
            out.append(Violation("plugin-type", n.name, f"no TensorRT plugin for {DOMAIN}::{n.op_type}"))
            continue
        for kind, names, want in (("input", n.input, io.inputs), ("output", n.output, io.outputs)):
            for i, name in enumerate(names):
                if not name:
                    continue
                got = types.get(name)
                if i >= len(want) or got != want[i] or want[i] not in TRT_PLUGIN_TYPES:
                    out.append(Violation("plugin-type", f"{n.name} {kind} {i} ({name})",
                                         f"{got} where the plugin takes {want[i] if i < len(want) else 'nothing'}"))
        for o, i in io.aliases.items():
            src, dst = n.input[i], n.output[o]
            if dst not in outputs:
                out.append(Violation("alias", f"{n.name} output {o} ({dst})", "an aliased plane output must be a graph "
                                     "output itself (anything in between copies the plane)"))
            if src not in inputs or len(consumers.get(src, [])) != 1:
                out.append(Violation("alias", f"{n.name} input {i} ({src})", "an aliased plane input must be a graph "
                                     "input read by this node only"))
            if types.get(src) != types.get(dst) or shapes.get(src) != shapes.get(dst):
                out.append(Violation("alias", f"{n.name} output {o} ({dst})", "differs in type or shape from the "
                                     f"input it aliases ({src})"))
    return out


def check_file(onnx_path) -> list[Violation]:
    """`check_graph` on an ONNX file (external weights are not loaded: the rules read types and structure)."""
    return check_graph(onnx.load(str(onnx_path), load_external_data=False))
