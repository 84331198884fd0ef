"""A llama.cpp GGUF of a real model's shapes with random Q8_0 weights, so llama.cpp decodes at the shapes of a model
this machine does not hold: `general.architecture` "llama" or "qwen2" (q/k/v biases, a head apart from the embedding
when untied) by the config's family. The vocabulary is the donor GGUF's (the default model's: SmolLM2's tokenizer,
chat template and special tokens) when the sizes match; padded with unused filler tokens when the model's is larger
(Qwen2.5's 151,936, Llama 3's 128,256: prompts tokenize as the default model's, as this runtime's own runner at those
shapes is fed); a synthetic SentencePiece one (byte fallback, "tok{i}" fillers) when it is smaller. Either way the
embedding and the head have the real model's rows, so llama.cpp's cost is the real model's. Written once into the
cache folder, tensor by tensor, with an atomic rename."""

import functools
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from edge.errors import BitNestError
from edge.model.arch import ModelConfig

VERSION = 2                       # bump when the layout or the values written change (the cache name carries it)
Q8_BLOCK = 32                     # weights per Q8_0 block: a float16 scale, then 32 int8 codes (34 bytes)
SCALE = 2.0 ** -12                # every block's scale: weights within ±0.031 (std ~0.018), activations stay finite
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2"}      # ModelConfig.family -> llama.cpp's general.architecture
LAYER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
BIASED = ("attn_q", "attn_k", "attn_v")               # the projections with a bias when cfg.attention_bias
SPECIAL = ("<unk>", "<s>", "</s>")                    # ids 0, 1, 2 of a synthetic vocabulary: unknown, BOS, EOS
BYTES = tuple(f"<0x{b:02X}>" for b in range(256))     # its byte-fallback tokens, ids 3..258
FILLER = "<|synthetic_{}|>"                           # a padded vocabulary's unused tokens past the donor's
VOCAB_WORDS = {"donor": "the donor's vocabulary", "padded": "the donor's vocabulary padded with unused tokens",
               "synthetic": "a synthetic vocabulary"}      # vocabulary_kind -> the words general.name carries


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> [rows, columns] (numpy order: output features first) of a decoder of `cfg`'s shapes."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    per = {"attn_norm": (h,), "attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
           "ffn_norm": (h,), "ffn_gate": (i, h), "ffn_up": (i, h), "ffn_down": (h, i)}
    out = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        for t in LAYER:
            out[f"blk.{n}.{t}.weight"] = per[t]
            if cfg.attention_bias and t in BIASED:
                out[f"blk.{n}.{t}.bias"] = per[t][:1]
    return out


def q8_0_row_bytes(cols: int) -> int:
    """Bytes of one Q8_0 row of `cols` weights: 34 per block of 32."""
    return cols // Q8_BLOCK * (Q8_BLOCK + 2)


def stored_bytes(shape: tuple[int, ...]) -> int:
    """Bytes a tensor of `shape` takes in this GGUF: a matrix in Q8_0 rows, a norm or bias at 4 bytes a value."""
    return shape[0] * q8_0_row_bytes(shape[1]) if len(shape) == 2 else 4 * shape[0]


def q8_0_bytes_per_token(cfg: ModelConfig) -> int:
    """The bytes one llama.cpp decode step of a token reads from this GGUF: every tensor but the token embedding (one
    row of it; read whole as the head when the head is tied): what a pass at the memory roofline streams, beside
    this runtime's target bytes."""
    return sum(stored_bytes(shape) for name, shape in tensor_shapes(cfg).items()
               if name != "token_embd.weight" or cfg.tie_word_embeddings)


def q8_0_blocks(rows: int, cols: int, gen: torch.Generator) -> np.ndarray:
    """Random Q8_0 data of a [rows, cols] weight as GGUF stores it: uint8 [rows, cols / 32 * 34], each block the
    float16 SCALE and 32 codes in [-127, 127], drawn in one call."""
    nb = cols // Q8_BLOCK
    codes = torch.randint(-127, 128, (rows, nb, Q8_BLOCK), dtype=torch.int8, generator=gen)   # [R, B, 32]
    scale = torch.full((rows, nb, 1), SCALE, dtype=torch.float16).view(torch.uint8)           # [R, B, 2]
    return torch.cat([scale, codes.view(torch.uint8)], dim=2).reshape(rows, q8_0_row_bytes(cols)).numpy()


def _cache_name(cfg: ModelConfig, name: str, source: Path, seed: int) -> str:
    key = json.dumps([VERSION, cfg.to_dict(), source.name, source.stat().st_size, seed], sort_keys=True)
    return f"synthetic-{name}-Q8_0-{hashlib.sha256(key.encode()).hexdigest()[:12]}.gguf"


def vocabulary_kind(vocab: int, donor: int) -> str:
    """How a model of `vocab` tokens gets a tokenizer from a donor of `donor`: "donor" (the same size: copied),
    "padded" (larger: the donor's, then unused fillers) or "synthetic" (smaller: SentencePiece, byte fallback)."""
    return "donor" if vocab == donor else "padded" if vocab > donor else "synthetic"


def donor_tokenizer(source: Path) -> dict[str, tuple]:
    """`source`'s tokenizer fields: key -> (GGUFValueType, value as a Python value or list), read once a process
    (parsing a GGUF's vocabulary takes seconds)."""
    st = source.stat()
    return _donor_tokenizer(str(source), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _donor_tokenizer(source: str, size: int, mtime_ns: int) -> dict[str, tuple]:
    from edge.model.gguf_file import GGUFReader
    fields = GGUFReader(source).fields.values()
    return {f.name: (f.types[0], f.contents()) for f in fields if f.name.startswith("tokenizer.")}


def synthetic_gguf_problem(cfg: ModelConfig, source: Path) -> str | None:
    """Why no llama.cpp GGUF of `cfg`'s shapes can be written with `source` as the tokenizer donor (one line), or
    None."""
    if cfg.family not in GGUF_ARCH:
        return f"a synthetic GGUF is written for {' and '.join(GGUF_ARCH)} shapes, not {cfg.family}"
    bad = [c for c in (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim) if c % Q8_BLOCK]
    if bad:
        return f"Q8_0 needs every row length to be a multiple of {Q8_BLOCK}, not {bad[0]}"
    if cfg.family == "qwen2" and cfg.num_heads * cfg.head_dim != cfg.hidden_size:
        return f"llama.cpp's qwen2 needs heads x head_dim = hidden ({cfg.num_heads} x {cfg.head_dim} is not " \
               f"{cfg.hidden_size})"
    small = len(SPECIAL) + len(BYTES)
    if cfg.vocab_size < small and \
            vocabulary_kind(cfg.vocab_size, len(donor_tokenizer(source)["tokenizer.ggml.tokens"][1])) == "synthetic":
        return f"a synthetic vocabulary needs at least {small} tokens, not {cfg.vocab_size}"
    return None


def synthetic_gguf(cfg: ModelConfig, name: str, source: Path, cache: Path, seed: int = 0) -> Path:
    """The GGUF of `cfg`'s shapes with a vocabulary from `source` (vocabulary_kind; written once into `cache`, reused
    after)."""
    import gguf
    out = cache / _cache_name(cfg, name, source, seed)
    if out.is_file():
        return out
    problem = synthetic_gguf_problem(cfg, source)
    if problem:
        raise BitNestError(problem)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        _write(gguf, donor_tokenizer(source), cfg, name, tmp, seed)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def _borrowed_vocabulary(gguf, writer, tokenizer: dict[str, tuple], vocab: int) -> None:
    """The donor's tokenizer fields, its token list padded to `vocab` with unused fillers (none when the sizes
    match): token ids the donor's tokenizer never produces, which detokenize to nothing."""
    donor = len(tokenizer["tokenizer.ggml.tokens"][1])
    pad = {"tokenizer.ggml.tokens": [FILLER.format(i) for i in range(donor, vocab)],
           "tokenizer.ggml.token_type": [int(gguf.TokenType.UNUSED)] * (vocab - donor),
           "tokenizer.ggml.scores": [0.0] * (vocab - donor)}
    for key, (vtype, value) in tokenizer.items():
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value + pad.get(key, []))
        else:
            writer.add_key_value(key, value, vtype)


def _synthetic_vocabulary(gguf, writer, vocab: int) -> None:
    """A SentencePiece vocabulary llama.cpp tokenizes any text with: SPECIAL, the 256 byte tokens, "tok{i}" fillers;
    scores all 0."""
    tokens = [*SPECIAL, *BYTES, *(f"tok{i}" for i in range(len(SPECIAL) + len(BYTES), vocab))]
    T = gguf.TokenType
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * len(BYTES) + [T.NORMAL] * (vocab - len(SPECIAL) - len(BYTES))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    writer.add_token_scores([0.0] * vocab)
    writer.add_unk_token_id(SPECIAL.index("<unk>"))
    writer.add_bos_token_id(SPECIAL.index("<s>"))
    writer.add_eos_token_id(SPECIAL.index("</s>"))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def _write(gguf, tokenizer: dict[str, tuple], cfg: ModelConfig, name: str, path: Path, seed: int) -> None:
    kind = vocabulary_kind(cfg.vocab_size, len(tokenizer["tokenizer.ggml.tokens"][1]))
    writer = gguf.GGUFWriter(str(path), GGUF_ARCH[cfg.family])
    writer.add_name(f"synthetic {name} (random Q8_0 weights, {VOCAB_WORDS[kind]})")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(float(cfg.rope_theta))
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if kind == "synthetic":
        _synthetic_vocabulary(gguf, writer, cfg.vocab_size)
    else:
        _borrowed_vocabulary(gguf, writer, tokenizer, cfg.vocab_size)
    shapes = tensor_shapes(cfg)
    Q80 = gguf.GGMLQuantizationType.Q8_0
    for t, shape in shapes.items():
        if len(shape) == 1:
            writer.add_tensor_info(t, shape, np.dtype(np.float32), stored_bytes(shape))
        else:
            byte_shape = (shape[0], q8_0_row_bytes(shape[1]))
            writer.add_tensor_info(t, byte_shape, np.dtype(np.uint8), stored_bytes(shape), raw_dtype=Q80)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    gen = torch.Generator().manual_seed(seed)
    for t, shape in shapes.items():              # one tensor in memory at a time; norms 1, biases 0
        if len(shape) == 2:
            data = q8_0_blocks(shape[0], shape[1], gen)
        else:
            data = np.full(shape, 0.0 if t.endswith(".bias") else 1.0, dtype=np.float32)
        writer.write_tensor_data(data)
    writer.close()
