"""edge.analysis.pass_profile: the device check's breakdown of a pass's device time by kernel family. The GPU's
records come from the profiler there; here the same passes run in the Triton interpreter and every kernel they
launch is recorded by name, so a kernel the family map does not know (a new fusion, a renamed kernel) fails here
before a device run files its time under "other"."""

import pytest

from edge.analysis.pass_profile import FAMILIES, OTHER, breakdown, family
from edge.backends import make_backend
from edge.backends.triton_graphs import GraphedEngine
from edge.engine.kv_cache import KVRead
from edge.model.checkpoint import load_checkpoint


def _launched(small_llama_checkpoint, monkeypatch) -> dict:
    """{pass: [kernel names]} of a draft, a target and a 3-token verification pass of the static engine (the form a
    CUDA graph captures) on the small Llama (R1, R4 online, nested linears)."""
    import plugins.kernels.gemv_decode as gd
    ck = load_checkpoint(small_llama_checkpoint)
    eng = GraphedEngine(ck, make_backend("triton", ck), 64, scratch=8, prefill_chunk=16, graphs=False)
    eng.prefill([1, 504, 3458, 314, 253, 1789, 282, 260])
    kind = type(gd.decode_gemv_kernel)                   # the interpreter's function type, or the compiler's
    names, real = [], kind.__getitem__                   # kernel[grid](...): every launcher's call, looked up on
    #                                                      the type (another test may leave a kernel's `run` patched)

    def launch(self, grid):
        run = real(self, grid)
        return lambda *a, **kw: names.append(self.fn.__name__) or run(*a, **kw)
    monkeypatch.setattr(kind, "__getitem__", launch)
    out = {}
    for name, call in {"draft": lambda: eng.forward([42], "draft", KVRead("kv8"), draft_slot=0),
                       "target": lambda: eng.forward([42], "target", KVRead("kv8")),
                       "verify": lambda: eng.forward([42, 7, 99], "target", KVRead("kv8"))}.items():
        names.clear()
        call()
        out[name] = list(names)
    return out


def test_every_kernel_a_triton_pass_launches_has_a_family(small_llama_checkpoint, monkeypatch):
    launched = _launched(small_llama_checkpoint, monkeypatch)
    ck = load_checkpoint(small_llama_checkpoint)
    layers = ck.config.num_layers
    for name, kernels in launched.items():
        fams = {k: family(k) for k in kernels}
        assert OTHER not in fams.values(), (name, fams)
        got = breakdown([(k, 1.0) for k in kernels], 1)["families"]
        # a block: q/k/v, o_proj, gate/up, down_proj (+ a nested head), two norms (+ the final one), RoPE with the KV
        # write, flash decoding and its reduction, the gated product; R1 at the embedding and before the head
        assert {f: v["launches"] for f, v in got.items()} == {
            "gemv": 4 * layers + ck.head_nested, "norm": 2 * layers + 1, "rope_kv_write": layers,
            "attention": 2 * layers, "gated": layers, "rotate": 2}, (name, got)
        assert list(got) == [f for f, _ in FAMILIES if f in got]             # in FAMILIES order


def test_a_prefill_chunks_kernels_have_their_families():
    """A prefill chunk launches kernels no decode pass does (the tensor-core GEMM, its activations' quantization, the
    prefill attention): each is counted with its kind, none left in OTHER."""
    assert [family(k) for k in ("gemm_kernel", "quantize_rows_kernel", "flash_prefill_kernel")] == \
        ["gemv", "quantize", "attention"]


def test_breakdown_is_per_pass_in_family_order_with_the_longest_kernels():
    recs = [("decode_gemv_kernel", 30.0), ("rms_norm_decode_kernel", 4.0), ("Memcpy DtoH (Device -> Pinned)", 2.0),
            ("decode_gemv_kernel", 50.0), ("void at::native::index_elementwise_kernel<128, 4>", 6.0)] * 2
    got = breakdown(recs, passes=2)
    assert got["kernel_ms"] == pytest.approx(0.092) and got["launches"] == 5
    assert list(got["families"]) == ["gemv", "norm", "copy", OTHER]
    assert got["families"]["gemv"] == {"ms": pytest.approx(0.08), "launches": 2}
    assert list(got["top"]) == ["decode_gemv_kernel", "void at::native::index_elementwise_kernel<128, 4>",
                                "rms_norm_decode_kernel", "Memcpy DtoH (Device -> Pinned)"]
