"""Architecture registry: HF architecture names -> the decoder family and its typed model config."""

from dataclasses import asdict, dataclass, fields
from typing import Any

from edge.errors import BitNestError

# Linear layers of one decoder block, in the order a forward pass reads them.
ATTN_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP_LINEARS = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
BLOCK_LINEARS = ATTN_LINEARS + MLP_LINEARS
BLOCK_NORMS = ("input_layernorm", "post_attention_layernorm")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Llama-family decoder (Llama, Qwen2, ...)."""

    architecture: str
    family: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "vocab_size", "max_position_embeddings"):
            v = getattr(self, name)
            if not is_int(v) or v <= 0:
                raise BitNestError(f"model config field {name} must be a positive integer, got {v!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < float("inf"):
                raise BitNestError(f"model config field {name} must be a positive number, got {v!r}")
        for name in ("tie_word_embeddings", "attention_bias"):
            if not isinstance(getattr(self, name), bool):
                raise BitNestError(f"model config field {name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.architecture, str) or not isinstance(self.family, str):
            raise BitNestError("model config fields architecture and family must be strings")
        if not (self.bos_token_id is None or is_int(self.bos_token_id)) or \
                not all(is_int(t) and t >= 0 for t in self.eos_token_ids):
            raise BitNestError("model config token ids must be non-negative integers")
        if self.num_heads % self.num_kv_heads:
            raise BitNestError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        names = {f.name for f in fields(cls)}
        missing = names - set(d) - {"bos_token_id", "eos_token_ids"}
        if missing:
            raise BitNestError(f"model config lacks {', '.join(sorted(missing))}")
        kw = {k: v for k, v in d.items() if k in names}
        eos = kw.get("eos_token_ids", ())
        if not isinstance(eos, (list, tuple)):
            raise BitNestError(f"model config eos_token_ids must be a list, got {eos!r}")
        kw["eos_token_ids"] = tuple(eos)
        return cls(**kw)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """[N, K] of each block linear by its short name."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        return {
            "self_attn.q_proj": (self.num_heads * d, h),
            "self_attn.k_proj": (self.num_kv_heads * d, h),
            "self_attn.v_proj": (self.num_kv_heads * d, h),
            "self_attn.o_proj": (h, self.num_heads * d),
            "mlp.gate_proj": (i, h),
            "mlp.up_proj": (i, h),
            "mlp.down_proj": (h, i),
        }


@dataclass(frozen=True)
class Family:
    """What distinguishes one decoder family from plain Llama."""

    name: str
    attention_bias: bool


FAMILIES = {"llama": Family("llama", attention_bias=False), "qwen2": Family("qwen2", attention_bias=True)}

# HF `architectures[0]` -> family (llama.cpp-style name table).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Typed config from an HF `config.json` dict; unknown architectures get a one-line error."""
    archs = hf.get("architectures") or []
    arch = archs[0] if archs else {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(hf.get("model_type"), "")
    if arch not in ARCHITECTURES:
        raise BitNestError(
            f"unknown architecture {arch or hf.get('model_type')!r}: supported are {', '.join(sorted(ARCHITECTURES))}"
        )
    family = FAMILIES[ARCHITECTURES[arch]]
    heads = hf["num_attention_heads"]
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise BitNestError(f"RoPE type {rope_type!r} is not supported yet: use a model with plain RoPE")
    eos = hf.get("eos_token_id")
    return ModelConfig(
        architecture=arch,
        family=family.name,
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        vocab_size=hf["vocab_size"],
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", family.attention_bias)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=tuple(eos if isinstance(eos, list) else ([eos] if eos is not None else [])),
    )
