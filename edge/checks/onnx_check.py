"""The ONNX round trip check: real prompts through the exported step graph (onnxruntime) and through the
torch backend, pass for pass, for each weight/KV view; reports the worst relative error on logits and the
argmax agreement (used by scripts/verify_onnx.py and the self-check)."""

from dataclasses import dataclass

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


def chat_prompts(ckpt: Checkpoint, n: int, max_tokens: int) -> list[list[int]]:
    """Token ids of `n` held-out ShareGPT requests in the model's chat template, cut to `max_tokens`."""
    from edge.analysis.corpora import sharegpt_prompts
    from edge.runtime import load_tokenizer

    tok = load_tokenizer(ckpt.path)
    out = []
    for text in sharegpt_prompts(n, max_chars=400):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        out.append(list(ids)[:max_tokens])
    return out


def verify(checkpoint, onnx_path, prompts: int = 2, max_prompt_tokens: int = 24,
           opts: CheckOptions = CheckOptions()) -> dict:
    """scripts/verify_onnx.py: real prompts through the ONNX graph and the torch backend, every mode.
    {"max_rel_err", "argmax_agreement", "nodes", "modes", "prompts", "seconds"}."""
    import time

    from edge.backends.onnxruntime_step import open_session
    from edge.model.checkpoint import load_checkpoint

    if prompts < 1 or max_prompt_tokens < 1:
        raise ValueError("--prompts and --max-prompt-tokens must be at least 1")
    t0 = time.time()
    ckpt = load_checkpoint(checkpoint)
    session = open_session(onnx_path)
    result = compare(ckpt, session, chat_prompts(ckpt, prompts, max_prompt_tokens), opts)
    return {**result, "nodes": onnx_node_counts(onnx_path), "prompts": prompts, "seconds": round(time.time() - t0, 1)}
