"""The Triton kernels against the pure-torch references (plugins/reference.py, plugins/kv.py), run in the Triton
interpreter on CPU here (TRITON_INTERPRET=1, set by conftest) and on the GPU where there is one. Fresh random inputs
every run (the seed is printed on failure), outputs poisoned before each launch, relative-error tolerances."""

import pytest
import torch
import triton
import triton.language as tl

from plugins import reference
from plugins.kernels import dual_plane_linear, nested_kv_attention
from plugins.kernels.kv_codes import whole_end
from plugins.kv import quantize_kv
from plugins.nesting import nest_rtn, nest_top4of8
from plugins.packing import pack_nibbles
from tests.conftest import KERNEL_DEVICE as DEV


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want.double()).norm() / want.norm()).item()


def nested_planes(gen, n, k, g, method):
    w = torch.randn(n, k, generator=gen) * 0.05
    c = nest_top4of8(w, g) if method == "top4of8" else nest_rtn(w, g)
    return pack_nibbles(c.q4), pack_nibbles(c.qr), c.scale, c.offset


def poisoned(*shape) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.float32, device=DEV)


def to_dev(*ts):
    return [None if t is None else t.to(DEV) for t in ts]


# K = 576 with G = 64 is 9 groups (split unevenly); 192 / 64 = 3 groups; N = 100 and 40 are not multiples of BLOCK_N.
@pytest.mark.parametrize("m", [1, 5, 16, 21])
@pytest.mark.parametrize("n,k,g,method", [(100, 576, 64, "rtn"), (40, 192, 64, "top4of8"), (72, 1536, 128, "rtn"),
                                          (64, 256, 32, "top4of8")])
def test_dual_plane_linear_matches_reference(gen, m, n, k, g, method):
    base, refine, scale, offset = nested_planes(gen, n, k, g, method)
    x = torch.randn(m, k, generator=gen)
    xd, bd, rd, sd, od = to_dev(x, base, refine, scale, offset)
    for view in ("draft", "target"):
        want = reference.dual_plane_linear(x, base, refine, scale, view, offset, act_int8=True)
        got = dual_plane_linear(xd, bd, rd if view == "target" else None, sd, view, od, out=poisoned(m, n))
        assert rel_err(got, want) < 1e-5, view
        want_f = reference.dual_plane_linear(x, base, refine, scale, view, offset, act_int8=False)
        got_f = dual_plane_linear(xd, bd, rd, sd, view, od, out=poisoned(m, n), act="float16")
        assert rel_err(got_f, want_f) < 2e-3, view       # float16 activations: ~2e-4


@pytest.mark.parametrize("act", ["int8", "float16"])
def test_dual_plane_linear_is_batch_invariant(gen, act):
    """Each row of a 5-token pass equals the single-token result bit for bit (lossless verification)."""
    base, refine, scale, _ = to_dev(*nested_planes(gen, 80, 576, 64, "rtn"))
    x = torch.randn(5, 576, generator=gen).to(DEV)
    for view in ("draft", "target"):
        whole = dual_plane_linear(x, base, refine, scale, view, act=act)
        for i in range(5):
            assert torch.equal(whole[i:i + 1], dual_plane_linear(x[i:i + 1], base, refine, scale, view, act=act)), \
                (view, i)


@pytest.mark.parametrize("n,k,g,method", [(300, 1024, 128, "rtn"), (100, 576, 64, "top4of8"), (40, 256, 32, "rtn")])
def test_decode_rows_equal_the_tensor_core_kernel_bit_for_bit(gen, n, k, g, method):
    """A pass of 12 tokens runs the tensor-core kernel; each token alone (M = 1) and the first five together (M = 5,
    two row tiles a thread) run the decode kernel: every row is equal bit for bit, both views, with the offset of a
    top-4-of-8 nest too (exact int32 group sums, then the same float32 steps in the same order and split). N = 300
    leaves a partial row tile; K = 1024 at G = 128 splits K unevenly over the interpreter's 8 SMs."""
    from plugins.kernels.gemv import DECODE_MAX_M
    base, refine, scale, offset = to_dev(*nested_planes(gen, n, k, g, method))
    x = torch.randn(12, k, generator=gen).to(DEV)
    assert 12 > DECODE_MAX_M
    for view in ("draft", "target"):
        whole = dual_plane_linear(x, base, refine, scale, view, offset)
        five = dual_plane_linear(x[:5], base, refine, scale, view, offset)
        assert torch.equal(five, whole[:5]), view
        for i in (0, 7, 11):
            assert torch.equal(dual_plane_linear(x[i:i + 1], base, refine, scale, view, offset), whole[i:i + 1]), \
                (view, i)


@pytest.mark.parametrize("m", [1, 6])
def test_decode_kernel_chains_match_its_group_form(gen, monkeypatch, m):
    """The decode kernel's compiled form (dp4a chains over 16-byte chunks, the lanes split out of each word),
    emulated lane by lane in the interpreter, gives what its whole-group interpreter form gives, bit for bit, and
    the reference within the INT8 tolerance: the code the GPU compiles is run here, not only compiled."""
    if DEV != "cpu":
        pytest.skip("on a GPU the compiled form runs in every other test")
    from plugins.kernels import gemv_decode
    base, refine, scale, offset = nested_planes(gen, 136, 256, 64, "top4of8")
    x = torch.randn(m, 256, generator=gen)
    for view in ("draft", "target"):
        groups = dual_plane_linear(x, base, refine, scale, view, offset)
        monkeypatch.setattr(gemv_decode, "interp_form", int(gemv_decode.INTERP_CHAINS))
        chains = dual_plane_linear(x, base, refine, scale, view, offset)
        monkeypatch.setattr(gemv_decode, "interp_form", int(gemv_decode.INTERP_GROUPS))
        assert torch.equal(chains, groups), view
        want = reference.dual_plane_linear(x, base, refine, scale, view, offset, act_int8=True)
        assert rel_err(chains, want) < 1e-5, view


def test_decode_kernel_draft_never_reads_the_refinement_plane(gen):
    """Garbage in the refinement plane changes no bit of a draft pass (decode kernel, compile-time and run-time
    view): the draft's program holds no load of it."""
    from plugins.kernels import dual_plane_linear_coded
    base, refine, scale, _ = to_dev(*nested_planes(gen, 64, 256, 128, "rtn"))
    junk = torch.randint(0, 256, refine.shape, generator=gen, dtype=torch.uint8).to(DEV)
    x = torch.randn(3, 256, generator=gen).to(DEV)
    draft = torch.zeros(1, dtype=torch.int32, device=DEV)
    want = dual_plane_linear(x, base, None, scale, "draft")
    assert torch.equal(dual_plane_linear(x, base, junk, scale, "draft"), want)
    assert torch.equal(dual_plane_linear_coded(x, base, junk, scale, draft), want)
    assert torch.equal(dual_plane_linear_coded(x, base, refine, scale, draft + 1),
                       dual_plane_linear(x, base, refine, scale, "target"))


def test_dual_plane_linear_rejects_bad_shapes(gen):
    base, refine, scale, _ = nested_planes(gen, 16, 128, 32, "rtn")
    with pytest.raises(ValueError, match="do not fit"):
        dual_plane_linear(torch.zeros(1, 64, device=DEV), *to_dev(base, refine, scale), "target")
    with pytest.raises(ValueError, match="refinement plane"):
        dual_plane_linear(torch.zeros(1, 128, device=DEV), *to_dev(base, None, scale), "target")
    with pytest.raises(ValueError, match="unknown weight view"):
        dual_plane_linear(torch.zeros(1, 128, device=DEV), *to_dev(base, refine, scale), "big")


def kv_planes(gen, hkv, cap, d):
    return quantize_kv(torch.randn(2, hkv, cap, d, generator=gen) * 2)


# Contexts around the chunk of 128 positions (1, 127, 129, 300); GQA ratios 1, 3 and 4; head dims 32 and 64.
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 32), (9, 3, 64), (8, 2, 64)])
@pytest.mark.parametrize("seq,t", [(1, 1), (127, 5), (129, 1), (300, 5)])
def test_nested_kv_attention_matches_reference(gen, hq, hkv, d, seq, t):
    if t > seq:
        pytest.skip("more queries than positions")
    base, refine, scale = kv_planes(gen, hkv, seq + 3, d)
    q = torch.randn(hq, t, d, generator=gen)
    qd, bd, rd, sd = to_dev(q, base, refine, scale)
    for kv8_from in (0, seq, max(0, seq - 40)):        # KV8, KV4, Recent-40
        want = reference.nested_kv_attention(q, base, refine, scale, seq, kv8_from)
        got = nested_kv_attention(qd, bd, rd, sd, seq, kv8_from, out=poisoned(hq, t, d))
        assert rel_err(got, want) < 5e-5, kv8_from      # split float16 operands: ~5e-6


def test_nested_kv_attention_over_scratch_slots(gen):
    """Draft-time queries over committed positions plus scratch slots, at a Recent-N split inside the scratch."""
    main, scratch = kv_planes(gen, 3, 200, 64), kv_planes(gen, 3, 8, 64)
    q = torch.randn(9, 3, 64, generator=gen)
    for kv8_from in (0, 131, 190):
        want = reference.nested_kv_attention(q, *main, 130, kv8_from, scratch=scratch, scratch_len=5)
        got = nested_kv_attention(*to_dev(q, *main), 130, kv8_from, scratch=to_dev(*scratch), scratch_len=5,
                                  out=poisoned(9, 3, 64))
        assert rel_err(got, want) < 5e-5


def test_the_capacity_wide_launch_reads_no_chunk_past_seq_len(gen, monkeypatch):
    """The CUDA graphs' launch covers the planes' whole capacity (8 chunks here) where 2 hold visible positions: the
    chunks past seq_len store nothing and the reduction combines the 2 only, in the order the 2-chunk launch uses, so
    the output is that launch's bit for bit with every workspace float poisoned (NaN) before the launch."""
    from plugins.kernels import nested_kv_attention_at
    from plugins.kernels.attention import device_scalar

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t
    real_empty, real_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: nan(real_like(*a, **kw)))
    planes = to_dev(*kv_planes(gen, 2, 1000, 32))
    q = torch.randn(4, 3, 32, generator=gen).to(DEV)
    want = nested_kv_attention(q, *planes, 150, 60)
    got = nested_kv_attention_at(q, *planes, *(device_scalar(v, DEV) for v in (150, 150, 60)))
    assert torch.equal(got, want) and not got.isnan().any()


@triton.jit
def whole_end_probe(args_ptr, out_ptr, BLOCK_S: tl.constexpr):
    """Program i: `kv_codes.whole_end` of the (start, end, seen) at args[3i:3i+3], to out[i]."""
    i = tl.program_id(0)
    start, end, seen = tl.load(args_ptr + 3 * i), tl.load(args_ptr + 3 * i + 1), tl.load(args_ptr + 3 * i + 2)
    tl.store(out_ptr + i, whole_end(start, end, seen, BLOCK_S))


@pytest.mark.parametrize("seq,kv8_from", [(150, 100), (300, 280)])     # edge steps only; whole KV4 steps too
def test_kv4_positions_never_read_the_refinement_plane(gen, seq, kv8_from):
    """Garbage in the refinement plane before kv8_from changes nothing, bit for bit."""
    base, refine, scale = to_dev(*kv_planes(gen, 2, seq, 32))
    q = torch.randn(4, 2, 32, generator=gen).to(DEV)
    junk = refine.clone()
    junk[:, :, :kv8_from] = torch.randint(0, 256, junk[:, :, :kv8_from].shape, generator=gen,
                                          dtype=torch.uint8).to(DEV)
    assert torch.equal(nested_kv_attention(q, base, refine, scale, seq, kv8_from),
                       nested_kv_attention(q, base, junk, scale, seq, kv8_from))


def test_whole_steps_are_the_prefix_of_a_views_steps_before_the_seen_position():
    """`kv_codes.whole_end`: where a view's steps from `start` stop being whole (every position before the view's
    end and before what every query sees), a whole number of steps from `start`; the steps after it are the edge
    steps. Run in the interpreter through a one-program kernel."""
    cases = {(0, 128, 1000): 128, (0, 128, 127): 64, (0, 120, 1000): 64, (128, 256, 200): 128 + 64,
             (120, 128, 1000): 120, (256, 200, 1000): 256, (64, 128, 64): 64, (0, 300, 300): 256}
    args = torch.tensor([v for c in cases for v in c], dtype=torch.int32)
    out = torch.zeros(len(cases), dtype=torch.int32)
    if DEV != "cpu":
        args, out = args.to(DEV), out.to(DEV)
    whole_end_probe[(len(cases),)](args, out, BLOCK_S=64)
    assert out.cpu().tolist() == list(cases.values())


def _run_ptx(asm: str, inputs: list[int]) -> list[int]:
    """Run the few PTX instructions the attention's code unpacking uses (mov.b32, prmt.b32 in its default mode,
    sub.f16x2 rounding to nearest, and the {lo, hi} half unpack), as the PTX ISA defines them, on 32-bit inputs $N
    after the outputs; returns the 16-bit outputs $0 .. in order."""
    import re
    import numpy as np
    regs, outs = {}, {}
    n_out = len(re.findall(r"\{\$\d+, \$\d+\}", asm)) * 2
    for i, v in enumerate(inputs):
        regs[f"${n_out + i}"] = v & 0xFFFFFFFF
    val = lambda t: regs[t] if t in regs else int(t, 16) if t.startswith("0x") else int(t)
    for ins in [s.strip() for s in asm.strip("{} ").split(";") if s.strip() and not s.strip().startswith(".reg")]:
        op, args = ins.split(None, 1)
        if op == "mov.b32" and args.startswith("{"):
            lo, hi, src = re.fullmatch(r"\{(\$\d+), (\$\d+)\}, (\w+)", args).groups()
            outs[lo], outs[hi] = regs[src] & 0xFFFF, regs[src] >> 16
            continue
        d, *ops = [a.strip() for a in args.split(",")]
        if op == "mov.b32":
            regs[d] = val(ops[0])
        elif op == "prmt.b32":          # bytes 0-3 from a, 4-7 from b; selector nibble i picks d's byte i
            pool = val(ops[0]) | val(ops[1]) << 32
            regs[d] = sum(((pool >> (8 * ((val(ops[2]) >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        elif op == "sub.f16x2":
            halves = lambda x: np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16)
            r = (halves(val(ops[0])) - halves(val(ops[1]))).view(np.uint16)
            regs[d] = int(r[0]) | int(r[1]) << 16
        else:
            raise AssertionError(f"unexpected instruction {ins}")
    return [outs[f"${i}"] for i in range(n_out)]


def test_attention_unpacking_ptx_gives_the_interpreters_codes(gen):
    """The inline PTX that turns the attention's code bytes into float16 on the GPU (never run by the interpreter)
    gives, run instruction by instruction as the PTX ISA defines them, the codes of the interpreter's form: every
    byte value in every lane, KV8 (u - 136) and KV4 (u - 128), dims in order (lo's byte i, then hi's)."""
    import numpy as np
    from plugins.kernels import kv_codes
    u = torch.arange(256, dtype=torch.int64)
    lo = u | u.roll(1) << 8 | u.roll(2) << 16 | u.roll(3) << 24              # every byte value in every lane
    hi = u.roll(7) | u.roll(11) << 8 | u.roll(13) << 16 | u.roll(17) << 24
    for asm, bias in ((kv_codes.F16_LANES_KV8.value, 136), (kv_codes.F16_LANES_KV4.value, 128)):
        for a, b in zip(lo.tolist(), hi.tolist()):
            got = np.array(_run_ptx(asm, [a, b]), dtype=np.uint16).view(np.float16).astype(np.float64)
            want = [((w >> (8 * (j // 2))) & 0xFF) - bias for j, w in zip(range(8), [a, b] * 4)]
            assert got.tolist() == want, (hex(a), hex(b), bias)


# GQA 3 over two chunks; GQA 4 with 9 queries (36 rows: two row tiles); MHA with a Recent-N split.
# The last two: chunk 0 is an edge step of the 5-query pass (its last position is past what its first query sees)
# and a whole step of the later queries' single-query passes.
@pytest.mark.parametrize("hq,hkv,d,seq,n_queries,kv8_from", [(9, 3, 64, 133, (5, 2), 0), (8, 2, 32, 70, (9,), 0),
                                                             (4, 4, 32, 150, (5,), 120), (4, 4, 32, 130, (5,), 0),
                                                             (8, 2, 64, 131, (5,), 0)])
def test_nested_kv_attention_is_batch_invariant(gen, hq, hkv, d, seq, n_queries, kv8_from):
    """Query t of a verification pass of T queries over S positions equals, bit for bit, a single-query pass
    over its own S - T + t + 1 positions: exact, because the kernel's arithmetic never depends on T."""
    base, refine, scale = to_dev(*kv_planes(gen, hkv, seq + 2, d))
    q = torch.randn(hq, max(n_queries), d, generator=gen).to(DEV)
    single = {}
    for t_all in n_queries:
        whole = nested_kv_attention(q[:, :t_all].contiguous(), base, refine, scale, seq, kv8_from)
        for t in range(t_all):
            pos = seq - t_all + t                                          # query t's position
            if (t, pos) not in single:
                single[t, pos] = nested_kv_attention(q[:, t:t + 1].contiguous(), base, refine, scale, pos + 1,
                                                     kv8_from)
            assert torch.equal(whole[:, t:t + 1], single[t, pos]), (t_all, t)


# Prefill chunks (more than SPLIT_QUERIES queries): GQA 3 at d64 (32-row tiles of 10 queries, the last short), MHA,
# GQA 6 (Qwen2.5-1.5B's ratio: 5 queries a tile of 30 rows); MQA with more heads than a tile holds (33 > 32 rows):
# the split kernel, at the fewest queries past its bound (18).
@pytest.mark.parametrize("hq,hkv,d,seq,t", [(9, 3, 64, 200, 70), (4, 4, 32, 150, 40), (12, 2, 32, 90, 33),
                                            (33, 1, 32, 40, 18)])
def test_a_prefill_chunk_matches_the_reference_and_allocates_no_workspace(gen, monkeypatch, hq, hkv, d, seq, t):
    """A pass of more than SPLIT_QUERIES queries (a prefill chunk) runs `attention_prefill`'s kernel: the reference's
    output (KV8, KV4, Recent-20) within the decode kernel's tolerance, every row written over a poisoned output,
    no launch of the split kernel and no workspace allocated."""
    from plugins.kernels import attention
    from plugins.kernels.attention_prefill import prefill_fits, prefill_rows
    base, refine, scale = kv_planes(gen, hkv, seq + 3, d)
    q = torch.randn(hq, t, d, generator=gen)
    qd, bd, rd, sd = to_dev(q, base, refine, scale)
    split, allocs = [], []
    real_run, real_empty = attention.flash_decode_kernel.run, torch.empty
    monkeypatch.setattr(attention.flash_decode_kernel, "run", lambda *a, **kw: split.append(1) or real_run(*a, **kw))
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: allocs.append(a) or real_empty(*a, **kw))
    fits = prefill_fits(hq // hkv, d)
    for kv8_from in (0, seq, seq - 20) if fits else (seq - 20,):     # the split kernel's views: tests above
        want = reference.nested_kv_attention(q, base, refine, scale, seq, kv8_from)
        got = nested_kv_attention(qd, bd, rd, sd, seq, kv8_from, out=poisoned(hq, t, d))
        assert rel_err(got, want) < 5e-5, kv8_from
    assert t > attention.SPLIT_QUERIES and (split == [] and allocs == []) == fits
    assert fits == (hq // hkv <= prefill_rows(d)) and fits == (hq // hkv < 33)         # MQA at 33 heads: split


def test_a_prefill_chunk_reads_its_lengths_on_the_device_and_kv4_never_the_refinement(gen):
    """The prefill kernel's grid depends on T alone: the launch with device-scalar lengths over planes of a larger
    capacity (CUDA graphs, TensorRT) is the eager one bit for bit; garbage in the refinement plane before kv8_from
    changes nothing; over draft scratch slots too (a pass whose last positions lie in the scratch planes)."""
    from plugins.kernels import nested_kv_attention_at
    from plugins.kernels.attention import device_scalar
    planes = to_dev(*kv_planes(gen, 2, 400, 64))
    q = torch.randn(6, 40, 64, generator=gen).to(DEV)
    want = nested_kv_attention(q, *planes, 170, 100)
    assert torch.equal(nested_kv_attention_at(q, *planes, *(device_scalar(v, DEV) for v in (170, 170, 100))), want)
    junk = planes[1].clone()
    junk[:, :, :100] = torch.randint(0, 256, junk[:, :, :100].shape, generator=gen, dtype=torch.uint8).to(DEV)
    assert torch.equal(nested_kv_attention(q, planes[0], junk, planes[2], 170, 100), want)
    main, scratch = kv_planes(gen, 2, 160, 64), kv_planes(gen, 2, 8, 64)
    qc = torch.randn(6, 36, 64, generator=gen)
    for kv8_from in (0, 150, 162):
        ref = reference.nested_kv_attention(qc, *main, 158, kv8_from, scratch=scratch, scratch_len=6)
        got = nested_kv_attention(*to_dev(qc, *main), 158, kv8_from, scratch=to_dev(*scratch), scratch_len=6)
        assert rel_err(got, ref) < 5e-5, kv8_from


def test_every_verification_pass_stays_on_the_batch_invariant_split_kernel():
    """γ's ceiling (edge.engine.MAX_PROPOSALS) makes verification passes of up to 17 queries: all of them must run the
    split kernel, whose rows equal single-query steps bit for bit (the prefill kernel's need not)."""
    from edge.engine import MAX_PROPOSALS
    from plugins.kernels.attention import SPLIT_QUERIES
    assert MAX_PROPOSALS + 1 <= SPLIT_QUERIES


@pytest.mark.parametrize("hq,hkv,d,t,g", [(8, 2, 64, 5, 128), (3, 1, 64, 1, 64), (4, 4, 32, 8, 32)])
def test_attention_writes_o_projs_activations_bit_for_bit(gen, hq, hkv, d, t, g):
    """With `quantize`, the chunk reduction's output is the plain launch's, laid token-major (its [T, Hq*D] rows are
    a view, no copy), and the activations it writes are quantize_decode's of those rows, bit for bit; its counters
    and running maxima are zero after it."""
    from plugins.kernels import nested_kv_attention, quantize_decode
    from plugins.kernels.gemv import split_counters
    seq = 150
    planes = to_dev(*kv_planes(gen, hkv, seq, d))
    q = torch.randn(hq, t, d, generator=gen).to(DEV)
    plain = nested_kv_attention(q, *planes, seq, 100)
    y, acts = nested_kv_attention(q, *planes, seq, 100, quantize=g)
    assert torch.equal(y, plain)
    rows = y.transpose(0, 1).reshape(t, hq * d)
    assert rows.data_ptr() == y.data_ptr() and rows.is_contiguous()
    want = quantize_decode(rows, g)
    assert torch.equal(acts[0], want[0]) and torch.equal(acts[2], want[2])
    assert torch.equal(acts[1][:, :t], want[1][:, :t])
    assert not split_counters(y.device, 16)[:16].any()           # tokens' counters, then their maxima


@pytest.mark.parametrize("m,h", [(1, 576), (5, 1536), (3, 4096), (2, 9216)])      # the last past one block
def test_rms_norm_kernel_matches_the_decoders_norm_and_is_row_invariant(gen, m, h):
    """One launch of plugins.kernels.decoder_ops.rms_norm against plugins.decoder_math.rms_norm in float64 (float32
    accuracy), on the float16 weight as stored; a row alone gives the bits it gives among others."""
    from plugins.decoder_math import rms_norm as ref_norm
    from plugins.kernels import rms_norm
    x = torch.randn(m, h, generator=gen) * 3
    w = (torch.rand(h, generator=gen) + 0.5).half()
    got = rms_norm(x.to(DEV), w.to(DEV), 1e-5)
    assert rel_err(got, ref_norm(x.double(), w.double(), 1e-5)) < 1e-6, (m, h)
    for i in range(m):
        assert torch.equal(rms_norm(x[i:i + 1].to(DEV), w.to(DEV), 1e-5), got[i:i + 1]), i


@pytest.mark.parametrize("m,h,g", [(1, 576, 64), (5, 1536, 128), (8, 4096, 128), (2, 9216, 128)])
def test_rms_norm_decode_gives_the_norm_and_its_quantization_bit_for_bit(gen, m, h, g):
    """The fused launch's normed rows equal rms_norm's, and its activations (codes, group sums, scales) equal
    quantize_decode of them: the linears after a norm read the same bits whichever launch made them."""
    from plugins.kernels import quantize_decode, rms_norm, rms_norm_decode
    x = (torch.randn(m, h, generator=gen) * 3).to(DEV)
    w = (torch.rand(h, generator=gen) + 0.5).half().to(DEV)
    out, acts = rms_norm_decode(x, w, 1e-5, g)
    assert torch.equal(out, rms_norm(x, w, 1e-5))
    want = quantize_decode(out, g)
    assert torch.equal(acts[0], want[0]) and torch.equal(acts[2], want[2])
    assert torch.equal(acts[1][:, :m], want[1][:, :m])          # the slots past M are never written nor read


@pytest.mark.parametrize("h", [72, 200])
def test_rotate_decode_is_the_rotation_and_its_rows_do_not_depend_on_m(gen, h):
    """x @ r and x @ r^T in one launch within float32 rounding of the float64 product (a transpose read wrong, or
    columns past a partial tile, fail by order 1), and a token's row alone is the bits it is among eight."""
    from plugins.hadamard import random_orthogonal
    from plugins.kernels import rotate_decode
    r = random_orthogonal(h, int(torch.randint(0, 1000, (1,), generator=gen))).float()
    x = torch.randn(8, h, generator=gen) * 3
    for transpose in (False, True):
        got = rotate_decode(x.to(DEV), r.to(DEV), transpose)
        assert rel_err(got, x.double() @ (r.double().T if transpose else r.double())) < 1e-6, transpose
        for i in (0, 5):
            assert torch.equal(rotate_decode(x[i:i + 1].to(DEV), r.to(DEV), transpose)[0], got[i]), (transpose, i)
        assert torch.equal(rotate_decode(x[:5].to(DEV), r.to(DEV), transpose), got[:5]), transpose


def test_rope_kernel_is_the_decoders_rope_bit_for_bit(gen):
    """q and k rotated in one launch, from the strided views the decoder passes (heads split out of a linear's
    output), equal `apply_rope`'s float32 result exactly (the same unfused operations in the same order)."""
    from edge.model.decoder import apply_rope
    from plugins.kernels import rope
    t, hq, hk, d = 5, 9, 3, 64
    q = (torch.randn(t, hq * d, generator=gen) * 4).to(DEV).view(t, hq, d).transpose(0, 1)     # [Hq, T, D] strided
    k = (torch.randn(t, hk * d, generator=gen) * 4).to(DEV).view(t, hk, d).transpose(0, 1)
    ang = torch.arange(40, 40 + t)[:, None] * (1e4 ** (-torch.arange(0, d, 2) / d))[None, :]
    cos, sin = [f(torch.cat((ang, ang), dim=-1)).float().to(DEV) for f in (torch.cos, torch.sin)]   # [T, D]
    qo, ko = rope(q, k, cos, sin)
    assert torch.equal(qo, apply_rope(q, cos, sin)) and torch.equal(ko, apply_rope(k, cos, sin))
    assert qo.is_contiguous() and ko.shape == (hk, t, d)
