"""`torch` backend: the reference semantics over a nested checkpoint (exact, slow). Linears run
`plugins.reference.dual_plane_linear` with per-token INT8 activations, or float activations when asked."""

import torch

from edge.checkpoint import HEAD, Checkpoint
from plugins.reference import dequantized_weight, dual_plane_linear


class TorchReferenceWeights:
    """Weight store over a loaded checkpoint; `act_int8` selects W4A8/W8A8 (True) or float activations."""

    def __init__(self, ckpt: Checkpoint, act_int8: bool = True):
        self.ckpt, self.act_int8, self.dtype = ckpt, act_int8, torch.float32
        self.name = "torch" if act_int8 else "torch-float-act"

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.ckpt.tensors["model.embed_tokens.weight"][ids].float()

    def norm(self, name: str) -> torch.Tensor:
        return self.ckpt.tensors[name + ".weight"].float()

    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor:
        base, refine, scale, offset = self.ckpt.planes(name)
        refine = refine if view == "target" else None   # the draft never reads the refinement plane
        if self.act_int8:
            y = dual_plane_linear(x, base, refine, scale, view, offset, act_int8=True).float()
        else:
            y = x.float() @ dequantized_weight(base, refine, scale, view, offset).T
        bias = self.ckpt.tensors.get(name + ".bias")
        return y if bias is None else y + bias.float()

    def head(self, x: torch.Tensor, view: str) -> torch.Tensor:
        if self.ckpt.head_nested:
            return self.linear(HEAD, x, view)
        t = self.ckpt.tensors
        w = t["model.embed_tokens.weight"] if self.ckpt.config.tie_word_embeddings else t["lm_head.weight"]
        return x.float() @ w.float().T
