"""Nesting a rotated float model one block at a time: RTN, top-4-of-8, or sequential GPTQ (inputs from the
already-quantized prefix) for the W4 base, then the fixed-base refinement (closed form or GPTQ); the head in blocks of
rows."""

from dataclasses import dataclass
from typing import Optional

import torch

from edge.model.arch import BLOCK_LINEARS, ModelConfig
from edge.model.decoder import Decoder, OnlineRotations, causal_attention
from edge.model.float_store import FloatWeights
from export.gptq import gptq_base, gptq_refine, prepare_gptq
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
            if name in self.h:                         # [K, K], accumulated in float32 across samples
                self.h[name].addmm_(x.T, x)
            else:
                self.h[name] = x.T @ x
            self._last = (x, name)
        if name == self.last:
            raise InputsCaptured


def _nest_one(w: torch.Tensor, opts: QuantOptions, h_draft=None, h_target=None) -> NestedCodes:
    """One weight [N, K] nested under its Hessians (H or PreparedHessian per view; None: RTN)."""
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


def nest_rows(w_rows, opts: QuantOptions, hessians: Optional[dict] = None):
    """Nested codes of one weight read in blocks of rows (`w_rows`: an iterable of [n, K] float blocks), one block
    at a time: every row of a GPTQ weight is quantized under the same H, so blocks are independent (the head:
    151,936 x 1,536 floats is 0.93 GB whole). `hessians`: {view: H [K, K]} (None: RTN). Yields NestedCodes per block."""
    prepared = None
    if opts.method == "bitnest" and hessians:
        prepared = {v: prepare_gptq(h, opts.damp, opts.act_order) for v, h in hessians.items()}
        hessians.clear()                                                # consumed: one copy, not two
    for w in w_rows:
        yield _nest_one(w, opts, *((prepared["draft"], prepared.get("target")) if prepared else ()))


class LayerNester:
    """Nests a model one decoder block at a time (method bitnest: sequential GPTQ; H of a block's linears from the
    float block over the calibration streams, the streams then carried through the quantized block, in place); the
    only state between blocks is `streams` ({view: [S, T, H] float32}: `draft`, and `target` with refine gptq)."""

    def __init__(self, cfg: ModelConfig, rotations: OnlineRotations, opts: QuantOptions,
                 device: Optional[torch.device] = None):
        self.cfg, self.rot, self.opts = cfg, rotations, opts
        self.device = device
        self.views = ("draft", "target") if opts.refine == "gptq" else ("draft",)
        self.streams: dict[str, torch.Tensor] = {}

    @property
    def sequential(self) -> bool:
        return self.opts.method == "bitnest"

    def start(self, x0: torch.Tensor) -> None:
        """The streams at the first block: the (rotated) embeddings x0 [S, T, H] of the calibration windows."""
        self.streams = {v: x0.clone() for v in self.views}

    def _store(self, tensors, on_linear=None) -> FloatWeights:
        store = FloatWeights(tensors, self.cfg.tie_word_embeddings, on_linear=on_linear)
        store.device = self.device
        return store

    @torch.no_grad()
    def nest(self, layer: int, tensors: dict[str, torch.Tensor]) -> dict[str, NestedCodes]:
        """Nested codes of block `layer`'s linears from its float32 (rotated) tensors (HF names, this block only);
        advances the streams past the block (method bitnest)."""
        names = [f"model.layers.{layer}.{s}" for s in BLOCK_LINEARS]
        if not self.sequential:
            return {n: _nest_one(tensors[n + ".weight"], self.opts) for n in names}
        on = {k: v.to(self.device) for k, v in tensors.items()} if self.device is not None else tensors
        capture = HessianCapture()
        fdec = Decoder(self.cfg, self._store(on, capture), self.rot)
        t = next(iter(self.streams.values())).shape[1]
        cos, sin = fdec.rope(t)
        hessians = {v: _capture_block(fdec, capture, layer, self.streams[v], cos, sin, self.device)
                    for v in self.views}                                   # float block over the quantized prefix
        prepared: dict = {}
        codes, quantized = {}, {v: dict(on) for v in self.views}
        for name in names:
            hs = []
            for v in self.views:                                            # q/k/v and gate/up share one H
                h = hessians[v][name]
                if id(h) not in prepared:
                    prepared[id(h)] = prepare_gptq(h, self.opts.damp, self.opts.act_order)
                hs.append(prepared[id(h)])
            c = _nest_one(on[name + ".weight"], self.opts, *hs)
            codes[name] = NestedCodes(*(None if x is None else x.cpu() for x in (c.q4, c.qr, c.scale, c.offset)))
            for v in self.views:
                quantized[v][name + ".weight"] = dequantize(c, v)
        del hessians, prepared
        for v in self.views:                                               # next block's inputs, sample by sample
            dec = Decoder(self.cfg, self._store(quantized[v]), self.rot)
            xs = self.streams[v]
            for s in range(xs.shape[0]):
                x = xs[s].to(self.device) if self.device is not None else xs[s]
                xs[s] = dec.block(layer, x, cos, sin, "target", causal_attention).to(xs.device)
        return codes

    @torch.no_grad()
    def head_hessians(self, final_norm: torch.Tensor) -> dict[str, torch.Tensor]:
        """{view: H [H, H]} of the head's input (the final norm, weight `final_norm`, over each stream after the last
        block, R1 undone)."""
        dec = Decoder(self.cfg, self._store({"model.norm.weight": final_norm}), self.rot)
        out = {}
        for v, xs in self.streams.items():
            h = None
            for x in xs:
                y = dec.final_norm(x.to(self.device) if self.device is not None else x)    # [T, H]
                h = y.T @ y if h is None else h.add_(y.T @ y)
            out[v] = h
        return out


def _capture_block(dec: Decoder, capture: HessianCapture, layer: int, xs: torch.Tensor, cos, sin, device) -> dict:
    """The Hessians of block `layer`'s linears from the float block over the residual streams xs [S, T, H]: each
    sample's pass stops once the last linear's input is captured (the block's output is not needed: ~29% of the
    pass's products at Qwen2.5-0.5B's shapes, the same Hessians bit for bit)."""
    capture.reset(last=f"model.layers.{layer}.{BLOCK_LINEARS[-1]}")
    for x in xs:
        try:
            dec.block(layer, x.to(device) if device is not None else x, cos, sin, "target", causal_attention)
        except InputsCaptured:
            pass
    return capture.h
