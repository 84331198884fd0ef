"""The decoder-step graph's contract shared by the ONNX exporter, the onnxruntime runner, the TensorRT
plugins, the engine build and the TensorRT backend: I/O names, the 32-bit word layout of the planes, the
in-place KV rule and the optimization-profile shapes (op names and view codes: plugins.contracts).

One graph (and one engine) runs one pass of M tokens (1..γ+1) for either weight view and any KV view:

inputs   input_ids  int64 [M]                    the pass's tokens, at positions [seq_len - M, seq_len)
         seq_len    int64 [1]                    S: sequence length after this pass (committed + drafted + M)
         kv8_from   int64 [1]                    first position read at KV8 (kv8 -> 0, kv4 -> S, recent-N -> S - N)
         view       int64 [1]                    weight view: 0 = draft (base plane only), 1 = target
         kv_base.L, kv_refine.L   int32 [2, Hkv, C, D/8]   layer L's KV planes (K then V) as words, C = capacity
         kv_scale.L               float16 [2, Hkv, C]
outputs  logits     float32 [M, V]
         kv_base_out.L, kv_refine_out.L  int32 [2, Hkv, C, D/8],  kv_scale_out.L  float16 [2, Hkv, C]

Words: every packed plane (the weights' base / refine [N, K/2] bytes and the KV planes [.., D/2] bytes) travels
as int32 words of four consecutive bytes, little-endian (`as_words`, `as_bytes`: a reinterpretation, no copy).
TensorRT 10.3 takes no uint8 plugin tensor (NvInferRuntime.h, IPluginV3OneBuild::getOutputDataTypes: "DataType:kBOOL
and DataType::kUINT8 are not supported"); its ONNX parser widens uint8 initializers to one int32 per byte
(WeightsContext.cpp, convertUINT8) and refuses uint8 intermediate tensors (ModelImporter.cpp: "TensorRT does not
support UINT8 types for intermediate tensors!"); int8 is a quantized type there (onnx-tensorrt operators.md). int32 words
keep the bytes exact and the size unchanged.

Weight layout: a linear whose N is a multiple of TILE_ROWS travels warp-tiled (plugins.kernels.tiling, the layout the
GPU decode kernel streams): base / refine int32 words [N/32, K/G, G/32, 32, 4], scale / offset float16
[N/32, K/G, 32]; any other linear canonical ([N, K/8] words, [N, K/G] scales). A plane's rank says which
(DualPlaneGemv's output has N = 32 x dim 0 for rank 5), so graphs exported before the tiled layout still run.

KV contract: `NestedKvAttention` quantizes the pass's K/V into entries for positions [S - M, S), attends over the
planes with those positions taken from the entries, and outputs the planes with the entries written (positions
outside [S - M, S) unchanged). The graph's KV outputs are the attention nodes' plane outputs themselves, never a
copy. onnxruntime (pure semantics) returns new arrays and the runner keeps them as the next pass's inputs; the
TensorRT plugin declares each plane output aliased to its plane input (IPluginV3OneBuildV2.get_aliased_input,
PreviewFeature.ALIASED_PLUGIN_IO_10_03) and writes the entries in place, and the TensorRT runtime binds one
persistent buffer per plane to both the input and its output, so the engine's buffers are the KV cache. Entries
past the committed length are draft-time entries; verification overwrites them and rollback is a smaller
committed length (docs/contracts.md, KV cache).
"""

from dataclasses import dataclass

# Model-local functions (standard-op bodies; export.onnx.functions) for the float ops that feed a quantizer.
RMS_NORM, SILU_MUL, ROTATE_ROWS, HADAMARD_ROWS = "RmsNorm", "SiluMul", "RotateRows", "HadamardRows"
# HadamardRows' attribute: the orders of its Kronecker factors, "140,64" (the checkpoint's record; a node without it,
# from a graph exported before the attribute existed, means plugins.hadamard's legacy rule for the row length).
HADAMARD_FACTORS = "factors"


def factors_attribute(factors) -> str:
    """The HADAMARD_FACTORS attribute's text for Kronecker factor orders."""
    return ",".join(str(int(f)) for f in factors)


def parse_factors_attribute(text: str):
    """The factor orders a HADAMARD_FACTORS attribute names (a tuple), or None for an empty one."""
    return tuple(int(f) for f in text.split(",")) if text else None

INPUT_IDS, SEQ_LEN, KV8_FROM, VIEW, LOGITS = "input_ids", "seq_len", "kv8_from", "view", "logits"
# Named intermediate values (not outputs): the residual stream entering layer 0 and leaving each layer. A check can
# expose them as outputs of its own copy of the graph and compare every layer on the graph's own inputs.
EMBEDDED = "embedded"

# ONNX opset of the standard ops and IR version: within what TensorRT 10.3's parser and onnxruntime read.
OPSET = 17
IR_VERSION = 8

# Metadata key naming the draft head a graph serves (8bit: the head's target view in both weight views; 4bit: the
# head at the pass's view; float16: a float16 head); the runners refuse a checkpoint set to another.
DRAFT_HEAD_META, FLOAT16_HEAD = "bitnest.draft_head", "float16"

ONNX_FILE = "decoder_step.onnx"
# Beside the graph: {file name: sha256} of the graph and its external data, written by the export, checked on open.
ONNX_DIGEST_SUFFIX = ".sha256"
ENGINE_FILE = "decoder_step.engine"


def onnx_digests(onnx_path) -> dict[str, str]:
    """sha256 of a step graph file and of its external data file where it has one."""
    import hashlib
    from pathlib import Path
    path = Path(onnx_path)
    out = {}
    for f in (path, path.with_name(path.name + ".data")):
        if f.is_file():
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            out[f.name] = h.hexdigest()
    return out


def kv_inputs(layer: int) -> tuple[str, str, str]:
    """Names of layer `layer`'s plane inputs (base, refine, scale)."""
    return f"kv_base.{layer}", f"kv_refine.{layer}", f"kv_scale.{layer}"


def residual(layer: int) -> str:
    """Name of the residual stream [M, H] leaving layer `layer` (float32)."""
    return f"residual.{layer}"


def kv_outputs(layer: int) -> tuple[str, str, str]:
    """Names of layer `layer`'s plane outputs (base, refine, scale): its planes after the pass."""
    return f"kv_base_out.{layer}", f"kv_refine_out.{layer}", f"kv_scale_out.{layer}"


# Run-time scalar inputs: device tensors whose values change every pass; none may reach a shape computation.
RUNTIME_SCALARS = (SEQ_LEN, KV8_FROM, VIEW)
WORD_BYTES = 4
TILE_ROWS = 32        # rows of a warp-tiled block of a graph's planes (one per lane of a warp)


def as_words(planes):
    """uint8 [..., B] packed bytes (B a multiple of 4; numpy or torch) seen as int32 words [..., B/4], no copy."""
    if planes.shape[-1] % WORD_BYTES:
        raise ValueError(f"a plane row of {planes.shape[-1]} bytes is not whole 32-bit words")
    if hasattr(planes, "numpy"):
        import torch
        return planes.contiguous().view(torch.int32)
    import numpy as np
    return np.ascontiguousarray(planes).view(np.int32)


def as_bytes(words):
    """int32 [..., W] words (numpy or torch) seen as their uint8 bytes [..., 4W], no copy."""
    if hasattr(words, "numpy"):
        import torch
        return words.contiguous().view(torch.uint8)
    import numpy as np
    return np.ascontiguousarray(words).view(np.uint8)


@dataclass(frozen=True)
class StepShapes:
    """The model dimensions the step graph's I/O depends on."""

    layers: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, cfg) -> "StepShapes":
        return cls(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size)

    def plane_shape(self, capacity: int) -> tuple[int, int, int, int]:
        """A KV plane as int32 words: [2, Hkv, C, D/8] (D/2 bytes per position)."""
        return (2, self.kv_heads, capacity, self.head_dim // 2 // WORD_BYTES)

    def scale_shape(self, capacity: int) -> tuple[int, int, int]:
        return (2, self.kv_heads, capacity)


@dataclass(frozen=True)
class ProfileSpec:
    """One TensorRT optimization profile: M in [1, max_tokens] (γ+1 for verification, more for chunked
    prefill) and KV capacity C in [min_context, max_context], with `opt_*` the shapes tuned for."""

    max_tokens: int = 5
    max_context: int = 2048
    min_context: int = 1
    opt_tokens: int = 1
    opt_context: int = 0

    def __post_init__(self):
        if self.max_tokens < 1 or not 1 <= self.opt_tokens <= self.max_tokens:
            raise ValueError(f"profile tokens: need 1 <= opt ({self.opt_tokens}) <= max ({self.max_tokens})")
        if not 1 <= self.min_context <= self.max_context:
            raise ValueError(f"profile context: need 1 <= min ({self.min_context}) <= max ({self.max_context})")
        if self.max_tokens > self.max_context:
            raise ValueError(f"a pass of {self.max_tokens} tokens cannot fit a context of {self.max_context}")
        if self.opt_context and not self.min_context <= self.opt_context <= self.max_context:
            raise ValueError(f"profile opt context {self.opt_context} outside [{self.min_context}, {self.max_context}]")

    def shapes(self, s: StepShapes) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """{input name: (min, opt, max) shape} for every dynamic input of the step graph."""
        opt_c = self.opt_context or self.max_context
        out = {INPUT_IDS: ((1,), (self.opt_tokens,), (self.max_tokens,))}
        for layer in range(s.layers):
            base, refine, scale = kv_inputs(layer)
            planes = (s.plane_shape(self.min_context), s.plane_shape(opt_c), s.plane_shape(self.max_context))
            out[base] = out[refine] = planes
            out[scale] = (s.scale_shape(self.min_context), s.scale_shape(opt_c), s.scale_shape(self.max_context))
        return out
