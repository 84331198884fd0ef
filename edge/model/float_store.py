"""Float weight store: the decoder over plain float tensors (HF names), for the float reference and for
export-time passes (rotation checks, GPTQ calibration). It holds no nested planes and ignores the view."""

from typing import Callable, Optional

import torch


class FloatWeights:
    """Weights as a dict of float tensors keyed by HF parameter names ("...q_proj.weight")."""

    device = None   # CPU tensors

    def __init__(self, tensors: dict[str, torch.Tensor], tied: bool, dtype: torch.dtype = torch.float32,
                 on_linear: Optional[Callable[[str, torch.Tensor], None]] = None):
        self.t, self.tied, self.dtype = tensors, tied, dtype
        self.on_linear = on_linear  # called with (name, input) before each linear: calibration capture

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.t["model.embed_tokens.weight"][ids].to(self.dtype)

    def norm(self, name: str) -> torch.Tensor:
        return self.t[name + ".weight"]

    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor:
        if self.on_linear is not None:
            self.on_linear(name, x)
        y = x @ self.t[name + ".weight"].to(x.dtype).T
        bias = self.t.get(name + ".bias")
        return y if bias is None else y + bias.to(x.dtype)

    def head(self, x: torch.Tensor, view: str) -> torch.Tensor:
        w = self.t["model.embed_tokens.weight" if self.tied else "lm_head.weight"]
        return x @ w.to(x.dtype).T
