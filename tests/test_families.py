"""The Qwen2 family (attention biases, untied head) through the HF-folder source, decoder and rotations,
on a small randomly initialised transformers Qwen2ForCausalLM saved as a real HF folder."""

import pytest
import torch

from edge.model.checkpoint import load_checkpoint
from edge.model.decoder import Decoder, OnlineRotations
from edge.model.float_store import FloatWeights
from export.pipeline import ExportOptions, run_export
from export.quantize import QuantOptions
from export.rotation.plan import RotationPlan, rotate
from export.sources import load_source
from tests.conftest import save_small_hf_model


@pytest.fixture(scope="module")
def qwen2_folder(tmp_path_factory, default_model):
    """Random weights, SmolLM2's tokenizer (so calibration text tokenizes into its vocabulary)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(1234)
    cfg = Qwen2Config(vocab_size=default_model.config.vocab_size, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                      rope_theta=10000.0, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random biases so the bias paths matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return save_small_hf_model(tmp_path_factory.mktemp("qwen2"), model, default_model), model


def test_qwen2_decoder_matches_transformers(qwen2_folder, gen):
    folder, hf = qwen2_folder
    src = load_source(str(folder))
    assert src.config.family == "qwen2" and src.config.attention_bias and not src.config.tie_word_embeddings
    ids = torch.randint(0, 49152, (20,), generator=gen)
    with torch.no_grad():
        want = hf(ids.unsqueeze(0)).logits[0]
    got = Decoder(src.config, FloatWeights(src.tensors, False)).forward(ids, "target")
    assert ((got - want).norm() / want.norm()).item() < 1e-5


def test_qwen2_rotation_with_biases_preserves_logits(qwen2_folder, gen):
    src = load_source(str(qwen2_folder[0]))
    cfg = src.config
    ids = torch.randint(0, 49152, (20,), generator=gen)
    want = Decoder(cfg, FloatWeights({k: v.double() for k, v in src.tensors.items()}, False, torch.float64)).forward(ids, "t")
    t, rec, extra = rotate(src.tensors, cfg, RotationPlan("r1r2", seed=5))   # 96 = 12*8 Hadamard, D = 16
    got = Decoder(cfg, FloatWeights(t, False, torch.float64),
                  OnlineRotations(r1=extra["rotation.r1"].double())).forward(ids, "t")
    assert ((got - want).norm() / want.norm()).item() < 1e-6


def test_qwen2_exports_and_loads(qwen2_folder, tmp_path):
    out = tmp_path / "q"
    summary = run_export(ExportOptions(out=str(out), model=str(qwen2_folder[0]), rotation="r1r2r4",
                                       calib_samples=2, calib_seq_len=32, quant=QuantOptions("bitnest", "gptq")))
    ck = load_checkpoint(out)
    assert ck.config.family == "qwen2" and ck.rotations.r1 is not None and ck.rotations.r4_size == 192
    assert "model.layers.0.self_attn.q_proj.bias" in ck.tensors
    # the default nested head; the embedding of this untied model stays float16 (rows are not the head's)
    assert ck.head_nested and "lm_head.weight" not in ck.tensors and not ck.embedding_from_head
    assert ck.tensors["model.embed_tokens.weight"].dtype == torch.float16
    # K = 96 has no group of 128 or 64: the largest power of two dividing it (32) is used (docs/contracts.md, weights)
    assert ck.linears["model.layers.0.self_attn.q_proj"].group_size == 32
    n = {k: v.shape[0] * v.shape[1] for k, v in ck.linears.items()}
    expected = sum((8 + 16 / ck.linears[k].group_size) * c for k, c in n.items()) / sum(n.values())
    assert summary["bits_per_weight"]["linear"] == pytest.approx(expected)
