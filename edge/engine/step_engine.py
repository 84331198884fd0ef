"""The engine for backends that run whole decoder steps (the exported step graph through onnxruntime or a
TensorRT engine): the runner owns the nested KV planes and computes a pass in one call; the engine interface
(edge.engine.interface) keeps the committed length, prefill and the byte accounting."""

from typing import Protocol

import numpy as np
import torch

from edge.engine.interface import Engine
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint, runs_as_recorded
from edge.model.draft_head import graph_draft_head
from plugins.step_contract import DRAFT_HEAD_META, FLOAT16_HEAD


def check_graph_draft_head(meta: dict, ckpt: Checkpoint, path) -> None:
    """A step graph's metadata `meta` says it serves the draft head `ckpt` is set to (edge.model.draft_head), else a
    one-line error naming both fixes; a draft vocabulary (which no graph serves) is refused. A checkpoint run at what
    its manifest records (no override) is first set to what the graph serves for it (graph_draft_head: the 8-bit head
    for a recorded shortlist, every id for a recorded draft vocabulary), in place, so the engine's byte accounting
    and the stats say what the graph reads. A graph exported before the setting existed read a nested head at the
    pass's view: `4bit`."""
    served = graph_draft_head(ckpt.draft_head)
    if served is not None and meta.get(DRAFT_HEAD_META) == served and runs_as_recorded(ckpt):
        ckpt.draft_head, ckpt.draft_vocab = served, None
    if ckpt.draft_vocab is not None:
        raise BitNestError(f"{path} scores the whole vocabulary in draft passes and the checkpoint's draft scores "
                           f"{ckpt.draft_vocab} ids only: pass --draft-vocab {ckpt.config.vocab_size} (the whole "
                           "vocabulary), or use the native backend")
    want = ckpt.draft_head or FLOAT16_HEAD
    got = meta.get(DRAFT_HEAD_META, "4bit" if ckpt.head_nested else FLOAT16_HEAD)
    if got != want:
        again = f"export the graph again with `python scripts/export.py --out {ckpt.path} --existing --onnx " \
                f"--draft-head {want}`" if graph_draft_head(want) == want else "use the native backend"
        raise BitNestError(f"{path} serves draft head {got} and the checkpoint is set to {want}: pass --draft-head "
                           f"{got}, or {again}")


class StepRunner(Protocol):
    """One sequence's KV planes and passes of M tokens through a step graph (plugins.step_contract)."""

    capacity: int
    max_tokens: int

    def execute(self, ids: list[int], view: str, seq_len: int, kv8_from: int) -> np.ndarray:
        """Pass over `ids` at positions [seq_len - M, seq_len), writing their KV entries there: logits [M, V]."""


class StepEngine(Engine):
    """Passes through a step runner. Draft passes write past the committed length in the runner's planes (the
    step graph has no scratch area); the verification pass overwrites those positions and a rollback is a
    smaller committed length."""

    def __init__(self, ckpt: Checkpoint, runner: StepRunner, backend: str, activations: str = "int8"):
        super().__init__(ckpt, runner.capacity, backend, activations, max_pass_tokens=runner.max_tokens)
        self.runner = runner

    def _forward(self, ids, view, start, kv, draft_slot, last_only):
        end = start + len(ids)
        logits = torch.from_numpy(self.runner.execute(ids, view, end, kv.kv8_from(end)))     # [T, V]
        return logits[-1:] if last_only else logits
