"""The `triton` backend end to end (GPU, or the Triton interpreter here): whole passes of a small real-format model
through the dual-plane GEMV, the KV write kernel and nested-KV flash-decoding, against the torch reference backend,
and greedy speculative decoding equal to greedy target decoding on it."""

import os

import pytest
import torch

from edge.backends import make_backend
from edge.decode.config import GenerateConfig
from edge.engine.interface import PassEngine
from edge.decode.generate import generate
from edge.engine.kv_cache import KVRead
from edge.errors import BitNestError
from edge.model.checkpoint import load_checkpoint

PROMPT = [1, 504, 3458, 314, 253, 1789, 282, 260, 4150, 30, 378, 1096]


def engines(ckpt_dir, capacity=64):
    out = {}
    for name in ("torch", "triton"):
        ck = load_checkpoint(ckpt_dir)
        out[name] = PassEngine(ck, make_backend(name, ck), capacity, scratch=8, prefill_chunk=8)
    return out


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_triton_passes_match_the_torch_backend(small_llama_checkpoint):
    e = engines(small_llama_checkpoint)
    last = {n: eng.prefill(PROMPT) for n, eng in e.items()}              # two chunks of 8: KV written by kernels
    assert rel(last["triton"], last["torch"]) < 1e-3
    for view, kv in (("target", KVRead("kv8")), ("draft", KVRead("kv4")), ("draft", KVRead("recent", 4))):
        got = {n: eng.forward([42, 7, 99], view, kv) for n, eng in e.items()}   # a 3-token verification-sized pass
        # Per row: the float16 head costs ~3e-4; a float32 difference that moves an INT8 activation across a
        # rounding boundary (both backends quantize activations) costs up to a few 1e-3 on a random model.
        for i in range(3):
            assert rel(got["triton"][i], got["torch"][i]) < 1e-2, (view, kv, i)
            assert got["torch"][i].argmax() in got["triton"][i].topk(5).indices
    assert e["triton"].cache.main.base.device == e["triton"].backend.device


def test_a_prefill_chunk_past_the_split_kernels_queries_runs_the_prefill_attention(small_llama_checkpoint, monkeypatch):
    """A 36-token prompt in one chunk (more than attention.SPLIT_QUERIES queries): each layer's attention runs the
    prefill kernel once (no split, no partials), and the chunk's logits and the next verification-sized pass match
    the torch backend as closely as the split kernel's chunks of 8 do (test above)."""
    import plugins.kernels.attention as attention
    prompt = PROMPT * 3                                                     # 36 tokens
    e = {}
    for name in ("torch", "triton"):
        ck = load_checkpoint(small_llama_checkpoint)
        e[name] = PassEngine(ck, make_backend(name, ck), 64, scratch=8, prefill_chunk=64)
    launches, real = [], attention.flash_prefill_kernel.run
    monkeypatch.setattr(attention.flash_prefill_kernel, "run", lambda *a, **kw: launches.append(1) or real(*a, **kw))
    last = {n: eng.prefill(prompt) for n, eng in e.items()}
    assert len(prompt) > attention.SPLIT_QUERIES and len(launches) == e["triton"].ckpt.config.num_layers
    assert rel(last["triton"], last["torch"]) < 1e-3
    got = {n: eng.forward([42, 7, 99], "target", KVRead("kv8")) for n, eng in e.items()}
    assert len(launches) == e["triton"].ckpt.config.num_layers               # a verification pass: the split kernel
    for i in range(3):
        assert rel(got["triton"][i], got["torch"][i]) < 1e-2, i
    # the static form (lengths in device scalars, what a CUDA graph captures) computes the eager chunk (both policies
    # prefill a prompt alike: speculation after it is the split kernel's, test_triton_speculative_equals_target_greedy)
    from edge.backends import make_engine
    static = make_engine("triton", load_checkpoint(small_llama_checkpoint), 64, scratch=8, prefill_chunk=64)
    assert rel(static.prefill(prompt), last["triton"]) < 1e-6 and len(launches) == 2 * static.ckpt.config.num_layers


def test_static_passes_compute_what_eager_passes_compute(small_llama_checkpoint):
    """The static form a CUDA graph captures (lengths, ids and positions read from device buffers; the grid over
    the whole capacity) against the eager launchers, pass for pass: prefill chunks, verification-sized passes in
    each KV view, and draft passes into scratch slots."""
    from edge.backends import make_engine
    from edge.backends.triton_graphs import GraphedEngine
    ck = load_checkpoint(small_llama_checkpoint)
    eager = PassEngine(ck, make_backend("triton", ck), 64, scratch=8, prefill_chunk=8)
    ck2 = load_checkpoint(small_llama_checkpoint)
    static = make_engine("triton", ck2, 64, scratch=8, prefill_chunk=8)
    assert isinstance(static, GraphedEngine) and static.use_graphs == torch.cuda.is_available()
    pairs = [(eager.prefill(PROMPT), static.prefill(PROMPT))]
    for view, kv in (("target", KVRead("kv8")), ("draft", KVRead("kv4")), ("draft", KVRead("recent", 4))):
        pairs.append((eager.forward([42, 7, 99], view, kv), static.forward([42, 7, 99], view, kv)))
    for slot in range(3):
        pairs += [(e.forward([5 + slot], "draft", KVRead("kv8"), draft_slot=slot) for e in (eager, static))]
    for i, (a, b) in enumerate(pairs):
        assert a.device.type == b.device.type == "cpu"
        assert rel(b, a) < 1e-6, (i, rel(b, a))
    assert torch.equal(eager.cache.main.base.cpu(), static.cache.main.base.cpu())
    assert torch.equal(eager.cache.draft.scale.cpu(), static.cache.draft.scale.cpu())


def test_triton_speculative_equals_target_greedy(small_llama_checkpoint):
    from edge.backends import make_engine
    ck = load_checkpoint(small_llama_checkpoint)
    eng = make_engine("triton", ck, 64, scratch=8, prefill_chunk=16)
    runs = {}
    for policy in ("target", "speculative"):
        eng.reset()
        runs[policy], stats = generate(eng, PROMPT, GenerateConfig(policy=policy, gamma=3, max_new_tokens=8), set())
    assert runs["speculative"] == runs["target"] and len(runs["target"]) == 8
    assert stats.draft_passes > 0 and stats.target_passes > 0


def test_triton_backend_without_gpu_or_interpreter_says_how_to_fix(small_llama_checkpoint, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the backend runs")
    monkeypatch.setitem(os.environ, "TRITON_INTERPRET", "0")
    with pytest.raises(BitNestError, match="needs a CUDA GPU.*--backend cpu"):
        make_backend("triton", load_checkpoint(small_llama_checkpoint))


GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                              reason="needs a CUDA GPU with TRITON_INTERPRET unset")


@pytest.mark.gpu
@GPU_ONLY
def test_cuda_graph_replays_equal_eager_passes_gpu(small_llama_checkpoint):
    """On a CUDA GPU: each decode shape is captured once and its replays give the eager launchers' logits."""
    from edge.backends import make_engine
    ck = load_checkpoint(small_llama_checkpoint)
    eager = PassEngine(ck, make_backend("triton", ck), 64, scratch=8, prefill_chunk=8)
    graphed = make_engine("triton", load_checkpoint(small_llama_checkpoint), 64, scratch=8, prefill_chunk=8)
    eager.prefill(PROMPT)
    graphed.prefill(PROMPT)
    kept = []
    for i, token in enumerate((42, 7, 99, 5, 1096)):            # first pass captures, the rest replay
        a = eager.forward([token], "target", KVRead("kv8"))
        b = graphed.forward([token], "target", KVRead("kv8"))
        eager.commit(eager.length + 1)
        graphed.commit(graphed.length + 1)
        assert rel(b, a) < 1e-6, (i, rel(b, a))
        assert b.device.type == "cpu" and b.is_pinned()          # one DMA into page-locked memory (to_host)
        kept.append((b.clone(), b))
    assert graphed.graph_count == 1
    assert all(torch.equal(copy, b) for copy, b in kept)         # a later pass never overwrote an earlier one's logits
    a = graphed.forward([11], "target", KVRead("kv8"), on_device=True)        # a replay whose logits stay on the GPU
    first = a.clone()
    b = graphed.forward([12], "target", KVRead("kv8"), on_device=True)        # the same graph's next replay
    assert a.is_cuda and torch.equal(a, first) and not torch.equal(a, b)      # its own tensor, not the graph's buffer
    assert torch.equal(graphed.forward([12], "target", KVRead("kv8")), b.cpu())


@pytest.mark.gpu
@GPU_ONLY
def test_triton_lossless_on_the_default_model_gpu(rtn_checkpoint):
    """On a CUDA GPU: greedy speculative output equals greedy target output on the real model, four prompts."""
    from edge.corpora import sharegpt_prompts
    from edge.llm import Runtime
    rt = Runtime(rtn_checkpoint, backend="triton", max_context=1024)
    for prompt in sharegpt_prompts(4):
        ids = rt.encode(prompt)
        runs = [rt.generate(ids, GenerateConfig(policy=p, gamma=4, max_new_tokens=64))["tokens"]
                for p in ("target", "speculative")]
        assert runs[0] == runs[1]


def test_a_block_launches_one_gemv_for_q_k_v_and_one_for_gate_up(small_llama_checkpoint, monkeypatch):
    """The backend stacks each block's q/k/v and gate/up planes at load and adds the residual stream in o_proj's and
    down_proj's launches: a target pass launches 4 decode GEMVs a layer (and the head's), not 7, and no residual
    add, and computes what launching each linear alone and adding in torch computes (bit for bit here: K of one or
    two groups, so no split of K whose plan could differ with the stack's rows)."""
    import plugins.kernels.gemv as gemv
    passes = []
    for stacked in (True, False):
        ck = load_checkpoint(small_llama_checkpoint)
        backend = make_backend("triton", ck)
        assert len(backend.stacks) == 2 * ck.config.num_layers
        if not stacked:
            backend.stacks.clear()                                  # every linear launched alone
            monkeypatch.setattr(backend, "linear_add", None)        # and the residual added by torch
        eng = PassEngine(ck, backend, 64, scratch=8, prefill_chunk=16)
        eng.prefill(PROMPT)
        launches, real = [], gemv._launch_decode
        monkeypatch.setattr(gemv, "_launch_decode", lambda *a, **kw: launches.append(1) or real(*a, **kw))
        passes.append(eng.forward([42, 7, 99], "target", KVRead("kv8")))
        monkeypatch.setattr(gemv, "_launch_decode", real)
        per_layer = 4 if stacked else 7
        assert len(launches) == per_layer * ck.config.num_layers + ck.head_nested, (stacked, len(launches))
    assert torch.equal(passes[0], passes[1])


def test_linears_reading_one_input_share_its_quantization(small_llama_checkpoint, monkeypatch):
    """q/k/v and gate/up read the same normed input: a decode pass quantizes it once for them, in the norm's own
    launch (rms_norm_decode: the two norms of a layer and the final one), o_proj's in attention's chunk reduction
    and down_proj's in the gated product's launch (swiglu_decode), so no quantization launch is left (7 a layer
    before), and the pass computes the same bits as quantizing each linear's input for it."""
    import plugins.kernels.decoder_ops as ops
    import plugins.kernels.gemv as gemv
    ck = load_checkpoint(small_llama_checkpoint)
    eng = PassEngine(ck, make_backend("triton", ck), 64, scratch=8, prefill_chunk=16)
    eng.prefill(PROMPT)
    calls, norms = [], []
    real, real_norm = gemv.quantize_decode, ops.rms_norm_decode
    monkeypatch.setattr(gemv, "quantize_decode", lambda x, g: calls.append(x.shape) or real(x, g))
    monkeypatch.setattr(ops, "rms_norm_decode", lambda *a: norms.append(a[3]) or real_norm(*a))
    shared = eng.forward([42, 7, 99], "target", KVRead("kv8"))
    backend_calls = len(calls)            # the backend's own quantizations go through plugins.kernels' launcher
    layers = ck.config.num_layers
    assert backend_calls == 0, (backend_calls, layers)
    assert len(norms) == 2 * layers + ck.head_nested, (norms, layers)
    ck2 = load_checkpoint(small_llama_checkpoint)
    solo = PassEngine(ck2, make_backend("triton", ck2), 64, scratch=8, prefill_chunk=16)
    solo.prefill(PROMPT)
    monkeypatch.setattr(solo.backend, "_shared_acts", lambda x, g: None)     # every linear quantizes its own x
    calls.clear()
    assert torch.equal(solo.forward([42, 7, 99], "target", KVRead("kv8")), shared)
    assert len(calls) == 4 * layers + ck.head_nested         # one a GEMV launch: q/k/v and gate/up stacked


def test_a_blocks_gated_product_is_one_launch_after_gate_up(small_llama_checkpoint, monkeypatch):
    """In a decode pass the MLP's silu(gate) * up, its R4 rotation (the test model records one Sylvester factor of
    256) and down_proj's quantization are one launch a layer (plugins.kernels.swiglu), where torch took SiLU, the
    product, a matmul and a copy a token and a concatenation; the pass's logits stay those of the torch ops within
    what one INT8 code moved by a float32 rounding costs."""
    import plugins.kernels.swiglu as swiglu
    from torch.overrides import TorchFunctionMode

    class Matmuls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.count += getattr(func, "__name__", "") in ("matmul", "__matmul__", "silu")
            return func(*args, **(kwargs or {}))

    got = {}
    for fused in (True, False):
        ck = load_checkpoint(small_llama_checkpoint)
        assert ck.rotations.r4_factors == (256,)
        backend = make_backend("triton", ck)
        if not fused:
            monkeypatch.setattr(backend, "gated", None)             # the decoder's torch ops
        eng = PassEngine(ck, backend, 64, scratch=8, prefill_chunk=16)
        eng.prefill(PROMPT)
        launches, real = [], swiglu.swiglu_decode_kernel.run
        monkeypatch.setattr(swiglu.swiglu_decode_kernel, "run", lambda *a, **kw: launches.append(1) or real(*a, **kw))
        with Matmuls() as ops:
            got[fused] = eng.forward([42, 7, 99], "target", KVRead("kv8"))
        monkeypatch.setattr(swiglu.swiglu_decode_kernel, "run", real)
        layers = ck.config.num_layers
        assert len(launches) == (layers if fused else 0)
        # outside the blocks, a float16 head is a matmul a token (R1's rotations are one launch each: rotate_decode)
        assert ops.count == 3 * (not ck.head_nested) + (0 if fused else layers * (3 + 1)), (fused, ops.count)
    assert rel(got[True], got[False]) < 1e-2


def test_the_decoder_rotates_by_the_r1_its_backend_moved(small_llama_checkpoint):
    """A GPU backend moves R1 with the checkpoint's tensors; the engine's decoder must rotate by that copy, not the
    manifest's CPU one (a 64 MB host-to-device copy a pass at 7B, and no CUDA graph capture): here the move is
    stood in for by a clone in the store, which the eager and the static engines both use."""
    from edge.backends import make_engine
    from edge.model.checkpoint import R1_TENSOR
    for static in (False, True):
        ck = load_checkpoint(small_llama_checkpoint)
        moved = ck.tensors[R1_TENSOR] = ck.tensors[R1_TENSOR].clone()
        eng = make_engine("triton", ck, 64) if static else PassEngine(ck, make_backend("triton", ck), 64)
        assert ck.rotations.r1 is not moved and eng.decoder.rot.r1 is moved, static


def test_a_two_factor_r4_model_is_lossless_through_the_fused_kernels():
    """A random-plane model with a default export's online rotations at a two-factor R4 layout ((12, 32), the form of
    every real model's: a dense Paley factor, then a power of two), through the triton backend: R1 and the gated R4
    product in one launch each, passes within the torch backend's INT8 rounding, and greedy speculation equal to
    greedy target decoding (the fused kernels' rows do not depend on the pass's tokens)."""
    from edge.backends import make_engine
    from edge.memory.model_shapes import _llama
    from edge.memory.synthetic import synthetic_checkpoint, with_online_rotations
    cfg = _llama("LlamaForCausalLM", 128, 384, 2, 2, 1, 512, 256, 1e4)
    make = lambda: with_online_rotations(synthetic_checkpoint(cfg, device="cpu", seed=4))   # noqa: E731
    assert make().rotations.r4_factors == (12, 32)
    prompt = [5, 17, 99, 200, 31, 8, 77, 3]
    got = {}
    for name in ("torch", "triton"):
        ck = make()
        eng = PassEngine(ck, make_backend(name, ck), 64, scratch=8, prefill_chunk=16)
        eng.prefill(prompt)
        got[name] = eng.forward([42, 7, 99], "target", KVRead("kv8"))
    assert rel(got["triton"], got["torch"]) < 1e-2
    eng = make_engine("triton", make(), 64, scratch=8, prefill_chunk=16)
    runs = {}
    for policy in ("target", "speculative"):
        eng.reset()
        runs[policy], stats = generate(eng, prompt, GenerateConfig(policy=policy, gamma=3, max_new_tokens=5), set())
    assert runs["speculative"] == runs["target"] and stats.draft_passes > 0
