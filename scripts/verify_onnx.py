"""Run real prompts through an exported ONNX step graph (onnxruntime, CPU) and through the torch backend,
pass for pass, for the target and draft views; report the worst relative error on logits (see edge.checks.onnx_check)."""

import argparse
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from edge.checks.onnx_check import MODES, CheckOptions, verify  # noqa: E402
from edge.cli.common import run_cli  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="verify_onnx.py", description=__doc__)
    p.add_argument("--checkpoint", required=True, help="nested checkpoint folder the graph was exported from")
    p.add_argument("--onnx", required=True, help="ONNX step graph (scripts/export.py --onnx writes CKPT/decoder_step.onnx)")
    p.add_argument("--prompts", type=int, default=2, help="held-out ShareGPT prompts")
    p.add_argument("--max-prompt-tokens", type=int, default=24, help="prompt tokens kept (chat template included)")
    p.add_argument("--new-tokens", type=int, default=4, help="greedy single-token passes after each prompt")
    p.add_argument("--chunk", type=int, default=5, help="tokens per prompt pass (γ+1)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated (weight view)-(KV view) modes")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    a = p.parse_args(argv)

    def body():
        opts = CheckOptions(chunk=a.chunk, new_tokens=a.new_tokens, modes=tuple(m for m in a.modes.split(",") if m))
        return verify(a.checkpoint, a.onnx, a.prompts, a.max_prompt_tokens, opts)

    return run_cli(body, a.json, "verify_onnx.py")


if __name__ == "__main__":
    sys.exit(main())
