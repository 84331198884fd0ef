"""A model's tensors streamed one at a time as float32 under HF names (a GGUF file dequantized row block by row block,
or an HF safetensors folder read tensor by tensor), with its config and tokenizer files; no weights held in memory."""

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

import gguf
import numpy as np
import torch
from safetensors import safe_open

from edge.atomic import staged_folder
from edge.cache import cache_root
from edge.errors import BitNestError
from edge.model.arch import ATTN_LINEARS, BLOCK_NORMS, ModelConfig, config_from_hf
from edge.model.gguf_file import GGUFReader, transformers_reads_fast
from edge.model.hf_folder import TOKENIZER_FILES
from export.source_spec import is_gguf, resolve_spec

# GGUF tensor names -> HF names: the llama family's subset of gguf-py's tensor_mapping (what transformers' GGUF loader
# maps for LlamaForCausalLM / Qwen2ForCausalLM); other GGUF tensors (e.g. rope_freqs) are skipped, as it skips them
GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
GGUF_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
# GGUF `general.architecture` -> whether llama.cpp's converter interleaved the q/k rows of each head
# (convert_hf_to_gguf.py LlamaModel.permute, undone by transformers' LlamaTensorProcessor); qwen2's does not
GGUF_PERMUTES_QK = {"llama": True, "qwen2": False}
DISAGREE = "the file and its config disagree"
CHUNK_BYTES = 32 << 20   # float32 bytes of GGUF rows dequantized at a time into a whole tensor


def first_line(e: Exception) -> str:
    """The first line of an exception's message (its type where it has none), for one-line errors."""
    return str(e).splitlines()[0][:160] if str(e).strip() else type(e).__name__


def gguf_to_hf(name: str) -> Optional[str]:
    """The HF name of a GGUF tensor (`blk.3.ffn_down.weight` -> `model.layers.3.mlp.down_proj.weight`), None if
    unmapped."""
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name):
        return f"model.layers.{m[1]}.{GGUF_BLOCK[m[2]]}.{m[3]}" if m[2] in GGUF_BLOCK else None
    if m := re.fullmatch(r"(\w+)\.(weight|bias)", name):
        return f"{GGUF_TOP[m[1]]}.{m[2]}" if m[1] in GGUF_TOP else None
    return None


def unpermuted_rows(rows: range, heads: int, n: int) -> np.ndarray:
    """GGUF rows holding HF rows `rows` of a q/k projection of `n` rows in `heads` heads of 2d rows each. llama.cpp
    stored each head's two halves interleaved row by row: HF row h·2d + a·d + j is GGUF row h·2d + 2j + a (a ∈ {0, 1},
    j < d)."""
    d = n // heads // 2
    r = np.arange(rows.start, rows.stop)                                      # HF rows
    h, a, j = r // (2 * d), (r % (2 * d)) // d, r % d
    return h * 2 * d + 2 * j + a


def implied_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies with its HF shape: embedding, final norm, the head unless tied, each block's
    linears [N, K] and norms, and q/k/v biases where `attention_bias`."""
    h, lin = cfg.hidden_size, cfg.linear_shapes()
    out = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        for name, shape in lin.items():
            out[f"model.layers.{n}.{name}.weight"] = shape
            if cfg.attention_bias and name in ATTN_LINEARS[:3]:                # q, k, v
                out[f"model.layers.{n}.{name}.bias"] = shape[:1]
        for name in BLOCK_NORMS:
            out[f"model.layers.{n}.{name}.weight"] = (h,)
    return out


def check_shapes(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], where: Callable[[str], str]) -> None:
    """One-line error naming the first tensor that the config implies and the file lacks or holds at another shape, a
    bias of a linear at a shape other than [N], or a block past the config's layers."""
    implied = implied_shapes(cfg)
    for name, want in implied.items():
        if name not in shapes:
            raise BitNestError(f"{name} is missing from {where(name)}, the config implies {list(want)}: {DISAGREE}")
        if shapes[name] != want:
            raise BitNestError(f"{name} is {list(shapes[name])} in {where(name)}, the config implies {list(want)}: "
                               f"{DISAGREE}")
    lin = cfg.linear_shapes()
    for name, got in shapes.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.bias", name)
        if m and int(m[1]) < cfg.num_layers and m[2] in lin and got != lin[m[2]][:1]:
            raise BitNestError(f"{name} is {list(got)} in {where(name)}, the config implies {list(lin[m[2]][:1])}: "
                               f"{DISAGREE}")
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m and int(m[1]) >= cfg.num_layers:
            raise BitNestError(f"{name} is in {where(name)}, the config has {cfg.num_layers} layers: {DISAGREE}")


class TensorReader(Protocol):
    """What a StreamSource reads through: HF shapes by name, one tensor (or row block) at a time."""

    shapes: dict[str, tuple[int, ...]]

    def where(self, name: str) -> str: ...
    def read(self, name: str, rows: Optional[range]) -> torch.Tensor: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class GgufTensor:
    """Where one GGUF tensor's bytes lie and how to turn them into HF rows."""

    gguf_name: str
    qtype: int                   # gguf.GGMLQuantizationType
    shape: tuple[int, ...]       # HF order (GGUF lists dims innermost first)
    offset: int                  # absolute byte offset of its data in the file
    row_bytes: int               # bytes of one row of the last dim: quant blocks never straddle rows
    heads: int = 0               # q/k heads whose rows llama.cpp interleaved (0: stored in HF order)


class GgufReader:
    """A GGUF file's tensor table (read once through edge.model.gguf_file's GGUFReader, then released) and an open file that
    row blocks are read from by offset and dequantized by gguf-py, nothing else kept."""

    def __init__(self, path: Path, cfg: ModelConfig):
        self.path = path
        try:
            reader = GGUFReader(str(path))
        except Exception as e:  # gguf-py raises ValueError, struct and numpy errors for files it cannot parse
            raise BitNestError(f"cannot read GGUF file {path}: {first_line(e)}") from None
        arch_field = reader.fields.get("general.architecture")
        arch = arch_field.contents() if arch_field is not None else None
        if arch not in GGUF_PERMUTES_QK:
            raise BitNestError(f"{path} is a GGUF of architecture {arch!r}: supported are "
                               f"{', '.join(GGUF_PERMUTES_QK)}")
        if reader.byte_order != "I":
            raise BitNestError(f"{path} is a byte-swapped (big-endian) GGUF: convert it on a little-endian machine")
        heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads} if GGUF_PERMUTES_QK[arch] else {}
        size = path.stat().st_size
        self.tensors: dict[str, GgufTensor] = {}
        for t in reader.tensors:
            hf = gguf_to_hf(t.name)
            if hf is None:
                continue
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if int(t.data_offset) + int(t.n_bytes) > size:
                raise BitNestError(f"{path} is truncated: tensor {t.name} ends past the file's {size:,} bytes")
            self.tensors[hf] = GgufTensor(t.name, int(t.tensor_type), shape, int(t.data_offset),
                                          int(t.n_bytes) // math.prod(shape[:-1]), heads.get(t.name.split(".")[-2], 0))
        del reader                                                            # its memory map and metadata go with it
        self.shapes = {name: t.shape for name, t in self.tensors.items()}
        self.file = open(path, "rb", buffering=0)

    def where(self, name: str) -> str:
        t = self.tensors.get(name)
        return f"{self.path} (as {t.gguf_name})" if t else str(self.path)

    def _raw(self, t: GgufTensor, lo: int, hi: int) -> np.ndarray:
        """Data rows [lo, hi) of `t` in GGUF order, read by offset (no shared file position: threads may read at
        once): uint8 [hi - lo, row bytes]."""
        raw = np.empty((hi - lo, t.row_bytes), np.uint8)
        view, pos = memoryview(raw).cast("B"), 0
        while pos < raw.size:
            n = os.preadv(self.file.fileno(), [view[pos:]], t.offset + lo * t.row_bytes + pos)
            if not n:
                raise BitNestError(f"{self.path} ended inside tensor {t.gguf_name}: the file is truncated")
            pos += n
        return raw

    def _dequantize(self, t: GgufTensor, raw: np.ndarray) -> np.ndarray:
        """gguf-py's float32 values of whole rows of `t`: [rows, row bytes] -> [rows, K]."""
        qtype = gguf.GGMLQuantizationType(t.qtype)
        try:
            w = gguf.quants.dequantize(raw, qtype)
        except NotImplementedError:
            raise BitNestError(f"{t.gguf_name} in {self.path} is {qtype.name}, which gguf-py cannot "
                               "dequantize") from None
        return np.ascontiguousarray(w, dtype=np.float32)

    def read(self, name: str, rows: Optional[range]) -> torch.Tensor:
        t = self.tensors[name]
        if len(t.shape) != 2:                                                 # norms, biases: whole
            w = self._dequantize(t, self._raw(t, 0, math.prod(t.shape[:-1]))).reshape(t.shape)
            return torch.from_numpy(w[unpermuted_rows(range(t.shape[0]), t.heads, t.shape[0])] if t.heads else w)
        rows = range(t.shape[0]) if rows is None else rows
        out = np.empty((len(rows), t.shape[1]), np.float32)                   # [rows, K]
        step = max(1, CHUNK_BYTES // (4 * t.shape[1]))    # gguf-py's intermediates: a few times its output
        for a in range(0, len(rows), step):
            out[a:a + step] = self._rows(t, rows[a:a + step])
        return torch.from_numpy(out)

    def _rows(self, t: GgufTensor, rows: range) -> np.ndarray:
        """HF rows `rows` of a 2-D tensor, read and dequantized: float32 [len(rows), K]."""
        if not t.heads:
            return self._dequantize(t, self._raw(t, rows.start, rows.stop))
        src = unpermuted_rows(rows, t.heads, t.shape[0])                      # GGUF rows, within the heads of `rows`
        lo, hi = int(src.min()), int(src.max()) + 1
        return self._dequantize(t, self._raw(t, lo, hi)[src - lo])

    def close(self) -> None:
        self.file.close()


class SafetensorsReader:
    """An HF folder's safetensors files (one, several, or the shards its model.safetensors.index.json lists), each
    opened per read, one tensor or row block converted to float32 at a time."""

    def __init__(self, folder: Path):
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise BitNestError(f"{index} is not a safetensors index ({type(e).__name__}: {e})") from None
            files = [folder / f for f in sorted(set(weight_map.values()))]
        else:
            weight_map, files = None, sorted(folder.glob("*.safetensors"))
        if not files:
            raise BitNestError(f"{folder} has no *.safetensors weights: convert the model to safetensors first")
        self.folder, self.files, self.shapes = folder, {}, {}
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():
                        self.files[k], self.shapes[k] = f, tuple(h.get_slice(k).get_shape())
            except Exception as e:  # safetensors raises SafetensorError, OSError, ValueError for unreadable files
                raise BitNestError(f"cannot read {f}: {first_line(e)}") from None
        for k, f in (weight_map or {}).items():
            if k not in self.files:
                raise BitNestError(f"{index} lists {k} in {f}, which does not hold it: the folder is incomplete")

    def where(self, name: str) -> str:
        return str(self.files.get(name, self.folder))

    def read(self, name: str, rows: Optional[range]) -> torch.Tensor:
        with safe_open(str(self.files[name]), framework="pt") as h:
            t = h.get_tensor(name) if rows is None else h.get_slice(name)[rows.start:rows.stop]
        return t.float().contiguous()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class StreamSource:
    """A model's tensors read one at a time (float32, HF names), its config and tokenizer files, nothing held."""

    spec: str                    # what the user passed
    hf_config: dict              # HF config.json content
    config: ModelConfig
    folder: Path                 # config.json + tokenizer files (no weights for a GGUF source)
    reader: TensorReader = field(repr=False)

    def names(self) -> list[str]:
        """HF tensor names present (lm_head.weight absent for tied models)."""
        return list(self.reader.shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        """HF shape, e.g. [N, K] for a linear."""
        if name not in self.reader.shapes:
            raise KeyError(f"{name} is not a tensor of model {self.spec}")
        return self.reader.shapes[name]

    def get(self, name: str, rows: Optional[slice] = None) -> torch.Tensor:
        """The tensor as float32, or rows `rows` (step 1) of a 2-D one: only those rows are read and dequantized."""
        shape = self.shape(name)
        if rows is None:
            return self.reader.read(name, None)
        if len(shape) != 2:
            raise ValueError(f"{name} is {list(shape)}: row blocks are read from 2-D tensors only")
        start, stop, step = rows.indices(shape[0])
        if step != 1:
            raise ValueError(f"row block {rows} of {name}: only contiguous blocks (step 1) are read")
        return self.reader.read(name, range(start, max(start, stop)))

    def tokenizer_files(self) -> list[Path]:
        return [self.folder / f for f in TOKENIZER_FILES if (self.folder / f).is_file()]

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "StreamSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def gguf_meta_folder(path: Path) -> Path:
    """A cached folder with a GGUF file's config.json, generation_config.json and tokenizer files, written once from
    its metadata by transformers (which reads no weights for them), atomically (temp folder + rename)."""
    dest = cache_root() / f"{path.stem}-{path.stat().st_size}-meta"
    if (dest / "config.json").is_file():
        return dest
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    with staged_folder(dest, lambda d: (d / "config.json").is_file()) as tmp:
        try:
            with transformers_reads_fast():
                cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
                tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        except Exception as e:  # transformers raises many types for unreadable GGUF files
            raise BitNestError(f"cannot read GGUF file {path}: {first_line(e)}") from None
        # the fields save_pretrained of the dequantized model adds (export.sources.gguf_cache_folder writes the same)
        if cfg.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            cfg.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg.model_type]]
        cfg.dtype = torch.float32
        cfg.save_pretrained(tmp)
        GenerationConfig.from_model_config(cfg).save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return dest


def read_config(folder: Path) -> tuple[dict, ModelConfig]:
    """config.json of a folder as a dict and as the typed config; a missing or broken file is a one-line error."""
    path = folder / "config.json"
    if not path.is_file():
        raise BitNestError(f"{folder} has no config.json: pass an HF model folder, a .gguf file or `default`")
    try:
        hf = json.loads(path.read_text())
    except ValueError as e:
        raise BitNestError(f"{path} is not valid JSON ({e})") from None
    return hf, config_from_hf(hf)


def open_gguf(path: Path, spec: str) -> StreamSource:
    """Stream a GGUF file: config and tokenizer from its metadata (cached folder), tensors dequantized on demand."""
    folder = gguf_meta_folder(path)
    hf, cfg = read_config(folder)
    return _checked(StreamSource(spec, hf, cfg, folder, GgufReader(path, cfg)))


def open_hf_folder(folder: Path, spec: str) -> StreamSource:
    """Stream an HF folder (config.json + *.safetensors, possibly sharded)."""
    folder = Path(folder)
    hf, cfg = read_config(folder)
    return _checked(StreamSource(spec, hf, cfg, folder, SafetensorsReader(folder)))


def _checked(src: StreamSource) -> StreamSource:
    """The source with a tied head's copy dropped, once its tensors agree with its config (else closed, one line)."""
    if src.config.tie_word_embeddings:
        src.reader.shapes.pop("lm_head.weight", None)
    try:
        check_shapes(src.config, src.reader.shapes, src.reader.where)
    except BitNestError:
        src.close()
        raise
    return src


def open_source(spec: str) -> StreamSource:
    """`default`, a packaged preset (edge.model.packaged.PACKAGED_MODELS), a .gguf path or an HF folder, streamed."""
    path = resolve_spec(spec)
    return open_gguf(path, spec) if is_gguf(path) else open_hf_folder(path, spec)
