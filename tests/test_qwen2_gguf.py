"""The qwen2 preset's path on a small Qwen2 GGUF written here by gguf-py (the real 491 MB file is never downloaded in
CI): its metadata fields mapped to the model config, its Q5_0 / Q8_0 / Q4_K / Q6_K blocks dequantized to the values
gguf-py reads, its q/k/v biases kept, a separate `output.weight` read as an untied head; then a two-layer export of it
through the native step against the torch reference, biases included."""

import numpy as np
import pytest
import torch

from edge.backends.native import native_unavailable
from export.pipeline import ExportOptions, run_export
from export.quantize import QuantOptions
from export.sources import default_gguf, open_source
from edge.backends.torch_ref import TorchBackend
from edge.engine.interface import PassEngine
from edge.model.gguf_file import GGUFReader  # gguf-py's reader, parsed faster (tests/test_gguf_file.py)
from tests.reference_pairs import ROUNDING, bound_after, engines, explain, first_layers, row_errors, run_traced
from tests.test_native_draft_paths import VIEWS, draft_round

# shapes of a Qwen2 small enough for seconds, with the real model's ratios where they matter: GQA (4 heads, 2 KV
# heads, head_dim 64 as the native kernels take), K-quant rows of 256, rms eps 1e-6, rope theta 1e6
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, CONTEXT = 256, 512, 2, 4, 2, 256
# GGUF tensor -> block type, as the real file mixes them (Q5_0 mostly, Q8_0 for v and the head, Q4_K and Q6_K)
TYPES = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_gate": "Q5_0",
         "ffn_up": "Q5_0", "ffn_down": "Q6_K"}
HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
      "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
      "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def _k_quant_blocks(kind: str, rows: int, cols: int, rng) -> np.ndarray:
    """Random Q4_K / Q6_K data (gguf-py cannot quantize to them) with fixed small super-block scales: uint8 [rows,
    cols / 256 * block bytes]. Q4_K blocks are d, dmin (float16), 12 scale bytes, 128 code bytes; Q6_K blocks are
    128 + 64 code bytes, 16 int8 scales, then d."""
    import gguf
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(2e-3 if kind == "Q4_K" else 2e-4).tobytes(), dtype=np.uint8)
    if kind == "Q4_K":
        data[:, :, 0:2] = d
        data[:, :, 2:4] = d                                                    # dmin
    else:
        data[:, :, size - 2:] = d
    return data.reshape(rows, -1)


def write_qwen2_gguf(path, tied: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """A 2-layer qwen2 GGUF with the default model's tokenizer; returns {HF name: the float32 values gguf-py reads
    back}, the ground truth of the mapping."""
    import gguf

    from edge.analysis.bench.peers import _copy_field
    rng = np.random.default_rng(seed)
    src = GGUFReader(str(default_gguf()))
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("stand-in qwen2")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    for field in src.fields.values():
        if field.name.startswith("tokenizer."):
            _copy_field(w, field)
    want = {}

    def matrix(name, hf, rows, cols, kind):
        if kind in ("Q4_K", "Q6_K"):
            data = _k_quant_blocks(kind, rows, cols, rng)
        else:
            data = gguf.quants.quantize(rng.normal(0, 0.05, (rows, cols)).astype(np.float32), gguf.GGMLQuantizationType[kind])
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
        want[hf] = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind])

    def vector(name, hf, n, mean, std):
        data = (mean + rng.normal(0, std, n)).astype(np.float32)
        w.add_tensor(name, data)
        want[hf] = data

    d = HIDDEN // HEADS
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * d, HIDDEN), "attn_v": (KV_HEADS * d, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN),
              "ffn_down": (HIDDEN, INTER)}
    matrix("token_embd.weight", "model.embed_tokens.weight", vocab, HIDDEN, "Q5_0")
    vector("output_norm.weight", "model.norm.weight", HIDDEN, 1.0, 0.1)
    if not tied:
        matrix("output.weight", "lm_head.weight", vocab, HIDDEN, "Q8_0")
    for n in range(LAYERS):
        for t, (rows, cols) in shapes.items():
            matrix(f"blk.{n}.{t}.weight", f"model.layers.{n}.{HF[t]}.weight", rows, cols, TYPES[t])
        for t in ("attn_q", "attn_k", "attn_v"):
            vector(f"blk.{n}.{t}.bias", f"model.layers.{n}.{HF[t]}.bias", shapes[t][0], 0.0, 0.5)
        for t in ("attn_norm", "ffn_norm"):
            vector(f"blk.{n}.{t}.weight", f"model.layers.{n}.{HF[t]}.weight", HIDDEN, 1.0, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return want


@pytest.fixture(scope="module")
def qwen2_gguf(tmp_path_factory):
    """(GGUF path, the values it holds, the streamed source the export reads) of the untied stand-in, its config and
    tokenizer folder in a cache of its own (BITNEST_CACHE, kept set for the module's exports); named as the shipped
    file is (its block types are the shipped file's)."""
    root = tmp_path_factory.mktemp("qwen2gguf")
    path = root / "standin-qwen2.Q4_K_M.gguf"
    want = write_qwen2_gguf(path)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("BITNEST_CACHE", str(root / "cache"))
        src = open_source(str(path))
        yield path, want, src
        src.close()


def test_qwen2_gguf_metadata_maps_to_the_config(qwen2_gguf):
    cfg = qwen2_gguf[2].config
    assert (cfg.architecture, cfg.family) == ("Qwen2ForCausalLM", "qwen2")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (HIDDEN, INTER, LAYERS)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (HEADS, KV_HEADS, HIDDEN // HEADS)
    assert cfg.rope_theta == 1e6 and cfg.rms_norm_eps == pytest.approx(1e-6)
    assert cfg.max_position_embeddings == CONTEXT and cfg.vocab_size == 49152
    assert cfg.attention_bias and not cfg.tie_word_embeddings       # a separate output.weight: an untied head


def test_qwen2_gguf_tensors_are_the_blocks_gguf_py_reads(qwen2_gguf):
    """Every tensor (Q5_0, Q8_0, Q4_K, Q6_K, float32 biases and norms) under its HF name, at gguf-py's values: no
    q/k permutation (llama's GGUF files permute q and k, qwen2's do not), no bias lost."""
    _, want, src = qwen2_gguf
    assert set(want) <= set(src.names())
    for name, values in want.items():
        got = src.get(name)
        assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(values)).float()), name


@pytest.mark.skipif(native_unavailable() is not None, reason=f"native backend: {native_unavailable()}")
@pytest.mark.parametrize("view", ["kv8", "kv4"])
def test_qwen2_two_layer_export_runs_the_native_step_as_the_reference(qwen2_gguf, tmp_path, view):
    """The stand-in exported (RTN, R1/R2/R4 fused, the nested head): the native step's draft and verification passes
    row by row against the torch reference at float32 rounding (or a shown flipped INT8 code, tests/reference_pairs);
    the q/k/v biases matter to both by far more than that."""
    out = tmp_path / "ck"
    run_export(ExportOptions(out=str(out), model=str(qwen2_gguf[0]), rotation="r1r2r4", quant=QuantOptions("rtn")))
    scenario = draft_round(VIEWS[view])
    native, ref = engines(out, LAYERS)
    got = list(scenario(native))
    flips = explain(out, LAYERS, scenario, got)
    want = run_traced(ref, scenario)[0]
    errs = [e for rows in row_errors(got, want) for e in rows]
    assert max(errs) < bound_after(flips), errs
    unbiased = first_layers(out, LAYERS)
    biases = [k for k in unbiased.tensors if k.endswith("_proj.bias")]
    assert len(biases) == 3 * LAYERS
    for k in biases:
        unbiased.tensors[k] = torch.zeros_like(unbiased.tensors[k])
    apart = row_errors(want, list(scenario(PassEngine(unbiased, TorchBackend(unbiased), 64))))
    assert min(e for rows in apart for e in rows) > 100 * ROUNDING, apart


def test_the_q8_0_peer_requantizes_every_block_type_of_the_shipped_file(qwen2_gguf, tmp_path):
    """bench's llama.cpp Q8_0 peer made from a GGUF of Q5_0 / Q4_K / Q6_K / Q8_0 tensors (the real file's types):
    every quantized tensor becomes Q8_0 within a Q8_0 step of gguf-py's values, float tensors are copied, and the
    metadata (architecture, shapes, tokenizer) is the source's."""
    import gguf

    from edge.analysis.bench.peers import q8_0_gguf, quant_label
    src = qwen2_gguf[0]
    out = q8_0_gguf(src, tmp_path / "cache")
    assert out.name.startswith("standin-qwen2.") and quant_label(src) == "q4_k_m" and quant_label(out) == "q8_0"
    assert q8_0_gguf(src, tmp_path / "cache") == out                       # made once
    other = tmp_path / "other" / src.name                                  # another file of the same name
    other.parent.mkdir()
    other.write_bytes(src.read_bytes()[:-1] + b"\0")
    assert q8_0_gguf(other, tmp_path / "cache") != out                    # is not served the first one's Q8_0
    a, b = GGUFReader(str(src)), GGUFReader(str(out))
    assert str(bytes(b.fields["general.architecture"].parts[-1]), "utf-8") == "qwen2"
    assert int(b.fields["qwen2.embedding_length"].parts[-1][0]) == HIDDEN
    assert len(b.fields["tokenizer.ggml.tokens"].data) == len(a.fields["tokenizer.ggml.tokens"].data)
    got = {t.name: t for t in b.tensors}
    F32, Q80 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0
    assert {t.tensor_type.name for t in a.tensors} == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    for t in a.tensors:
        new = got[t.name]
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        have = gguf.quants.dequantize(new.data, new.tensor_type)
        if t.tensor_type == F32:
            assert new.tensor_type == F32 and np.array_equal(have, want), t.name
        else:
            step = np.abs(want).reshape(want.shape[0], -1, 32).max(-1, keepdims=True) / 127       # Q8_0 block scale
            assert new.tensor_type == Q80, t.name
            assert (np.abs(have - want).reshape(step.shape[0], -1, 32) <= step * 0.6).all(), t.name   # half a step, the float16 scale's rounding


@pytest.fixture(scope="module")
def standin_export(qwen2_gguf, tmp_path_factory):
    """The stand-in exported as a user would (`--model FILE.gguf`, RTN, R1/R2/R4, the nested head) with a draft
    vocabulary of a third of its ids: q/k/v biases, an untied head and a draft vocabulary in one checkpoint."""
    out = tmp_path_factory.mktemp("qwen2ck") / "ck"
    run_export(ExportOptions(out=str(out), model=str(qwen2_gguf[0]), rotation="r1r2r4", quant=QuantOptions("rtn"),
                             draft_vocab=DRAFT_VOCAB))
    return out


DRAFT_VOCAB = 16384


@pytest.mark.parametrize("backend", ["native", "cpu"])
def test_speculation_on_the_standin_export_is_the_targets_output(standin_export, backend):
    """Lossless where the second real model's claims rest (biases, an untied head, a draft vocabulary): the
    speculative and auto policies give the target's greedy tokens on real prompts, with drafted tokens accepted
    (speculation ran, not target steps alone)."""
    from edge.corpora import sharegpt_prompts
    from edge.decode.config import GenerateConfig
    from edge.llm import Runtime
    if backend == "native" and native_unavailable() is not None:
        pytest.skip(f"native backend: {native_unavailable()}")
    rt = Runtime(standin_export, backend=backend, max_context=128)
    cfg = rt.ckpt.config
    assert cfg.attention_bias and not cfg.tie_word_embeddings and rt.ckpt.draft_vocab == DRAFT_VOCAB
    drafted = accepted = 0
    for text in sharegpt_prompts(3):
        ids = rt.encode(text)[-32:]
        target = rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=24))["tokens"]
        for policy in ("speculative", "auto"):
            out = rt.generate(ids, GenerateConfig(policy=policy, max_new_tokens=24))
            assert out["tokens"] == target, (backend, policy, text[:40])
            drafted += out["stats"].drafted
            accepted += out["stats"].accepted
    assert drafted > 0 and accepted > 0, (drafted, accepted)
