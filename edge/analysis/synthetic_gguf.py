"""A llama.cpp GGUF of a real model's shapes with random Q8_0 weights: the default model's GGUF metadata and tokenizer
(SmolLM2's vocabulary, chat template and special tokens, copied field by field) with the shape fields changed, so
llama.cpp decodes the same prompts at the shapes of a model this machine does not hold (SmolLM2-360M, -1.7B: the
same tokenizer). Written once into the cache folder, tensor by tensor, with an atomic rename."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from edge.analysis.peers import _copy_field
from edge.errors import BitNestError
from edge.model.arch import ModelConfig

VERSION = 1                       # bump when the layout or the values written change (the cache name carries it)
Q8_BLOCK = 32                     # weights per Q8_0 block: a float16 scale, then 32 int8 codes (34 bytes)
SCALE = 2.0 ** -12                # every block's scale: weights within ±0.031 (std ~0.018), activations stay finite
SHAPE_FIELDS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "rope.freq_base", "rope.dimension_count", "vocab_size",
                "attention.layer_norm_rms_epsilon")
LAYER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> [rows, columns] (numpy order: output features first) of a Llama of `cfg`'s shapes."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    per = {"attn_norm": (h,), "attn_q": (cfg.num_heads * d, h), "attn_k": (cfg.num_kv_heads * d, h),
           "attn_v": (cfg.num_kv_heads * d, h), "attn_output": (h, cfg.num_heads * d), "ffn_norm": (h,),
           "ffn_gate": (i, h), "ffn_up": (i, h), "ffn_down": (h, i)}
    out = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        out.update({f"blk.{n}.{t}.weight": per[t] for t in LAYER})
    return out


def q8_0_blocks(rows: int, cols: int, gen: torch.Generator) -> np.ndarray:
    """Random Q8_0 data of a [rows, cols] weight as GGUF stores it: uint8 [rows, cols / 32 * 34], each block the
    float16 SCALE and 32 codes in [-127, 127], drawn in one call."""
    nb = cols // Q8_BLOCK
    codes = torch.randint(-127, 128, (rows, nb, Q8_BLOCK), dtype=torch.int8, generator=gen)   # [R, B, 32]
    scale = torch.full((rows, nb, 1), SCALE, dtype=torch.float16).view(torch.uint8)           # [R, B, 2]
    return torch.cat([scale, codes.view(torch.uint8)], dim=2).reshape(rows, nb * (Q8_BLOCK + 2)).numpy()


def _cache_name(cfg: ModelConfig, name: str, source: Path, seed: int) -> str:
    key = json.dumps([VERSION, cfg.to_dict(), source.name, source.stat().st_size, seed], sort_keys=True)
    return f"synthetic-{name}-Q8_0-{hashlib.sha256(key.encode()).hexdigest()[:12]}.gguf"


def synthetic_gguf_problem(cfg: ModelConfig, source: Path) -> str | None:
    """Why no GGUF of `cfg`'s shapes can borrow `source`'s tokenizer (one line), or None."""
    import gguf
    if cfg.family != "llama" or cfg.attention_bias:
        return f"a synthetic GGUF is written for Llama shapes only, not {cfg.family}"
    bad = [c for c in (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim) if c % Q8_BLOCK]
    if bad:
        return f"Q8_0 needs every row length to be a multiple of {Q8_BLOCK}, not {bad[0]}"
    reader = gguf.GGUFReader(str(source))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    if arch != "llama" or vocab != cfg.vocab_size:
        return f"{source.name} ({arch}, vocabulary {vocab}) cannot lend its tokenizer to a Llama of vocabulary " \
               f"{cfg.vocab_size}"
    return None


def synthetic_gguf(cfg: ModelConfig, name: str, source: Path, cache: Path, seed: int = 0) -> Path:
    """The GGUF of `cfg`'s shapes with `source`'s metadata and tokenizer (written once into `cache`, reused after)."""
    import gguf
    out = cache / _cache_name(cfg, name, source, seed)
    if out.is_file():
        return out
    problem = synthetic_gguf_problem(cfg, source)
    if problem:
        raise BitNestError(problem)
    reader = gguf.GGUFReader(str(source))
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        _write(gguf, reader, cfg, name, tmp, seed)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def _write(gguf, reader, cfg: ModelConfig, name: str, path: Path, seed: int) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    skip = {"general.architecture", "general.file_type", "general.name", "general.size_label"} | \
        {f"llama.{f}" for f in SHAPE_FIELDS}
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in skip:
            _copy_field(writer, field)
    writer.add_name(f"synthetic {name} (random Q8_0 weights)")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_rope_freq_base(float(cfg.rope_theta))
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    shapes = tensor_shapes(cfg)
    Q80 = gguf.GGMLQuantizationType.Q8_0
    for t, shape in shapes.items():
        if len(shape) == 1:
            writer.add_tensor_info(t, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            byte_shape = (shape[0], shape[1] // Q8_BLOCK * (Q8_BLOCK + 2))
            writer.add_tensor_info(t, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1], raw_dtype=Q80)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    gen = torch.Generator().manual_seed(seed)
    for t, shape in shapes.items():              # one tensor in memory at a time
        data = np.ones(shape, dtype=np.float32) if len(shape) == 1 else q8_0_blocks(shape[0], shape[1], gen)
        writer.write_tensor_data(data)
    writer.close()
