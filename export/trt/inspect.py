"""What a built engine really holds, read from TensorRT's engine inspector instead of its log text: the layers of a
serialized engine as `IEngineInspector.get_engine_information(LayerInformationFormat.JSON)` lists them (TensorRT
10.3: `ICudaEngine.create_engine_inspector()`, NvInferRuntime.h `IEngineInspector`; one dict per layer with its
"Name", "LayerType" and the "Name" of each of its "Inputs" and "Outputs" only where the engine was built at
`ProfilingVerbosity.DETAILED`, else each layer is a bare name string), and from them the copy or reformat layers
that read or write a KV plane tensor: what an aliasing build may insert ("TensorRT may insert copies",
IPluginV3OneBuildV2::getAliasedInput, NvInferRuntime.h v10.3.0 lines 1108-1134) and what a ping-pong build must not
have (a copy of a whole plane per layer per pass). The JSON's layout is that of NVIDIA's own reader of it
(tools/experimental/trt-engine-explorer, trex/parser.py and trex/layer.py: "Layers", "Bindings", per layer "Name",
"LayerType", "ParameterType", "Inputs"/"Outputs" lists of tensors with a "Name")."""

import json
import re

from edge.errors import BitNestError
from export.trt.log import PLANE_TENSOR

COPY_TYPES = re.compile(r"reformat|copy", re.IGNORECASE)    # LayerType / ParameterType of an inserted copy


def engine_information(trt, serialized, logger) -> str:
    """The engine inspector's JSON of a serialized engine (deserialized here: the plugins' creators are registered,
    so TensorRT creates the runtime plugins from their serialized fields, as a run would)."""
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(serialized)
    if engine is None:
        raise BitNestError("TensorRT could not deserialize the engine it just built (see its log above)")
    return engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)


def layers(info: str) -> list[dict]:
    """The inspector JSON's layers; one line where it is not the detailed layout."""
    try:
        data = json.loads(info)
        found = data["Layers"]
    except (ValueError, KeyError, TypeError):
        raise BitNestError("the engine inspector's information is not JSON with a Layers list") from None
    if not isinstance(found, list) or any(not isinstance(x, dict) for x in found):
        raise BitNestError("the engine inspector lists layer names only: build with "
                           "ProfilingVerbosity.DETAILED to see each layer's inputs and outputs")
    return found


def _tensors(layer: dict, key: str) -> list[str]:
    return [str(t.get("Name", "")) if isinstance(t, dict) else str(t) for t in layer.get(key) or []]


def inspector_plane_copies(info: str) -> list[str]:
    """One line per copy or reformat layer that reads or writes a KV plane: "NAME (TYPE): IN -> OUT"."""
    out = []
    for layer in layers(info):
        kind = f"{layer.get('LayerType', '')} {layer.get('ParameterType', '')}"
        ins, outs = _tensors(layer, "Inputs"), _tensors(layer, "Outputs")
        if COPY_TYPES.search(kind) and any(PLANE_TENSOR.search(t) for t in ins + outs):
            out.append(f"{layer.get('Name', '?')} ({kind.strip()}): {', '.join(ins)} -> {', '.join(outs)}")
    return out
