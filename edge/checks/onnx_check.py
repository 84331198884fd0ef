"""The ONNX check: real prompts through the exported step graph (onnxruntime, with the graph's local functions
inlined to onnxruntime's own standard kernels, as TensorRT inlines them, and only the two BitNest ops as Python ops)
against an independent float64 reference of the step (edge.checks.step_reference: numpy, written from the
contracts, sharing no code with those ops or the torch backend), for each weight/KV view (scripts/verify_onnx.py
and the self-check).

Teacher-forced, layer by layer: the check exposes the graph's residual stream after every layer and gives each
layer of the reference the graph's own input to that layer and the graph's own KV planes. A free-running float64
reference cannot be compared tightly with a float32 graph: one ulp before an INT8 or KV quantizer flips a code
somewhere in 30 layers, and those flips compound (measured on the 135M model: 4-6% logit error at the target view,
~20% at KV4 drafting, for the graph and the torch backend alike). Layer by layer, a flip costs one code of one
layer: the errors stay near float32 rounding and a wrong op body (norm, SiLU, rotation, Hadamard, RoPE, attention,
the KV write) shows as an error of order one."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.backends.onnxruntime_step import OnnxStepRunner, open_session
from edge.checks.step_reference import StepReference, unpack
from edge.engine.kv_cache import KVRead
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint, set_draft_head
from edge.model.draft_head import DRAFT_HEADS
from plugins.step_contract import DRAFT_HEAD_META, EMBEDDED, StepShapes, residual

# (weight view, KV view): verification (target, KV8), drafting at short context (draft, KV8) and at long
# context (draft, KV4).
MODES = {"target-kv8": ("target", KVRead("kv8")), "draft-kv8": ("draft", KVRead("kv8")),
         "draft-kv4": ("draft", KVRead("kv4"))}


@dataclass(frozen=True)
class CheckOptions:
    chunk: int = 5            # tokens per prompt pass: γ+1, the largest pass a decode engine runs
    new_tokens: int = 4       # greedy single-token passes after the prompt
    modes: tuple[str, ...] = tuple(MODES)

    def __post_init__(self):
        if self.chunk < 1 or self.new_tokens < 0:
            raise ValueError("chunk must be >= 1 and new tokens >= 0")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown mode {bad[0]!r}: use {', '.join(MODES)}")


def rel_err(out: np.ndarray, ref: np.ndarray, scale: np.ndarray | None = None) -> float:
    """‖out − ref‖ / ‖ref‖ (Frobenius, float64), or / ‖scale‖ where given (a layer's own contribution)."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref if scale is None else scale))


def exposed(layers: int) -> tuple[str, ...]:
    """The intermediate values the check reads: the residual stream entering layer 0 and leaving each layer."""
    return (EMBEDDED,) + tuple(residual(i) for i in range(layers))


def check_session(onnx_path, layers: int):
    """The session the check runs: local functions inlined to onnxruntime's kernels, residuals exposed."""
    import onnx
    if Path(onnx_path).is_file():
        named = {o for n in onnx.load(str(onnx_path), load_external_data=False).graph.node for o in n.output}
        if not set(exposed(layers)) <= named:
            raise BitNestError(f"{onnx_path} does not name its per-layer residuals (exported before they were): "
                               "export it again with `python scripts/export.py --out CKPT --existing --onnx`")
    return open_session(onnx_path, inline_functions=True, expose=exposed(layers))


def byte_planes(planes, copy: bool = False) -> tuple:
    """A layer's (base, refine, scale) as the graph holds them (int32 words [2, Hkv, C, D/8] for the code planes)
    seen as the contract's packed bytes [2, Hkv, C, D/2], the layout the reference reads; copied where asked."""
    base, refine, scale = (np.array(a) if copy else a for a in planes)
    return np.ascontiguousarray(base).view(np.uint8), np.ascontiguousarray(refine).view(np.uint8), scale


def compare_pass(ref: StepReference, runner: OnnxStepRunner, tokens: list[int], view: str, end: int,
                 kv8_from: int) -> dict:
    """One pass through the graph, then the reference on the graph's own per-layer inputs and KV planes."""
    prior = [byte_planes(planes, copy=True) for planes in runner.planes]
    logits, ex = runner.run(tokens, view, end, kv8_from, exposed(ref.layers))
    ref.kv, m = prior, len(tokens)
    errs = {"embedded": rel_err(ex[EMBEDDED], ref.embed(tokens))}
    x, layer_errs, codes, flips = ex[EMBEDDED].astype(np.float64), [], 0, 0
    for i in range(ref.layers):
        want = ref.block(i, x, view, end, kv8_from)                        # [M, H] from the graph's own input
        got = ex[residual(i)]
        layer_errs.append(rel_err(got, want, want - x))                    # relative to the layer's contribution
        for j, (mine, graph) in enumerate(zip(ref.new_entries[i][:2], byte_planes(runner.planes[i])[:2])):
            a, b = unpack(mine), unpack(np.ascontiguousarray(graph[:, :, end - m:end]))
            codes, flips = codes + a.size, flips + int((a != b).sum())
        x = got.astype(np.float64)
    want = ref.final(x, view)                                              # [M, V]
    errs["logits"] = rel_err(logits, want)
    return {"errs": errs, "layer_errs": layer_errs, "agree": int((logits.argmax(-1) == want.argmax(-1)).sum()),
            "positions": m, "kv_codes": codes, "kv_code_flips": flips, "next": int(want[-1].argmax())}


def compare_prompt(ckpt: Checkpoint, session, ids: list[int], mode: str, opts: CheckOptions) -> dict:
    """One prompt in one mode: chunked prompt passes, then greedy passes (the reference's token fed back)."""
    view, kv = MODES[mode]
    capacity = len(ids) + opts.new_tokens + 1
    ref = StepReference(ckpt.path, capacity, ckpt.draft_head)
    runner = OnnxStepRunner(session, StepShapes.of(ckpt.config), capacity)
    passes, length = [], 0
    chunks = [ids[i:i + opts.chunk] for i in range(0, len(ids), opts.chunk)]
    for n in range(len(chunks) + opts.new_tokens):
        tokens = chunks[n] if n < len(chunks) else [passes[-1]["next"]]
        length += len(tokens)
        passes.append(compare_pass(ref, runner, tokens, view, length, kv.kv8_from(length)))
    worst = {k: max(p["errs"][k] for p in passes) for k in passes[0]["errs"]}
    return {"errs": worst, "layer_errs": [e for p in passes for e in p["layer_errs"]],
            "agree": sum(p["agree"] for p in passes), "positions": sum(p["positions"] for p in passes),
            "passes": len(passes), "kv_codes": sum(p["kv_codes"] for p in passes),
            "kv_code_flips": sum(p["kv_code_flips"] for p in passes)}


def onnx_node_counts(onnx_path) -> dict[str, int]:
    """{op type: count} of the `bitnest` nodes in an ONNX file (weights not loaded)."""
    import onnx

    from plugins.onnx.schemas import bitnest_node_counts

    return bitnest_node_counts(onnx.load(str(onnx_path), load_external_data=False))


def compare(ckpt: Checkpoint, session, prompts: list[list[int]], opts: CheckOptions = CheckOptions()) -> dict:
    """Every prompt in every mode. `max_rel_err`: the worst error of the embedding and of the logits (the float
    tail after the last layer); `layer_err_median` / `layer_err_max`: each layer's output against the reference on
    the same input, relative to the layer's own contribution (a flipped INT8 or KV code moves one layer by up to
    ~1e-2; float32 rounding alone gives ~1e-6); `kv_code_flip_rate`: new KV codes that differ. `session` comes
    from `check_session`."""
    served = session.get_modelmeta().custom_metadata_map.get(DRAFT_HEAD_META)
    if ckpt.head_nested and served in DRAFT_HEADS:     # check the head as the graph serves it (its export's setting)
        set_draft_head(ckpt, served)
    modes = {}
    for mode in opts.modes:
        rs = [compare_prompt(ckpt, session, ids, mode, opts) for ids in prompts]
        layers = [e for r in rs for e in r["layer_errs"]]
        modes[mode] = {"max_rel_err": max(max(r["errs"].values()) for r in rs),
                       "layer_err_median": float(np.median(layers)), "layer_err_max": max(layers),
                       "argmax_agreement": sum(r["agree"] for r in rs) / sum(r["positions"] for r in rs),
                       "kv_code_flip_rate": sum(r["kv_code_flips"] for r in rs) / sum(r["kv_codes"] for r in rs),
                       "passes": sum(r["passes"] for r in rs)}
    worst = lambda k, f=max: f(m[k] for m in modes.values())
    return {"draft_head": ckpt.draft_head, "max_rel_err": worst("max_rel_err"),
            "layer_err_median": worst("layer_err_median"),
            "layer_err_max": worst("layer_err_max"), "argmax_agreement": worst("argmax_agreement", min),
            "kv_code_flip_rate": worst("kv_code_flip_rate"), "modes": modes}


def matching_onnx(checkpoint) -> str | None:
    """CHECKPOINT/decoder_step.onnx where it exists and was exported from these weights, else None."""
    import onnx

    from edge.model.manifest import read_manifest, weights_sha256
    from plugins.step_contract import ONNX_FILE

    beside = Path(checkpoint) / ONNX_FILE
    if not beside.is_file():
        return None
    meta = {p.key: p.value for p in onnx.load(str(beside), load_external_data=False).metadata_props}
    return str(beside) if meta.get("bitnest.weights_sha256") == weights_sha256(read_manifest(checkpoint)) else None
