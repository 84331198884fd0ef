"""The ONNX round trip check: real prompts through the exported step graph (onnxruntime) and through the
torch backend, pass for pass, for each weight/KV view; reports the worst relative error on logits and the
argmax agreement (used by scripts/verify_onnx.py and the self-check)."""

from dataclasses import dataclass
from pathlib import Path

import torch

from edge.backends.onnxruntime_step import OnnxStepRunner
from edge.backends.torch_ref import TorchBackend
from edge.decode.engine import PassEngine
from edge.decode.kv_cache import KVRead
from edge.model.checkpoint import Checkpoint
from plugins.step_contract import StepShapes

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


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ (Frobenius), in float64."""
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def compare_prompt(ckpt: Checkpoint, session, ids: list[int], mode: str, opts: CheckOptions) -> dict:
    """One prompt in one mode: chunked prompt passes, then greedy passes (torch's token fed to both)."""
    view, kv = MODES[mode]
    capacity = len(ids) + opts.new_tokens + 1
    eng = PassEngine(ckpt, TorchBackend(ckpt, act_int8=True), capacity)
    runner = OnnxStepRunner(session, StepShapes.of(ckpt.config), capacity)
    errs, agree, total = [], 0, 0

    def one_pass(tokens: list[int]) -> torch.Tensor:
        nonlocal agree, total
        end = eng.length + len(tokens)
        ref = eng.forward(tokens, view, kv)                                               # [T, V]
        out = torch.from_numpy(runner.execute(tokens, view, end, kv.kv8_from(end)))     # [T, V]
        eng.commit(end)
        errs.append(rel_err(out, ref))
        agree += int((out.argmax(-1) == ref.argmax(-1)).sum())
        total += len(tokens)
        return ref

    for i in range(0, len(ids), opts.chunk):
        ref = one_pass(ids[i:i + opts.chunk])
    for _ in range(opts.new_tokens):
        ref = one_pass([int(ref[-1].argmax())])
    return {"max_rel_err": max(errs), "agree": agree, "positions": total, "passes": len(errs)}


def onnx_node_counts(onnx_path) -> dict[str, int]:
    """{op type: count} of the `bitnest` nodes in an ONNX file (weights not loaded)."""
    import onnx

    from plugins.onnx_schemas import bitnest_node_counts

    return bitnest_node_counts(onnx.load(str(onnx_path), load_external_data=False))


def compare(ckpt: Checkpoint, session, prompts: list[list[int]], opts: CheckOptions = CheckOptions()) -> dict:
    """Every prompt in every mode; {"max_rel_err", "argmax_agreement", "modes": {mode: {...}}}."""
    modes = {}
    for mode in opts.modes:
        rs = [compare_prompt(ckpt, session, ids, mode, opts) for ids in prompts]
        modes[mode] = {"max_rel_err": max(r["max_rel_err"] for r in rs),
                       "argmax_agreement": sum(r["agree"] for r in rs) / sum(r["positions"] for r in rs),
                       "passes": sum(r["passes"] for r in rs)}
    return {"max_rel_err": max(m["max_rel_err"] for m in modes.values()),
            "argmax_agreement": min(m["argmax_agreement"] for m in modes.values()), "modes": modes}


def matching_onnx(checkpoint) -> str | None:
    """CHECKPOINT/decoder_step.onnx where it exists and was exported from these weights, else None."""
    import onnx

    from edge.model.checkpoint import WEIGHTS, read_manifest
    from plugins.step_contract import ONNX_FILE

    beside = Path(checkpoint) / ONNX_FILE
    if not beside.is_file():
        return None
    meta = {p.key: p.value for p in onnx.load(str(beside), load_external_data=False).metadata_props}
    return str(beside) if meta.get("bitnest.weights_sha256") == read_manifest(checkpoint)["files"][WEIGHTS] else None
