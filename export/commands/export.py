"""`bitnest-export` / `python scripts/export.py`: export a nested W4/W8 checkpoint from a model."""

import argparse

from edge.argtypes import Parser, at_least, count, positive, seed
from edge.options.run import run_cli
from edge.errors import BitNestError
from export.export_plan import HEAD_BLOCK_ROWS
from export.pipeline import DEFAULT_ROTATION, ExportOptions, default_draft_head, default_draft_vocab, run_export
from export.quantize import METHODS, REFINES, QuantOptions
from edge.model.draft_head import (DRAFT_HEAD_EXPORT_DEFAULT, DRAFT_HEAD_SHORTLIST, DRAFT_HEAD_SOURCE_DEFAULT,
                                   DRAFT_HEADS, SHORTLIST_K)
from export.rotation.learned import LearnOptions
from export.rotation.plan import ROTATIONS


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="bitnest-export", description=__doc__)
    p.add_argument("--model", default="default", help="`default` (embedded SmolLM2-135M-Instruct), an HF folder or a .gguf file")
    p.add_argument("--out", required=True, help="checkpoint folder to write (replaced if it is a checkpoint)")
    p.add_argument("--method", choices=METHODS, default="bitnest", help="bitnest = GPTQ base + fixed-base refinement")
    p.add_argument("--refine", choices=REFINES, default="closed", help="refinement fit (bitnest method)")
    p.add_argument("--rotation", choices=ROTATIONS, default=DEFAULT_ROTATION, help="function-preserving rotations to fuse")
    p.add_argument("--group-size", type=count(2), default=128, help="preferred group size (power of two)")
    p.add_argument("--no-act-order", action="store_true", help="GPTQ in natural column order")
    p.add_argument("--damp", type=positive(), default=0.01, help="GPTQ dampening, fraction of mean diag(H)")
    p.add_argument("--base-trust", type=at_least(none="unconstrained GPTQ"), default=0.1, metavar="D|none",
                   help="keep GPTQ base codes within 0.5+D steps of the weight so the refinement can reach it "
                        "(default 0.1; `none` = unconstrained GPTQ)")
    p.add_argument("--calib-samples", type=count(), default=64, help="ShareGPT calibration windows")
    p.add_argument("--calib-seq-len", type=count(16), default=512, help="tokens per calibration window")
    p.add_argument("--head-block-rows", type=count(), default=HEAD_BLOCK_ROWS,
                   help="rows of the head and the embedding read and nested at a time (lowers the export's peak memory)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where GPTQ and the calibration passes run: auto = a CUDA GPU where torch sees one, else the CPU")
    p.add_argument("--head", choices=("nested", "float16"), default="nested", help="nested (default): the LM head "
                   "stored as two 4-bit planes like any linear (GPTQ base with the bitnest method), the tied embedding "
                   "read from them; float16: a float16 head that both views read in full")
    p.add_argument("--draft-head", choices=DRAFT_HEADS, help="what the draft reads of the nested head, recorded in "
                   f"the manifest (8bit: the target's 8-bit view; 4bit: its base plane; shortlist: the base plane's "
                   f"top K rows re-scored at 8 bits; default {DRAFT_HEAD_SOURCE_DEFAULT} for an HF folder or a .gguf, "
                   f"{DRAFT_HEAD_EXPORT_DEFAULT} for the default model, a preset's own (qwen2.5-coder-0.5b: "
                   "shortlist); 8bit with --onnx/--engine, which serve no shortlist)")
    p.add_argument("--shortlist-k", type=count(), help=f"rows the shortlist re-scores, recorded in the manifest "
                   f"(default {SHORTLIST_K})")
    p.add_argument("--draft-vocab", type=count(), help="the draft scores token ids below N only (it reads N rows of "
                   "the head), recorded in the manifest (default: every id; a model preset may choose its own: "
                   "qwen2.5-coder-0.5b records 65536, none with --onnx/--engine)")
    p.add_argument("--seed", type=seed(), default=0, help="rotation seed")
    learn = LearnOptions()
    p.add_argument("--rotation-steps", type=count(), default=learn.steps, help="--rotation learned: Cayley SGD steps")
    p.add_argument("--rotation-samples", type=count(2), default=learn.samples,
                   help="--rotation learned: calibration windows (one held out)")
    p.add_argument("--rotation-seq-len", type=count(16), default=learn.seq_len, help="--rotation learned: tokens per window")
    p.add_argument("--rotation-lr", type=positive(), default=learn.lr, help="--rotation learned: Cayley SGD step bound")
    p.add_argument("--rotation-target-weight", type=at_least(), default=learn.target_weight,
                   help="--rotation learned: weight of the target view's loss beside the draft view's")
    p.add_argument("--onnx", action="store_true", help="also write the decoder-step ONNX graph (bitnest custom ops) "
                   "beside the weights: OUT/decoder_step.onnx")
    p.add_argument("--engine", action="store_true", help="also build the TensorRT engine OUT/decoder_step.engine "
                   "(implies --onnx; needs TensorRT and a CUDA GPU, e.g. a Jetson on JetPack 6.1/6.2)")
    p.add_argument("--existing", action="store_true", help="reuse the checkpoint already at --out (no re-export): "
                   "with --onnx / --engine, build only those")
    p.add_argument("--max-context", type=count(2), default=2048, help="engine profile: largest KV capacity")
    p.add_argument("--max-tokens", type=count(), default=5, help="engine profile: largest pass (γ+1)")
    p.add_argument("--kv-binding", choices=("auto", "aliased", "pingpong"), default="pingpong",
                   help="engine KV planes: pingpong (default: separate input and output buffers swapped each pass; "
                   "refused where the engine still copies a plane), aliased (in place, on request), or auto: aliased "
                   "unless the engine inspector shows plane copies (docs/tensorrt.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def parse(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)

    def body():
        if a.calib_samples < 1 or a.calib_seq_len < 16:
            raise ValueError("--calib-samples must be >= 1 and --calib-seq-len >= 16")
        profile = None
        if a.engine:  # refuse before minutes of export where no engine can be built
            from export.trt.build import engine_build_unavailable
            from plugins.step_contract import ProfileSpec

            reason = engine_build_unavailable()
            if reason:
                raise BitNestError(f"--engine: {reason}")
            profile = ProfileSpec(max_tokens=a.max_tokens, max_context=a.max_context)
        if (a.onnx or a.engine) and a.draft_head == DRAFT_HEAD_SHORTLIST:   # refuse before minutes of export
            from export.onnx.graph import SHORTLIST_REFUSAL
            raise BitNestError(SHORTLIST_REFUSAL)
        if (a.onnx or a.engine) and a.draft_vocab is not None:
            from export.onnx.graph import DRAFT_VOCAB_REFUSAL
            raise BitNestError(DRAFT_VOCAB_REFUSAL.format(n=a.draft_vocab))
        if a.existing:
            if not (a.onnx or a.engine):
                raise ValueError("--existing builds from a checkpoint already exported: add --onnx or --engine")
            if a.shortlist_k is not None:
                raise ValueError("--shortlist-k is recorded by an export; the step graph does not serve the shortlist")
            result = {"checkpoint": a.out}
        else:
            if a.head == "float16" and (a.draft_head or a.shortlist_k is not None or a.draft_vocab is not None):
                raise ValueError("--draft-head, --shortlist-k and --draft-vocab set what the draft reads of a nested "
                                 "head: drop them or drop --head float16")
            quant = QuantOptions(method=a.method, refine=a.refine, group_size=a.group_size, act_order=not a.no_act_order,
                                 damp=a.damp, base_trust=a.base_trust, quantize_head=a.head == "nested")
            learn = LearnOptions(steps=a.rotation_steps, samples=a.rotation_samples, seq_len=a.rotation_seq_len,
                                 lr=a.rotation_lr, target_weight=a.rotation_target_weight)
            result = run_export(ExportOptions(out=a.out, model=a.model, rotation=a.rotation, seed=a.seed,
                                              calib_samples=a.calib_samples, calib_seq_len=a.calib_seq_len, quant=quant,
                                              head_block_rows=a.head_block_rows, device=a.device,
                                              learn=learn, draft_head=a.draft_head or default_draft_head(
                                                  a.model, step_graph=a.onnx or a.engine),
                                              shortlist_k=SHORTLIST_K if a.shortlist_k is None else a.shortlist_k,
                                              draft_vocab=a.draft_vocab or default_draft_vocab(
                                                  a.model, step_graph=a.onnx or a.engine,
                                                  nested_head=a.head == "nested")))
        if a.onnx or a.engine:
            from export.onnx.graph import export_onnx
            result["onnx"] = export_onnx(a.out, draft_head=a.draft_head)
        if a.engine:
            from export.trt.build import build_engine
            result["engine"] = build_engine(result["onnx"]["onnx"], profile, kv_binding=a.kv_binding)
        return result

    return run_cli(body, a.json, "bitnest-export")
