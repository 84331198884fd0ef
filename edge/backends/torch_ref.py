"""`torch` backend: the reference semantics over a nested checkpoint (exact, slow). With per-token INT8
activations (the default, W4A8 draft / W8A8 target) each group's integer dot product is computed exactly
(float32 holds every partial sum: |x_q| <= 127, |code| <= 136, G <= 128 gives < 2^24) and then scaled,
so results do not depend on how many tokens a pass holds. With float activations it is x @ W_view^T."""

import torch

from edge.model.checkpoint import EMBED, HEAD, Checkpoint
from plugins.decoder_math import rowwise
from plugins.reference import dequantized_weight, dual_plane_linear_int8, nested_embedding


class TorchBackend:
    """The reference ops over a loaded checkpoint; `act_int8` selects W4A8/W8A8 (True) or float activations."""

    device = None
    attention_ops = None   # dequantize + SDPA (plugins.reference semantics)

    def __init__(self, ckpt: Checkpoint, act_int8: bool = True):
        self.ckpt, self.act_int8, self.dtype = ckpt, act_int8, torch.float32
        self.name = "torch" if act_int8 else "torch-float-act"
        self.activations = "int8" if act_int8 else "float32"

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.ckpt.embedding_from_head:
            base, refine, scale, offset = self.ckpt.planes(HEAD)
            return nested_embedding(ids, base, refine, scale, offset)                   # [T, H]
        return self.ckpt.tensors[EMBED][ids].float()

    def norm(self, name: str) -> torch.Tensor:
        return self.ckpt.tensors[name + ".weight"].float()

    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor:
        y = self._planes_linear(x, *self.ckpt.planes(name), view)
        bias = self.ckpt.tensors.get(name + ".bias")
        return y if bias is None else y + bias.float()

    def _planes_linear(self, x, base, refine, scale, offset, view: str) -> torch.Tensor:
        refine = refine if view == "target" else None   # the draft never reads the refinement plane
        if self.act_int8:
            return dual_plane_linear_int8(x, base, refine, scale, offset)
        w = dequantized_weight(base, refine, scale, view, offset)
        return rowwise(lambda r: r.float() @ w.T, x)

    def head_rows(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[M, K]: token m against the head's rows ids[m] at the target view, by the same op as the whole head (each
        output row is computed alone: these equal the whole head's logits at those rows bit for bit)."""
        base, refine, scale, offset = self.ckpt.planes(HEAD)
        pick = lambda t, r: None if t is None else t[r]
        return torch.cat([self._planes_linear(x[m:m + 1], base[r], refine[r], scale[r], pick(offset, r), "target")
                          for m, r in enumerate(ids)])

    def head(self, x: torch.Tensor, view: str) -> torch.Tensor:
        if self.ckpt.head_nested:
            return self.linear(HEAD, x, view)
        t = self.ckpt.tensors
        w = (t["model.embed_tokens.weight"] if self.ckpt.config.tie_word_embeddings else t["lm_head.weight"]).float()
        return rowwise(lambda r: r.float() @ w.T, x)
