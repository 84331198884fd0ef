"""The attention plugin's two KV bindings through TensorRT 10.3's calls without TensorRT (plugins.trt.conformance
over plugins.trt.standin): the ping-pong build (no aliasing declared, separate input and output plane buffers
swapped each pass, edge.backends.tensorrt_kv.PingPong) gives the aliased build's outputs and planes pass for pass
over a decode-like schedule (prefill chunks, draft slots, verification, rollback, a redone step), while copying
only the catch-up window: positions past the pass stay as they were in the output buffer."""

import pytest
import torch

from edge.backends.tensorrt_kv import PingPong
from plugins.trt import standin as trt_standin
from plugins.step_contract import as_words
from plugins.trt.conformance import build, execute, load
from plugins.trt.plugins import KV_WINDOW_FIELD, define_plugins
from tests.conftest import KERNEL_DEVICE

HQ, HKV, D, CAP, WIDEST = 4, 2, 32, 24, 5
# (start, width) of each pass, as StepEngine issues them: a prefill of 8 in two chunks; draft slots at 8..11; a
# verification of 5 at 8 (two drafts accepted: length 11); two drafts, a verification at 11 (all accepted: 16); a
# draft step at 16 redone at the target view (gated escalation); the next step.
SCHEDULE = [(0, 5), (5, 3), (8, 1), (9, 1), (10, 1), (11, 1), (8, 5), (11, 1), (12, 1), (11, 5), (16, 1), (16, 1),
            (17, 1)]


def _inputs(gen, start: int, width: int, planes) -> list[torch.Tensor]:
    q, k, v = (torch.randn(h, width, D, generator=gen) for h in (HQ, HKV, HKV))
    scalars = [torch.tensor([start + width]), torch.tensor([max(start + width - 6, 0)])]     # seq_len, kv8_from
    return [t.to(KERNEL_DEVICE) for t in (q, k, v)] + list(planes) + [s.to(KERNEL_DEVICE) for s in scalars]


def _planes(gen, garbage: bool):
    from plugins.kv import quantize_kv
    if not garbage:
        return [torch.zeros(2, HKV, CAP, D // 8, dtype=torch.int32, device=KERNEL_DEVICE) for _ in range(2)] + \
            [torch.zeros(2, HKV, CAP, dtype=torch.float16, device=KERNEL_DEVICE)]
    base, refine, scale = quantize_kv(torch.randn(2, HKV, CAP, D, generator=gen) * 3)
    return [as_words(base).to(KERNEL_DEVICE), as_words(refine).to(KERNEL_DEVICE), scale.to(KERNEL_DEVICE)]


def test_pingpong_kv_binding_equals_the_aliased_binding_over_a_decode_schedule(gen):
    (_, attention), creator_cls = define_plugins(trt_standin, KERNEL_DEVICE)
    creator = creator_cls(attention)
    example = _inputs(torch.Generator().manual_seed(0), 0, 1, _planes(gen, False))
    widest = [(HQ, WIDEST, D), (HKV, WIDEST, D), (HKV, WIDEST, D), None, None, None, None, None]
    aliased = build(creator, example, max_shapes=widest)
    pingpong = build(creator, example, max_shapes=widest, aliasing=False)          # PreviewFeature off
    assert aliased["aliases"] == {1: 3, 2: 4, 3: 5} and pingpong["aliases"] == {}
    window = [int(f.data[0]) for f in pingpong["fields"] if f.name == KV_WINDOW_FIELD]
    assert window == [WIDEST], "the profile's largest pass is serialized with the engine"

    class FromDims(attention):                # reads the pass width from desc.dims: a wildcard at build
        def configure_plugin(self, inp, out):
            self.kv_window = int(inp[0].desc.dims[1])
    wild = build(creator_cls(FromDims), example, max_shapes=widest, aliasing=False)
    assert [int(f.data[0]) for f in wild["fields"]] == [-1], "the builder's desc.dims holds -1 where T ranges"
    rt_a, rt_p = load(creator, aliased), load(creator, pingpong)

    one = _planes(gen, False)                                  # the aliased cache: one set, in place
    sets = [_planes(gen, False), _planes(gen, True)]           # ping-pong: two sets, the second full of garbage
    schedule = PingPong()
    for n, (start, width) in enumerate(SCHEDULE):
        seq_len = start + width
        data = torch.Generator().manual_seed(100 + n)
        ins_a = _inputs(data, start, width, one)
        out_a = torch.empty(HQ, width, D, device=KERNEL_DEVICE)
        execute(rt_a, aliased, ins_a, [out_a, *one])

        p = schedule.next(seq_len, width)
        src, dst = sets[p], sets[1 - p]
        untouched = [t[:, :, seq_len:].clone() for t in dst]
        ins_p = _inputs(torch.Generator().manual_seed(100 + n), start, width, src)
        out_p = torch.empty(HQ, width, D, device=KERNEL_DEVICE)
        execute(rt_p, pingpong, ins_p, [out_p, *dst])

        assert torch.equal(out_p, out_a), f"pass {n} ({start}, {width}): attention output differs"
        for got, want in zip(dst, one):
            assert torch.equal(got[:, :, :seq_len], want[:, :, :seq_len]), f"pass {n}: planes differ before {seq_len}"
        for got, before in zip(dst, untouched):
            assert torch.equal(got[:, :, seq_len:], before), f"pass {n}: positions past the pass were copied"
    assert schedule.current == len(SCHEDULE) % 2


def _eager_and_replayed(rt, built, ins, make_outs):
    """(eager outputs, outputs of a CUDA-graph replay) of one loaded plugin: captured as the tensorrt backend
    replays a pass, after a warm-up on a side stream, the outputs reset to make_outs()'s contents before the replay."""
    eager = make_outs()
    execute(rt, built, ins, eager)
    outs = make_outs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        execute(rt, built, ins, outs)
    torch.cuda.current_stream().wait_stream(side)
    for t, fresh in zip(outs, make_outs()):
        t.copy_(fresh)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        execute(rt, built, ins, outs, sync=False)
    graph.replay()
    torch.cuda.synchronize()
    return eager, outs


@pytest.mark.gpu
@pytest.mark.skipif(KERNEL_DEVICE != "cuda", reason="a CUDA graph needs a GPU (the kernels compiled, not interpreted)")
def test_the_plugin_enqueues_replay_in_a_cuda_graph(gen):
    """Both plugins' enqueues captured in a torch.cuda.graph and replayed give the eager run's outputs (and the
    attention's planes, ping-pong: catch-up window and this pass's entries) bit for bit."""
    from tests.test_trt_conformance import _gemv_inputs
    (gemv, attention), creator_cls = define_plugins(trt_standin, KERNEL_DEVICE)
    creator = creator_cls(attention)
    example = _inputs(torch.Generator().manual_seed(0), 0, 1, _planes(gen, False))
    widest = [(HQ, WIDEST, D), (HKV, WIDEST, D), (HKV, WIDEST, D), None, None, None, None, None]
    built = build(creator, example, max_shapes=widest, aliasing=False)
    src, start = _planes(gen, True), _planes(gen, False)
    ins = _inputs(torch.Generator().manual_seed(7), 8, WIDEST, src)
    eager, replayed = _eager_and_replayed(
        load(creator, built), built, ins,
        lambda: [torch.zeros(HQ, WIDEST, D, device=KERNEL_DEVICE), *(t.clone() for t in start)])
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager)), "attention: the replay differs from eager"
    g_ins, _ = _gemv_inputs(gen)
    g_creator = creator_cls(gemv)
    g_built = build(g_creator, g_ins)
    eager, replayed = _eager_and_replayed(
        load(g_creator, g_built), g_built, g_ins,
        lambda: [torch.zeros(s, device=KERNEL_DEVICE) for s in g_built["out_shapes"]])
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager)), "GEMV: the replay differs from eager"


def test_pingpong_refuses_a_pass_past_the_previous_end():
    s = PingPong()
    assert s.next(8, 8) == 0 and s.next(9, 1) == 1 and s.next(8, 5) == 0   # a verification may start before the end
    with pytest.raises(ValueError, match="start at or before the previous pass's end"):
        s.next(20, 1)
