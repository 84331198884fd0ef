"""Nesting a rotated float model: RTN, top-4-of-8, or sequential GPTQ (layer by layer, inputs from the
already-quantized prefix) for the W4 base, then the fixed-base refinement (closed form or GPTQ)."""

import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from edge.model.arch import BLOCK_LINEARS, ModelConfig
from edge.model.checkpoint import HEAD
from edge.model.decoder import Decoder, OnlineRotations, causal_attention
from edge.model.float_store import FloatWeights
from export.gptq import gptq_base, gptq_refine
from plugins.contracts import group_size_for
from plugins.nesting import (
    NestedCodes,
    dequantize,
    nest_rtn,
    nest_top4of8,
    refine_codes,
)

METHODS = ("bitnest", "rtn", "top4of8")
REFINES = ("closed", "gptq")
TOP4OF8_GROUP = 64  # Precision on Demand's grid


@dataclass(frozen=True)
class QuantOptions:
    """How to nest the linears (see scripts/export.py for the command-line names)."""

    method: str = "bitnest"
    refine: str = "closed"
    group_size: int = 128
    act_order: bool = True
    damp: float = 0.01
    base_trust: float | None = 0.1   # measured default: see docs/quality.md
    quantize_head: bool = True       # the LM head nested like a linear (measured default: docs/quality.md)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}: use one of {', '.join(METHODS)}")
        if self.refine not in REFINES:
            raise ValueError(f"unknown refinement {self.refine!r}: use one of {', '.join(REFINES)}")
        if self.base_trust is not None and self.base_trust < 0:
            raise ValueError(f"--base-trust must be >= 0, got {self.base_trust}")
        if self.group_size < 2 or self.group_size & (self.group_size - 1):
            raise ValueError(f"group size must be a power of two >= 2, got {self.group_size}")

    def group_for(self, k: int) -> int:
        return group_size_for(k, TOP4OF8_GROUP if self.method == "top4of8" else self.group_size)


class InputsCaptured(Exception):
    """Raised by a HessianCapture once it holds the input of its `last` linear: the rest of the pass (that linear's
    product and the residual add) is never read, so it is not computed."""


class HessianCapture:
    """Accumulates H = sum x^T x per linear input; linears that read the same tensor share one H. With `last`, the
    capture ends the pass (InputsCaptured) after recording that linear's input."""

    def __init__(self, last: Optional[str] = None):
        self.h: dict[str, torch.Tensor] = {}
        self._last: tuple[Optional[torch.Tensor], Optional[str]] = (None, None)
        self.last = last

    def reset(self, last: Optional[str] = None) -> None:
        self.h, self._last, self.last = {}, (None, None), last

    def __call__(self, name: str, x: torch.Tensor) -> None:
        last_x, last_name = self._last
        if last_x is x:
            self.h[name] = self.h[last_name]          # q/k/v and gate/up read the same input
        else:
            xx = (x.T @ x).double()                    # [K, K], accumulated in float64 across samples
            if name in self.h:
                self.h[name] += xx
            else:
                self.h[name] = xx
            self._last = (x, name)
        if name == self.last:
            raise InputsCaptured


def _nest_one(w: torch.Tensor, opts: QuantOptions, h_draft=None, h_target=None) -> NestedCodes:
    g = opts.group_for(w.shape[1])
    if opts.method == "top4of8":
        return nest_top4of8(w, g)
    if opts.method == "rtn" or h_draft is None:
        return nest_rtn(w, g)
    q4, scale = gptq_base(w, h_draft, g, opts.act_order, opts.damp, opts.base_trust)
    if opts.refine == "gptq":
        qr = gptq_refine(w, h_target, q4, scale, g, opts.act_order, opts.damp)
    else:
        qr = refine_codes(w, q4, scale)
    return NestedCodes(q4, qr, scale)


def _run_block(dec: Decoder, layer: int, xs: torch.Tensor, cos, sin) -> torch.Tensor:
    return torch.stack([dec.block(layer, x, cos, sin, "target", causal_attention) for x in xs])


def _capture_block(dec: Decoder, capture: HessianCapture, layer: int, xs: torch.Tensor, cos, sin) -> dict:
    """The Hessians of block `layer`'s linears from the float block over the residual streams xs [S, T, H]: each
    sample's pass stops once the last linear's input is captured (the block's output is not needed: ~29% of the
    pass's products at Qwen2.5-0.5B's shapes, the same Hessians bit for bit)."""
    capture.reset(last=f"model.layers.{layer}.{BLOCK_LINEARS[-1]}")
    for x in xs:
        try:
            dec.block(layer, x, cos, sin, "target", causal_attention)
        except InputsCaptured:
            pass
    return capture.h


def nest_model(tensors: dict[str, torch.Tensor], cfg: ModelConfig, rotations: OnlineRotations, opts: QuantOptions,
               calib: Optional[torch.Tensor] = None,
               progress: Callable = lambda it, **kw: it) -> dict[str, NestedCodes]:
    """Nested codes for every block linear (and the head when asked) of float32 `tensors`.

    GPTQ (method bitnest) runs block by block: H for the base comes from the draft-quantized prefix;
    with refine=gptq, H for the refinement comes from a second stream through the target-quantized prefix.
    The head (`quantize_head`) is nested like a block linear, by GPTQ on the final norm's outputs of those
    streams (method bitnest with calibration), else by RTN (or top4of8)."""
    names = [f"model.layers.{i}.{s}" for i in range(cfg.num_layers) for s in BLOCK_LINEARS]
    codes: dict[str, NestedCodes] = {}
    head_h = {}
    if opts.method != "bitnest" or calib is None:
        for name in progress(names, desc=f"{opts.method} nesting", file=sys.stderr):
            codes[name] = _nest_one(tensors[name + ".weight"], opts)
    else:
        codes, head_h = _sequential_gptq(tensors, cfg, rotations, opts, calib, progress)
    if opts.quantize_head:
        head_w = tensors["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
        codes[HEAD] = _nest_one(head_w, opts, head_h.get("draft"), head_h.get("target"))
    return codes


def _head_inputs(dec: Decoder, xs: torch.Tensor) -> torch.Tensor:
    """The head's inputs [S*T, H] (final norm over the un-rotated stream) of residual streams xs [S, T, H]."""
    return torch.cat([dec.final_norm(x) for x in xs])


@torch.no_grad()
def _sequential_gptq(tensors, cfg, rotations, opts, calib, progress):
    """(codes of the block linears, {view: H of the head's input}) by GPTQ block by block."""
    capture = HessianCapture()
    float_store = FloatWeights(tensors, cfg.tie_word_embeddings, on_linear=capture)
    fdec = Decoder(cfg, float_store, rotations)
    streams = {"draft": None, "target": None} if opts.refine == "gptq" else {"draft": None}
    stores = {v: FloatWeights(dict(tensors), cfg.tie_word_embeddings) for v in streams}
    decs = {v: Decoder(cfg, stores[v], rotations) for v in streams}
    x0 = torch.stack([fdec.embed(ids) for ids in calib])                           # [S, T, H]
    streams = {v: x0.clone() for v in streams}
    cos, sin = fdec.rope(calib.shape[1])
    codes = {}
    for layer in progress(range(cfg.num_layers), desc="GPTQ layers", file=sys.stderr):
        block = [f"model.layers.{layer}.{s}" for s in BLOCK_LINEARS]
        hessians = {view: _capture_block(fdec, capture, layer, xs, cos, sin)          # float block, quantized prefix
                    for view, xs in streams.items()}
        for name in block:
            w = tensors[name + ".weight"]
            codes[name] = _nest_one(w, opts, hessians["draft"][name], hessians.get("target", {}).get(name))
            for view in streams:
                stores[view].t[name + ".weight"] = dequantize(codes[name], view)
        for view in streams:
            streams[view] = _run_block(decs[view], layer, streams[view], cos, sin)   # next layer's inputs
    head_h = {}
    if opts.quantize_head:
        for view, xs in streams.items():
            x = _head_inputs(fdec, xs)                                                # [S*T, H]
            head_h[view] = (x.T @ x).double()
    return codes, head_h
