"""`torch` backend: the reference semantics over a nested checkpoint (exact, slow). With per-token INT8
activations (the default, W4A8 draft / W8A8 target) each group's integer dot product is computed exactly
(float32 holds every partial sum: |x_q| <= 127, |code| <= 136, G <= 128 gives < 2^24) and then scaled,
so results do not depend on how many tokens a pass holds. With float activations it is x @ W_view^T."""

import torch

from edge.checkpoint import HEAD, Checkpoint
from edge.model import rowwise
from plugins.contracts import REFINE_DIVISOR
from plugins.nesting import quantize_activations
from plugins.packing import unpack_nibbles
from plugins.reference import dequantized_weight


class TorchReferenceWeights:
    """Weight store over a loaded checkpoint; `act_int8` selects W4A8/W8A8 (True) or float activations."""

    def __init__(self, ckpt: Checkpoint, act_int8: bool = True):
        self.ckpt, self.act_int8, self.dtype = ckpt, act_int8, torch.float32
        self.name = "torch" if act_int8 else "torch-float-act"
        self.activations = "int8" if act_int8 else "float32"

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.ckpt.tensors["model.embed_tokens.weight"][ids].float()

    def norm(self, name: str) -> torch.Tensor:
        return self.ckpt.tensors[name + ".weight"].float()

    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor:
        base, refine, scale, offset = self.ckpt.planes(name)
        refine = refine if view == "target" else None   # the draft never reads the refinement plane
        if self.act_int8:
            y = self._int8_linear(x, base, refine, scale, offset)
        else:
            w = dequantized_weight(base, refine, scale, view, offset)
            y = rowwise(lambda r: r.float() @ w.T, x)
        bias = self.ckpt.tensors.get(name + ".bias")
        return y if bias is None else y + bias.float()

    @staticmethod
    def _int8_linear(x, base, refine, scale, offset) -> torch.Tensor:
        m, k = x.shape
        n, c = scale.shape
        g = k // c
        codes = unpack_nibbles(base).to(torch.int16)                            # [N, K]
        step = scale.float()                                                    # [N, C]
        if refine is not None:
            codes = codes * REFINE_DIVISOR + unpack_nibbles(refine)
            step = step / REFINE_DIVISOR
        xq, sx = quantize_activations(x)                                        # [M, K] int8, [M, 1]
        xg = xq.float().view(m, c, g).transpose(0, 1)                           # [C, M, G]
        partial = torch.bmm(xg, codes.float().view(n, c, g).permute(1, 2, 0))  # [C, M, N], exact integers
        y = (partial * step.T.unsqueeze(1)).sum(0)                              # [M, N]
        if offset is not None:
            xsum = xg.sum(-1).T                                                 # [M, C], exact integers
            y = y + (xsum.unsqueeze(-1) * offset.float().T.unsqueeze(0)).sum(1)
        return y * sx

    def head(self, x: torch.Tensor, view: str) -> torch.Tensor:
        if self.ckpt.head_nested:
            return self.linear(HEAD, x, view)
        t = self.ckpt.tensors
        w = (t["model.embed_tokens.weight"] if self.ckpt.config.tie_word_embeddings else t["lm_head.weight"]).float()
        return rowwise(lambda r: r.float() @ w.T, x)
