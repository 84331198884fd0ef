"""Device self-check: run every decode path this machine supports (torch, cpu, triton, onnxruntime, tensorrt,
energy meters) for a few tokens of the default model and compare each with the reference (see edge.checks.selfcheck).
A path this machine should have (onnxruntime; on a Jetson also triton, tensorrt, tegrastats) fails rather than skips.
Exit 0 when every path present passed and none expected was missing, 1 otherwise, 2 on bad input."""

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from edge.argtypes import Parser, count
from edge.checks.selfcheck import EXPECT, PATHS, SelfCheckOptions, run_selfcheck
from edge.options.run import run_cli
from edge.options.groups import checkpoint_arg
from export.commands import default_checkpoint


def onnx_for(checkpoint: Path, workdir: str) -> str:
    """CHECKPOINT/decoder_step.onnx when it was exported from these weights, else one the host's exporter
    (export.onnx.graph) writes into `workdir`."""
    from edge.checks.onnx_check import matching_onnx
    from plugins.step_contract import ONNX_FILE
    beside = matching_onnx(checkpoint)
    if beside is not None:
        return beside
    from export.onnx.graph import export_onnx
    return export_onnx(checkpoint, Path(workdir) / ONNX_FILE)["onnx"]


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="selfcheck.py", description=__doc__)
    p.add_argument("--checkpoint", help="nested checkpoint (default: the embedded SmolLM2 export, made once if absent)")
    p.add_argument("--engine", help="TensorRT engine (default: CHECKPOINT/decoder_step.engine)")
    p.add_argument("--tokens", type=count(), default=4, help="new tokens per path")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument("--triton-timeout", type=count(), default=600, help="seconds for the Triton kernel self-check")
    p.add_argument("--expect", default="auto", help=f"{' | '.join(EXPECT)}: which paths must run here (auto: by "
                   "this machine; jetson: triton, tensorrt and tegrastats as on a Jetson; none: onnxruntime only)")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    failed = []

    def body():
        opts = SelfCheckOptions(a.checkpoint or "", None, a.engine, a.tokens, tuple(x for x in a.paths.split(",") if x),
                                a.triton_timeout, a.expect)            # bad options fail before any work
        ckpt = Path(checkpoint_arg(a, default_checkpoint))
        with tempfile.TemporaryDirectory(prefix="bitnest-selfcheck-") as work:
            onnx_path = onnx_for(ckpt, work) if "onnxruntime" in opts.paths else None
            result = run_selfcheck(replace(opts, checkpoint=str(ckpt), onnx=onnx_path))
        for r in result["paths"]:
            print(f"{r['path']:>16}: {r['status']}" + (f" ({r['reason']})" if r["reason"] else ""), file=sys.stderr)
        failed.append(not result["passed"])
        return result

    rc = run_cli(body, a.json, "selfcheck.py", echo=False)
    return 1 if rc == 0 and failed and failed[0] else rc
