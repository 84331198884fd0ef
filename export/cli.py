"""`bitnest-export` / `python scripts/export.py`: export a nested W4/W8 checkpoint from a model."""

import argparse

from edge.cli import run_cli
from export.pipeline import DEFAULT_ROTATION, ExportOptions, run_export
from export.quantize import METHODS, REFINES, QuantOptions
from export.rotation import ROTATIONS


def _trust(text: str):
    return None if text == "none" else float(text)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bitnest-export", description=__doc__)
    p.add_argument("--model", default="default", help="`default` (embedded SmolLM2-135M-Instruct), an HF folder or a .gguf file")
    p.add_argument("--out", required=True, help="checkpoint folder to write (replaced if it is a checkpoint)")
    p.add_argument("--method", choices=METHODS, default="bitnest", help="bitnest = GPTQ base + fixed-base refinement")
    p.add_argument("--refine", choices=REFINES, default="closed", help="refinement fit (bitnest method)")
    p.add_argument("--rotation", choices=ROTATIONS, default=DEFAULT_ROTATION, help="function-preserving rotations to fuse")
    p.add_argument("--group-size", type=int, default=128, help="preferred group size (power of two)")
    p.add_argument("--no-act-order", action="store_true", help="GPTQ in natural column order")
    p.add_argument("--damp", type=float, default=0.01, help="GPTQ dampening, fraction of mean diag(H)")
    p.add_argument("--base-trust", type=_trust, default=0.1, metavar="D|none",
                   help="keep GPTQ base codes within 0.5+D steps of the weight so the refinement can reach it "
                        "(default 0.1; `none` = unconstrained GPTQ)")
    p.add_argument("--calib-samples", type=int, default=64, help="ShareGPT calibration windows")
    p.add_argument("--calib-seq-len", type=int, default=512, help="tokens per calibration window")
    p.add_argument("--quantize-head", action="store_true", help="store the LM head nested (RTN base) instead of float16")
    p.add_argument("--seed", type=int, default=0, help="rotation seed")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)

    def body():
        if a.calib_samples < 1 or a.calib_seq_len < 16:
            raise ValueError("--calib-samples must be >= 1 and --calib-seq-len >= 16")
        quant = QuantOptions(method=a.method, refine=a.refine, group_size=a.group_size,
                             act_order=not a.no_act_order, damp=a.damp, base_trust=a.base_trust, quantize_head=a.quantize_head)
        return run_export(ExportOptions(out=a.out, model=a.model, rotation=a.rotation, seed=a.seed,
                                        calib_samples=a.calib_samples, calib_seq_len=a.calib_seq_len, quant=quant))

    return run_cli(body, a.json, "bitnest-export")
