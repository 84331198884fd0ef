"""ONNX export of the decoder step from a nested checkpoint: every linear a `bitnest::DualPlaneGemv` node
over the checkpoint's planes (int32-word initializers, stored once), attention a `bitnest::NestedKvAttention`
node over the KV planes (graph inputs, its plane outputs the graph's KV outputs), the manifest's online rotations
(R1, R4) as MatMuls, written atomically. The float ops that feed a quantizer are model-local functions
(export.onnx.functions). The graph's I/O contract is plugins.step_contract; the math mirrors
edge.model.decoder.Decoder op for op. Written for TensorRT 10.3's rules (export.trt.readiness checks them)."""

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from edge.atomic import write_atomic
from edge.errors import BitNestError
from edge.model.checkpoint import HEAD, Checkpoint, load_checkpoint, set_draft_head
from edge.model.manifest import weights_sha256
from edge.model.decoder import rope_tables
from edge.model.draft_head import DRAFT_HEAD_8BIT, DRAFT_HEAD_SHORTLIST, graph_draft_head
from export.onnx.functions import (
    hadamard_rows_function,
    rms_norm_function,
    rotate_rows_function,
    silu_mul_function,
)
from export.onnx.external import ExternalData
from export.onnx.planes import plane_inits
from export.onnx.rows import nested_rows
from plugins.contracts import (
    DOMAIN,
    DOMAIN_VERSION,
    DUAL_PLANE_LINEAR,
    NESTED_KV_ATTENTION,
    TARGET,
    view_code,
)
from plugins.onnx.schemas import bitnest_node_counts, register_schemas
from plugins.step_contract import (
    DRAFT_HEAD_META,
    EMBEDDED,
    FLOAT16_HEAD,
    ONNX_DIGEST_SUFFIX,
    HADAMARD_FACTORS,
    HADAMARD_ROWS,
    INPUT_IDS,
    IR_VERSION,
    KV8_FROM,
    LOGITS,
    ONNX_FILE,
    OPSET,
    RMS_NORM,
    ROTATE_ROWS,
    SEQ_LEN,
    SILU_MUL,
    VIEW,
    StepShapes,
    factors_attribute,
    kv_inputs,
    kv_outputs,
    onnx_digests,
    residual,
)

SHORTLIST_REFUSAL = ("the step graph does not serve the shortlist draft head (the view is a run-time input, so the "
                     "graph would read the whole 8-bit head in draft passes too): export the graph with "
                     "`--draft-head 8bit`")
# The graph scores every id in draft passes too (a checkpoint's draft vocabulary is refused where it runs:
# edge.engine.step_engine), so an export that writes it records none.
DRAFT_VOCAB_REFUSAL = ("the step graph scores the whole vocabulary in draft passes (the view is a run-time input), "
                       "so it cannot serve a draft vocabulary of {n} ids: drop --draft-vocab with --onnx/--engine")
# Above this many initializer bytes the weights go to an external data file (protobuf caps a message at 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30


class _Builder:
    """Accumulates nodes and initializers; `op` returns the output names of the node it adds."""

    def __init__(self, data: ExternalData | None = None):
        self.nodes, self.inits, self._n, self.data = [], {}, 0, data

    def init(self, name: str, array) -> str:
        """Add initializer `name` (once): in the graph, or streamed to the external data file where one is open."""
        if name not in self.inits:
            a = array.numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
            self.inits[name] = self.data.tensor(name, a) if self.data is not None else \
                numpy_helper.from_array(np.ascontiguousarray(a), name)
        return name

    def op(self, op_type: str, inputs, n_out: int = 1, domain: str = "", out: str | None = None, outputs=(),
           **attrs):
        """Add a node; returns its first output's name, or all of them with n_out > 1. `out` names the first
        output (a value the graph exposes), `outputs` the outputs after it (graph outputs the node writes)."""
        self._n += 1
        outs = [out] if out else [f"{op_type.lower()}_{self._n}" + (f"_{i}" if n_out > 1 else "") for i in range(n_out)]
        outs += list(outputs)
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"{op_type}_{self._n}",
                                           domain=domain, **attrs))
        return outs if n_out > 1 else outs[0]

    def const_i64(self, name: str, values) -> str:
        return self.init(name, np.asarray(values, dtype=np.int64))


class _StepGraph:
    """Builds the step graph of one checkpoint (edge.model.decoder.Decoder's forward, op for op)."""

    def __init__(self, ckpt: Checkpoint, data: ExternalData | None = None):
        self.ckpt, self.cfg, self.b = ckpt, ckpt.config, _Builder(data)

    # -- pieces -------------------------------------------------------------------------------------
    def linear(self, name: str, x: str, view: str = VIEW) -> str:
        """`name` applied to x at the view the graph input `view` carries (or a constant view's initializer)."""
        b, t = self.b, self.ckpt.tensors
        base, refine, scale, offset, _ = plane_inits(b, name, self.ckpt.planes(name))    # int32 words, tiled or not
        ins = [x, base, refine, scale, view] + ([offset] if offset is not None else [])
        y = b.op(DUAL_PLANE_LINEAR.graph, ins, domain=DOMAIN)                                   # [M, N]
        bias = t.get(name + ".bias")
        return y if bias is None else b.op("Add", [y, b.init(name + ".bias", bias.float())])

    def rms_norm(self, x: str, weight_name: str) -> str:
        b = self.b
        w = b.init(weight_name + ".weight", self.ckpt.tensors[weight_name + ".weight"].float())
        eps = b.init("rms_eps", np.asarray(self.cfg.rms_norm_eps, dtype=np.float32))
        return b.op(RMS_NORM, [x, w, eps], domain=DOMAIN)

    def heads(self, y: str, n_heads: int) -> str:
        """[M, H*D] -> [H, M, D]."""
        b, d = self.b, self.cfg.head_dim
        shape = b.const_i64(f"shape_heads_{n_heads}", [-1, n_heads, d])
        return b.op("Transpose", [b.op("Reshape", [y, shape])], perm=[1, 0, 2])

    def rope(self, x: str, cos: str, sin: str) -> str:
        """x [H, M, D] rotated by position (rotate-half convention), cos/sin [M, D]."""
        b, half = self.b, self.cfg.head_dim // 2
        lo = b.op("Slice", [x, b.const_i64("zero1", [0]), b.const_i64("half1", [half]), b.const_i64("axis_last", [-1])])
        hi = b.op("Slice", [x, b.const_i64("half1", [half]), b.const_i64("end1", [self.cfg.head_dim]), b.const_i64("axis_last", [-1])])
        rot = b.op("Concat", [b.op("Neg", [hi]), lo], axis=-1)
        return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rot, sin])])

    def head(self, x: str) -> str:
        """Logits [M, V]. A nested head at the view its draft-head setting gives each pass (edge.model.draft_head):
        `8bit` reads it at the target view in both views (a constant view input), `4bit` at the pass's view."""
        b, t, cfg = self.b, self.ckpt.tensors, self.cfg
        if self.ckpt.head_nested:
            if self.ckpt.draft_head == DRAFT_HEAD_8BIT:
                return self.linear(HEAD, x, b.init("view_target", np.asarray([view_code(TARGET)], np.int64)))
            return self.linear(HEAD, x)
        name = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        w = b.op("Cast", [b.init(name, t[name])], to=TensorProto.FLOAT)                     # [V, H]
        return b.op("Gemm", [x, w], transB=1)                                               # [M, V]

    # -- the step -----------------------------------------------------------------------------------
    def block(self, layer: int, x: str, cos: str, sin: str) -> str:
        b, cfg, p = self.b, self.cfg, f"model.layers.{layer}."
        h = self.rms_norm(x, p + "input_layernorm")
        q = self.rope(self.heads(self.linear(p + "self_attn.q_proj", h), cfg.num_heads), cos, sin)
        k = self.rope(self.heads(self.linear(p + "self_attn.k_proj", h), cfg.num_kv_heads), cos, sin)
        v = self.heads(self.linear(p + "self_attn.v_proj", h), cfg.num_kv_heads)
        # the node's plane outputs are the graph's KV outputs themselves: an Identity would be a copy of the planes
        att = b.op(NESTED_KV_ATTENTION.graph, [q, k, v, *kv_inputs(layer), SEQ_LEN, KV8_FROM], domain=DOMAIN,
                   outputs=kv_outputs(layer))
        flat = b.const_i64("shape_attn", [-1, cfg.num_heads * cfg.head_dim])
        a = b.op("Reshape", [b.op("Transpose", [att], perm=[1, 0, 2]), flat])             # [M, Hq*D]
        x = b.op("Add", [x, self.linear(p + "self_attn.o_proj", a)])
        h = self.rms_norm(x, p + "post_attention_layernorm")
        g = b.op(SILU_MUL, [self.linear(p + "mlp.gate_proj", h), self.linear(p + "mlp.up_proj", h)], domain=DOMAIN)
        if self.ckpt.rotations.r4_size is not None:
            g = b.op(HADAMARD_ROWS, [g], domain=DOMAIN, **{HADAMARD_FACTORS: factors_attribute(
                self.ckpt.rotations.r4_factors)})                                           # [M, I] @ H
        return b.op("Add", [x, self.linear(p + "mlp.down_proj", g)], out=residual(layer))

    def build(self) -> onnx.ModelProto:
        b, cfg, t = self.b, self.cfg, self.ckpt.tensors
        # positions [S - M, S) and their RoPE rows, gathered from tables computed as edge.model.decoder does.
        # Range(0, M) + (S - M), never Range(S - M, S): TensorRT imports Range's operands as shape tensors
        # (onnx-tensorrt onnxOpImporters.cpp, Range: "using only operations allowed on shape tensors"), which would
        # make seq_len a shape tensor (host memory, values bound by the profile) instead of a device input.
        s = b.op("Squeeze", [SEQ_LEN, b.const_i64("axis0", [0])])
        m = b.op("Squeeze", [b.op("Shape", [INPUT_IDS]), b.const_i64("axis0", [0])])              # from a shape only
        steps = b.op("Range", [b.init("zero_i64", np.asarray(0, dtype=np.int64)), m,
                               b.init("one_i64", np.asarray(1, dtype=np.int64))])               # [M]: 0..M-1
        pos = b.op("Add", [steps, b.op("Sub", [s, m])])                                         # [M]
        cos_t, sin_t = rope_tables(cfg, torch.arange(cfg.max_position_embeddings), torch.float32)
        cos = b.op("Gather", [b.init("rope.cos", cos_t), pos], axis=0)                     # [M, D]
        sin = b.op("Gather", [b.init("rope.sin", sin_t), pos], axis=0)
        r1 = self.ckpt.rotations.r1
        if self.ckpt.embedding_from_head:   # rows of the nested head's int32-word planes, target view (onnx_rows)
            x = nested_rows(b, HEAD, self.ckpt.planes(HEAD), self.ckpt.linears[HEAD].group_size, INPUT_IDS,
                            out=None if r1 is not None else EMBEDDED)                     # [M, H]
        else:
            emb = b.init("model.embed_tokens.weight", t["model.embed_tokens.weight"])     # float16 [V, H]
            x = b.op("Cast", [b.op("Gather", [emb, INPUT_IDS], axis=0)], to=TensorProto.FLOAT,
                     out=None if r1 is not None else EMBEDDED)                              # [M, H]
        if r1 is not None:
            x = b.op(ROTATE_ROWS, [x, b.init("rotation.r1", r1.float())], domain=DOMAIN, out=EMBEDDED)
        for layer in range(cfg.num_layers):
            x = self.block(layer, x, cos, sin)
        if r1 is not None:
            x = b.op("MatMul", [x, b.op("Transpose", ["rotation.r1"], perm=[1, 0])])       # back to the original basis
        logits = self.head(self.rms_norm(x, "model.norm"))
        b.nodes.append(helper.make_node("Identity", [logits], [LOGITS], name="out_logits"))
        functions = [rms_norm_function(), silu_mul_function(), rotate_rows_function()]
        if self.ckpt.rotations.r4_size is not None:
            functions.append(hadamard_rows_function(self.ckpt.rotations.r4_size, self.ckpt.rotations.r4_factors))
        return helper.make_model(
            helper.make_graph(b.nodes, "bitnest_decoder_step", self.inputs(), self.outputs(), list(b.inits.values())),
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
            functions=functions, ir_version=IR_VERSION, producer_name="bitnest-export")

    def inputs(self):
        ins = [helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["M"])]
        ins += [helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in (SEQ_LEN, KV8_FROM, VIEW)]
        for layer in range(self.cfg.num_layers):
            ins += self._planes(kv_inputs(layer))
        return ins

    def outputs(self):
        outs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["M", self.cfg.vocab_size])]
        for layer in range(self.cfg.num_layers):
            outs += self._planes(kv_outputs(layer))
        return outs

    def _planes(self, names):
        """Value infos of one layer's planes (int32 words [2, Hkv, C, D/8]) and scales (float16 [2, Hkv, C])."""
        words = StepShapes.of(self.cfg).plane_shape(1)[3]
        base, refine, scale = names
        hkv = self.cfg.num_kv_heads
        return [helper.make_tensor_value_info(base, TensorProto.INT32, [2, hkv, "C", words]),
                helper.make_tensor_value_info(refine, TensorProto.INT32, [2, hkv, "C", words]),
                helper.make_tensor_value_info(scale, TensorProto.FLOAT16, [2, hkv, "C"])]


def build_step_model(ckpt: Checkpoint, data: ExternalData | None = None) -> onnx.ModelProto:
    """The checked step graph of a loaded checkpoint (metadata ties it to the checkpoint's weights and records the
    draft head it serves, `ckpt.draft_head`); with `data`, its weights streamed there as they are added."""
    if ckpt.draft_head == DRAFT_HEAD_SHORTLIST:
        raise BitNestError(SHORTLIST_REFUSAL)
    register_schemas()
    model = _StepGraph(ckpt, data).build()
    meta = {"bitnest.format_version": str(ckpt.manifest["format_version"]),
            "bitnest.weights_sha256": weights_sha256(ckpt.manifest),
            "bitnest.method": ckpt.method,
            "bitnest.activations": "int8 per token (W4A8 draft, W8A8 target)",
            DRAFT_HEAD_META: ckpt.draft_head or FLOAT16_HEAD}
    helper.set_model_props(model, meta)
    return model


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the graph's initializers, in the graph or in its external data file."""
    def size(t) -> int:
        if t.data_location == TensorProto.EXTERNAL:
            return next(int(e.value) for e in t.external_data if e.key == "length")
        return len(t.raw_data)
    return sum(size(t) for t in model.graph.initializer)


def _write_checked(model: onnx.ModelProto, tmp: Path, out: Path, external: bool, streamed: bool) -> None:
    """Write `model` into the staging folder `tmp` (its weights to `out`.data with `external`, unless `streamed`
    wrote them there already), check it by path, then rename file(s) into place beside `out`."""
    data_name = out.name + ".data"
    if streamed:
        onnx.save_model(model, str(tmp / out.name))          # the tensors refer to tmp / data_name already
    else:
        onnx.save_model(model, str(tmp / out.name), save_as_external_data=external, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
    onnx.checker.check_model(str(tmp / out.name), full_check=True)  # by path: external data too
    if external:
        os.replace(tmp / data_name, out.parent / data_name)
    elif (out.parent / data_name).exists():
        (out.parent / data_name).unlink()  # a stale weights file of an earlier external-data export
    os.replace(tmp / out.name, out)


def export_onnx(checkpoint, out=None, external=None, draft_head: str | None = None) -> dict:
    """Export the step graph of the checkpoint folder `checkpoint` to `out` (default: beside its weights,
    CHECKPOINT/decoder_step.onnx); `external` None = external data only past EXTERNAL_DATA_BYTES of checkpoint tensors
    (external weights are written as the graph is built: export.onnx.external); `draft_head` the
    draft head the graph serves (None: the checkpoint's, the 8-bit head where it records the shortlist:
    edge.model.draft_head.graph_draft_head)."""
    t0 = time.time()
    ckpt = load_checkpoint(checkpoint)
    ckpt = set_draft_head(ckpt, draft_head if draft_head is not None else graph_draft_head(ckpt.draft_head))
    if external is None:     # the graph's weights are the checkpoint's tensors (and RoPE tables, a few MB)
        external = sum(t.numel() * t.element_size() for t in ckpt.tensors.values()) > EXTERNAL_DATA_BYTES
    out = Path(out) if out else ckpt.path / ONNX_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    from export.trt.readiness import check_graph
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        # external weights stream into the staging folder as the graph is built (ExternalData): the graph in memory
        # holds references only, and nothing reaches `out` before the whole graph is written and checked
        data = ExternalData(tmp / (out.name + ".data")) if external else None
        try:
            model = build_step_model(ckpt, data)
        finally:
            if data is not None:
                data.close()
        init_bytes = initializer_bytes(model)
        rules = [str(v) for v in check_graph(model)]     # what TensorRT 10.3 would refuse (none expected)
        _write_checked(model, tmp, out, external, streamed=data is not None)
    finally:
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    digests = onnx_digests(out)
    write_atomic(json.dumps(digests).encode(), out.with_name(out.name + ONNX_DIGEST_SUFFIX))
    return {"onnx": str(out), "external_data": bool(external), "initializer_bytes": init_bytes,
            "tensorrt_rule_violations": rules,
            "file_bytes": out.stat().st_size, "nodes": bitnest_node_counts(model), "seconds": round(time.time() - t0, 1),
            "sha256": digests[out.name]}
