"""Run real prompts through an exported ONNX step graph (onnxruntime, CPU, local functions inlined to standard
kernels) and through an independent float64 reference of the step, pass for pass, for the target and draft views;
report the worst relative error on logits (see edge.checks.onnx_check)."""

import argparse

from edge.argtypes import Parser, count
from edge.checks.onnx_check import MODES, CheckOptions, check_session, compare, onnx_node_counts
from edge.options.run import run_cli
from edge.model.checkpoint import Checkpoint


def chat_prompts(ckpt: Checkpoint, n: int, max_tokens: int) -> list[list[int]]:
    """Token ids of `n` held-out ShareGPT requests in the model's chat template, cut to `max_tokens`."""
    from edge.corpora import sharegpt_prompts
    from edge.model.tokenizer import load_tokenizer

    tok = load_tokenizer(ckpt.path)
    out = []
    for text in sharegpt_prompts(n, max_chars=400):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        out.append(list(ids)[:max_tokens])
    return out


def verify(checkpoint, onnx_path, prompts: int = 2, max_prompt_tokens: int = 24,
           opts: CheckOptions = CheckOptions()) -> dict:
    """Real prompts through the ONNX graph and the independent reference, every mode (edge.checks.onnx_check).
    {"max_rel_err", "argmax_agreement", "kv_code_flip_rate", "nodes", "modes", "prompts", "seconds"}."""
    import time

    from edge.model.checkpoint import load_checkpoint

    if prompts < 1 or max_prompt_tokens < 1:
        raise ValueError("--prompts and --max-prompt-tokens must be at least 1")
    t0 = time.time()
    ckpt = load_checkpoint(checkpoint)
    session = check_session(onnx_path, ckpt.config.num_layers)
    result = compare(ckpt, session, chat_prompts(ckpt, prompts, max_prompt_tokens), opts)
    return {**result, "nodes": onnx_node_counts(onnx_path), "prompts": prompts, "seconds": round(time.time() - t0, 1)}


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="verify_onnx.py", description=__doc__)
    p.add_argument("--checkpoint", required=True, help="nested checkpoint folder the graph was exported from")
    p.add_argument("--onnx", required=True, help="ONNX step graph (scripts/export.py --onnx writes CKPT/decoder_step.onnx)")
    p.add_argument("--prompts", type=count(), default=2, help="held-out ShareGPT prompts")
    p.add_argument("--max-prompt-tokens", type=count(), default=24, help="prompt tokens kept (chat template included)")
    p.add_argument("--new-tokens", type=count(0), default=4, help="greedy single-token passes after each prompt")
    p.add_argument("--chunk", type=count(), default=5, help="tokens per prompt pass (γ+1)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated (weight view)-(KV view) modes")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)

    def body():
        opts = CheckOptions(chunk=a.chunk, new_tokens=a.new_tokens, modes=tuple(m for m in a.modes.split(",") if m))
        return verify(a.checkpoint, a.onnx, a.prompts, a.max_prompt_tokens, opts)

    return run_cli(body, a.json, "verify_onnx.py")
