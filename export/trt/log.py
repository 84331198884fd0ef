"""TensorRT's build log, captured and read for copies of the KV planes: a verbose logger that keeps the lines that
can name an inserted copy (and echoes warnings and errors), and `plane_copies`, which picks the copy and reformat
layers that read or write a KV plane tensor or a plane input / output of an attention plugin node. A copy of a
plane per layer per pass is what an aliasing build may insert ("TensorRT may insert copies to facilitate this
capability", IPluginV3OneBuildV2::getAliasedInput, NvInferRuntime.h v10.3.0 lines 1108-1134, where the inserted
node is drawn as a Copy in front of the plugin) and what a ping-pong KV binding avoids (edge.backends.tensorrt_kv).

What the log says about such layers (TensorRT's own lines, as users posted them; the headers document no log text):
- "Reformatting CopyNode for Input Tensor 0 to LAYER" / "... for Output Tensor 0 to LAYER": the layer TensorRT
  inserts to copy (and reformat) one input or output of LAYER (NVIDIA/TensorRT issue #2136, trtexec's profile; #4020,
  10.x `--exportLayerInfo`; #4397, 10.10's verbose "Engine Layer Information:" lines of the form
  "Layer(Reformat): NAME, Tactic: 0x..., IN (Type[dims]) -> OUT (Type[dims])", and with detailed profiling
  verbosity "Name: NAME, LayerType: Reformat, Inputs: [ { Name: ... } ] ...");
- "Generating copy for A to B because input is not movable." (the builder's optimizer, verbose; dusty-nv/jetson-
  inference issue #1630, TensorRT on a Jetson).
The copy TensorRT inserts for aliased plugin I/O is one of these layer kinds or a layer named after the tensor it
copies; either way its line names a plane tensor (kv_base.L, kv_refine.L, kv_scale.L or their _out outputs) or the
attention node's plane input (3, 4, 5) or output (1, 2, 3), which is what `plane_copies` matches."""

import re
import sys

# lines worth keeping from a verbose build (the rest, tactic timings mostly, are dropped as they arrive)
_KEEP = re.compile(r"copy|reformat", re.IGNORECASE)
_COPY_NODE = re.compile(r"Reformatting CopyNode for (Input|Output) Tensor (\d+) to (.+?)(?:, Tactic:| \[Op:|\"|$)")
_COPY_LAYER = re.compile(r"Layer\((?:Reformat|Copy)\)|LayerType: (?:Reformat|Copy)\b|Generating copy for ")
PLANE_TENSOR = re.compile(r"(?<![\w.])kv_(?:base|refine|scale)(?:_out)?\.\d+(?![\w])")
PLANE_INPUTS, PLANE_OUTPUTS = (3, 4, 5), (1, 2, 3)     # the attention node's plane inputs and outputs (PLUGIN_IO)
MAX_REPORTED = 12


def capturing_logger(trt):
    """A verbose trt.ILogger that keeps the lines `_KEEP` selects (`lines`) and counts all (`seen`); warnings and
    errors also go to stderr, as trt.Logger(WARNING) printed them."""
    loud = {trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR, trt.ILogger.Severity.WARNING}

    class CapturingLogger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)          # a Python ILogger receives every severity (pyCoreDoc.h v10.3.0)
            self.lines, self.seen = [], 0

        def log(self, severity, msg):
            self.seen += 1
            if _KEEP.search(msg):
                self.lines.extend(msg.splitlines())
            if severity in loud:
                print(f"[TensorRT] {msg}", file=sys.stderr, flush=True)

    return CapturingLogger()


def plane_copies(lines, attention_layers=()) -> list[str]:
    """The log lines (stripped, deduplicated, at most MAX_REPORTED) that show a copy or reformat layer of a KV plane:
    a copy layer naming a plane tensor, or a CopyNode of an attention layer's plane input or output."""
    layers = set(attention_layers)
    out = []
    for line in lines:
        line = line.strip()
        node = _COPY_NODE.search(line)
        hit = bool((node or _COPY_LAYER.search(line)) and PLANE_TENSOR.search(line))
        if node and node.group(3).strip() in layers:
            io, index = node.group(1), int(node.group(2))
            hit = hit or index in (PLANE_INPUTS if io == "Input" else PLANE_OUTPUTS)
        if hit and line not in out:
            out.append(line[:400])
    return out[:MAX_REPORTED]
