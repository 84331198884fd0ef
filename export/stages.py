"""The stages of a streamed export, each reading what it needs from the source and committing its shard to the work
folder: the embedding (and the calibration streams' first inputs), one decoder block, the head (in blocks of rows)."""

import torch

from edge.model.checkpoint import EMBED, HEAD
from edge.model.decoder import Decoder, OnlineRotations
from edge.model.float_store import FloatWeights
from export.quantize import LayerNester, nest_rows
from export.rotation.plan import RotationPlan, rotate_block
from export.shard_writer import ShardWriter
from export.workdir import WorkFolder
from plugins.packing import pack_nibbles

EMBED_SHARD = "embed.safetensors"
HEAD_SHARD = "head.safetensors"
FINAL_NORM = "model.norm.weight"


def block_shard(layer: int) -> str:
    return f"layer-{layer:03d}.safetensors"


def _row_blocks(n: int, rows: int):
    for a in range(0, n, rows):
        yield slice(a, min(a + rows, n))


def nested_entries(name: str, n: int, k: int, group: int, offset: bool) -> dict:
    """Shard entries of one nested linear (docs/contracts.md, weights): planes uint8 [N, K/2], scales float16."""
    out = {name + ".base": (torch.uint8, (n, k // 2)), name + ".refine": (torch.uint8, (n, k // 2)),
           name + ".scale": (torch.float16, (n, k // group))}
    if offset:
        out[name + ".offset"] = (torch.float16, (n, k // group))
    return out


def nested_tensors(name: str, c) -> dict[str, torch.Tensor]:
    """The stored tensors of one linear's codes (NestedCodes)."""
    out = {name + ".base": pack_nibbles(c.q4), name + ".refine": pack_nibbles(c.qr),
           name + ".scale": c.scale.to(torch.float16).contiguous()}
    if c.offset is not None:
        out[name + ".offset"] = c.offset.to(torch.float16).contiguous()
    return out


def embed_stage(src, wd: WorkFolder, nester: LayerNester, rotations: OnlineRotations, extra: dict,
                store_embedding: bool, calib, rows: int) -> None:
    """Stage `embed`: the float16 embedding where it is stored (in blocks of rows), the final norm and R1; the
    streams' first inputs, the rotated embeddings of the calibration windows `calib` [S, T] (GPTQ)."""
    cfg = src.config
    entries = {FINAL_NORM: (torch.float16, (cfg.hidden_size,))}
    entries.update({k: (torch.float32, tuple(v.shape)) for k, v in extra.items()})
    if store_embedding:
        entries[EMBED] = (torch.float16, (cfg.vocab_size, cfg.hidden_size))
    wanted = torch.unique(calib) if calib is not None else torch.empty(0, dtype=torch.long)    # [U]
    gathered = torch.zeros(len(wanted), cfg.hidden_size)                                     # [U, H]
    with ShardWriter(wd.path / EMBED_SHARD, entries) as w:
        w.write(FINAL_NORM, src.get(FINAL_NORM).to(torch.float16))
        for k, v in extra.items():
            w.write(k, v.float())
        if store_embedding or len(wanted):
            for rs in _row_blocks(cfg.vocab_size, rows):
                hit = (wanted >= rs.start) & (wanted < rs.stop)
                if not store_embedding and not bool(hit.any()):
                    continue
                block = src.get(EMBED, rs)                                                   # [rows, H]
                gathered[hit] = block[wanted[hit] - rs.start]
                if store_embedding:
                    w.write(EMBED, block.to(torch.float16))
        digest = w.close()
    streams = None
    if calib is not None:
        dec = Decoder(cfg, FloatWeights({EMBED: gathered}, cfg.tie_word_embeddings), rotations)
        index = torch.searchsorted(wanted, calib)                                             # [S, T]
        nester.start(torch.stack([dec.embed(ids) for ids in index]))                          # [S, T, H]
        streams = nester.streams
    wd.commit("embed", {}, streams, written={EMBED_SHARD: digest})


def block_stage(src, wd: WorkFolder, nester: LayerNester, plan: RotationPlan, r1, r2, layer: int) -> None:
    """Stage `layer-NNN`: block `layer` read, rotated, nested and committed with the streams after it."""
    prefix = f"model.layers.{layer}."
    tensors = {n: src.get(n) for n in src.names() if n.startswith(prefix)}
    rotated = rotate_block(tensors, src.config, plan, r1, r2, layer)
    del tensors
    codes = nester.nest(layer, rotated)
    out = {}
    for name, c in codes.items():
        out.update(nested_tensors(name, c))
    for name, t in rotated.items():
        if name[:-len(".weight")] not in codes:
            out[name] = t.to(torch.float16)                     # norms and biases
    stage = f"layer-{layer:03d}"
    wd.commit(stage, {block_shard(layer): out}, nester.streams if nester.sequential else None)


def head_stage(src, wd: WorkFolder, nester: LayerNester, nested: bool, rows: int) -> None:
    """Stage `head`: the nested head (GPTQ under the final streams' Hessians, or RTN), or an untied float16 head, in
    blocks of rows; nothing for a tied float16 head (the embedding serves both)."""
    cfg = src.config
    source = EMBED if cfg.tie_word_embeddings else "lm_head.weight"
    v, h = cfg.vocab_size, cfg.hidden_size
    if not nested and cfg.tie_word_embeddings:
        wd.commit("head", {})
        return
    if not nested:
        with ShardWriter(wd.path / HEAD_SHARD, {source: (torch.float16, (v, h))}) as w:
            for rs in _row_blocks(v, rows):
                w.write(source, src.get(source, rs).to(torch.float16))
            wd.commit("head", {}, written={HEAD_SHARD: w.close()})
        return
    opts = nester.opts
    hessians = nester.head_hessians(src.get(FINAL_NORM)) if nester.sequential else None
    group = opts.group_for(h)
    entries = nested_entries(HEAD, v, h, group, opts.method == "top4of8")
    with ShardWriter(wd.path / HEAD_SHARD, entries) as w:
        blocks = (src.get(source, rs) if nester.device is None else src.get(source, rs).to(nester.device)
                  for rs in _row_blocks(v, rows))
        for c in nest_rows(blocks, opts, hessians):
            for name, t in nested_tensors(HEAD, c).items():
                w.write(name, t)
        wd.commit("head", {}, written={HEAD_SHARD: w.close()})
