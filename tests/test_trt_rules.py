"""What a Jetson would find first, found without one: the exported step graph against TensorRT 10.3's rules
(export.trt.readiness), each defect of the old graph put back and named, and the TensorRT plugins' enqueue logic
(plugins.trt.plugins.enqueue_op) on garbage inputs, build phase and run time, in the Triton interpreter here."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from export.trt.readiness import check_graph
from plugins.step_contract import SEQ_LEN, as_words, kv_inputs, kv_outputs
from tests.conftest import KERNEL_DEVICE


@pytest.fixture(scope="module")
def step_model(rtn_checkpoint):
    from edge.model.checkpoint import load_checkpoint
    from export.onnx.graph import build_step_model
    return build_step_model(load_checkpoint(rtn_checkpoint))


def _copy(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _rules(model) -> set[str]:
    return {v.rule for v in check_graph(model)}


def test_exported_step_graph_follows_tensorrt_10_3_rules(step_model):
    assert check_graph(step_model) == []


def test_the_embedding_gather_is_standard_int32_ops(step_model):
    """The default export's graph gathers embedding rows from the head's word planes: Gather by token id, then only
    ops the 10.3 parser imports on int32. Putting back a BitShift (the obvious nibble unpacking, which the parser does
    not import) is named."""
    ops = {n.op_type for n in step_model.graph.node}
    assert {"Less", "Where", "Div"} <= ops and "model.embed_tokens.weight" not in \
        {i.name for i in step_model.graph.initializer}
    m = _copy(step_model)
    div = next(n for n in m.graph.node if n.op_type == "Div" and n.input[1] == "rows.nibble_divisors")
    div.op_type = "BitShift"
    div.attribute.append(helper.make_attribute("direction", "RIGHT"))
    found = [v for v in check_graph(m) if v.rule == "op"]
    assert [v.where for v in found] == [div.name], found


def test_uint8_planes_are_named(step_model):
    m = _copy(step_model)
    init = next(i for i in m.graph.initializer if i.name.endswith("q_proj.base"))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).view(np.uint8), init.name))   # bytes again
    found = check_graph(m)
    assert {"uint8", "plugin-type"} <= {v.rule for v in found}
    assert any(init.name in v.where for v in found if v.rule == "uint8")


def test_range_over_seq_len_is_a_shape_tensor(step_model):
    """Put back `Range(seq_len - M, seq_len)`: seq_len becomes a shape tensor."""
    m = _copy(step_model)
    sub = next(n for n in m.graph.node if n.op_type == "Sub")            # S - M
    rng = next(n for n in m.graph.node if n.op_type == "Range")
    rng.input[0], rng.input[1] = sub.output[0], sub.input[0]
    found = [v for v in check_graph(m) if v.rule == "shape-tensor"]
    assert [v.where for v in found] == [SEQ_LEN], found


def test_a_copy_between_plugin_and_plane_output_breaks_aliasing(step_model):
    """Put back the Identity between the attention node's plane output and the graph output."""
    m = _copy(step_model)
    node = next(n for n in m.graph.node if n.op_type == "NestedKvAttention")
    dst = node.output[1]
    node.output[1] = dst + ".pre"
    m.graph.node.append(helper.make_node("Identity", [dst + ".pre"], [dst], name="copy"))
    assert "alias" in _rules(m)


def test_uint8_kv_inputs_are_named(step_model):
    m = _copy(step_model)
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.name in kv_inputs(0)[:2] + kv_outputs(0)[:2]:
            vi.type.tensor_type.elem_type = TensorProto.UINT8
    assert "plugin-type" in _rules(m)


# -- the plugins' enqueue logic -----------------------------------------------------------------------------------

GUARD = 64      # bytes of sentinel on each side of every buffer a kernel may write


def _guarded(t: torch.Tensor):
    """(a view of `t`'s values inside a larger buffer with sentinel bytes around it, the whole buffer)."""
    flat = t.contiguous().view(torch.uint8).reshape(-1)
    whole = torch.full((flat.numel() + 2 * GUARD,), 0xA5, dtype=torch.uint8, device=KERNEL_DEVICE)
    whole[GUARD:GUARD + flat.numel()] = flat.to(KERNEL_DEVICE)
    return whole[GUARD:GUARD + flat.numel()].view(t.dtype).reshape(t.shape), whole


def _guards_intact(wholes) -> bool:
    return all(bool((w[:GUARD] == 0xA5).all() and (w[-GUARD:] == 0xA5).all()) for w in wholes)


def _attention_io(gen, cap=24, t=3, hq=4, hkv=2, d=32):
    from plugins.kv import quantize_kv
    planes = quantize_kv(torch.randn(2, hkv, cap, d, generator=gen))
    base, refine = (as_words(p) for p in planes[:2])                    # int32 words [2, Hkv, C, D/8]
    ins = [torch.randn(hq, t, d, generator=gen), torch.randn(hkv, t, d, generator=gen),
           torch.randn(hkv, t, d, generator=gen), base, refine, planes[2],
           torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)]
    return ins, [torch.full((hq, t, d), 7.0)]


GARBAGE = [-(2 ** 62), -5, 0, 2, 10 ** 6, 2 ** 40 + 3, 2 ** 63 - 1]


@pytest.mark.filterwarnings("ignore:invalid value encountered")   # an empty clamped pass divides 0 by 0
@pytest.mark.parametrize("seq_len,kv8_from", [(GARBAGE[i], GARBAGE[-1 - i]) for i in range(len(GARBAGE))])
@pytest.mark.parametrize("t,cap", [(3, 24), (40, 48)])               # a decode pass; a prefill chunk's kernel
def test_attention_enqueue_on_garbage_lengths_stays_in_its_planes(gen, seq_len, kv8_from, t, cap):
    """Run time: lengths TensorRT's fake data (or a caller's bug) could hold. The kernels clamp them; nothing is
    written outside the planes, and positions outside the clamped pass keep their bytes."""
    from plugins.trt.plugins import enqueue_op
    ins, outs = _attention_io(gen, cap=cap, t=t)
    ins[6][0], ins[7][0] = seq_len, kv8_from
    before = [p.clone() for p in ins[3:6]]
    guarded = [_guarded(x) for x in ins]
    dev_ins = [g[0] for g in guarded]
    out, out_whole = _guarded(outs[0])
    # the plane outputs alias the plane inputs: the same buffers, as TensorRT hands them with aliasing on
    assert enqueue_op("NestedKvAttention", dev_ins, [out, *dev_ins[3:6]], building=False) == 0
    assert _guards_intact([g[1] for g in guarded] + [out_whole])
    t, cap = ins[0].shape[1], ins[3].shape[2]
    end = min(max(seq_len, t), cap)                                        # where the clamped write lands
    for new, old in zip(dev_ins[3:6], before):
        new = new.cpu()
        assert torch.equal(new[:, :, :end - t], old[:, :, :end - t]) and torch.equal(new[:, :, end:], old[:, :, end:])


def test_attention_enqueue_copies_into_distinct_plane_outputs(gen):
    """Where TensorRT gives an aliased output its own buffer, the output still holds the whole updated plane."""
    from plugins.kv import quantize_kv
    from plugins.trt.plugins import enqueue_op
    ins, outs = _attention_io(gen)
    ins[6][0], ins[7][0] = 10, 0
    dev = [x.to(KERNEL_DEVICE) for x in ins]
    aliased = [p.clone() for p in dev[3:6]]
    separate = [torch.zeros_like(p) for p in dev[3:6]]
    out_a, out_s = torch.empty_like(outs[0]).to(KERNEL_DEVICE), torch.empty_like(outs[0]).to(KERNEL_DEVICE)
    enqueue_op("NestedKvAttention", dev[:3] + aliased + dev[6:], [out_a, *aliased], building=False)
    enqueue_op("NestedKvAttention", dev, [out_s, *separate], building=False)
    assert all(torch.equal(a, s) for a, s in zip(aliased, separate)) and torch.equal(out_a, out_s)
    wb, wr, ws = quantize_kv(torch.stack((ins[1], ins[2])))               # the pass's entries at [7, 10)
    got = [separate[0].view(torch.uint8), separate[1].view(torch.uint8), separate[2]]
    for plane, want in zip(got, (wb, wr, ws)):                            # base, refinement and scale planes
        assert torch.equal(plane[:, :, 7:10].cpu(), want)


@pytest.mark.parametrize("kv8_from", [0, 5, 10])
def test_attention_enqueue_equals_the_float64_oracle(gen, kv8_from):
    """The plugin's attention output against plugins.reference.nested_kv_attention (float64) over the planes it
    wrote: 3 new positions [7, 10) after 7 cached, read at KV4 before `kv8_from` and KV8 from it on."""
    from plugins.reference import nested_kv_attention
    from plugins.step_contract import as_bytes
    from plugins.trt.plugins import enqueue_op
    ins, outs = _attention_io(gen)
    ins[6][0], ins[7][0] = 10, kv8_from
    dev = [x.to(KERNEL_DEVICE) for x in ins]
    out = torch.empty_like(outs[0]).to(KERNEL_DEVICE)
    assert enqueue_op("NestedKvAttention", dev, [out, *dev[3:6]], building=False) == 0
    base, refine, scale = (p.cpu() for p in dev[3:6])
    ref = nested_kv_attention(ins[0], as_bytes(base), as_bytes(refine), scale, main_len=10, kv8_from=kv8_from)
    err = float((out.cpu().double() - ref).norm() / ref.norm())
    assert err < 1e-5, err
    if kv8_from:                        # the KV4 positions matter: read at KV8 they give another answer
        other = nested_kv_attention(ins[0], as_bytes(base), as_bytes(refine), scale, main_len=10, kv8_from=0)
        assert float((other - ref).norm() / ref.norm()) > 1e-3


def test_build_phase_enqueue_launches_nothing(gen):
    """TensorRT may time a plugin on fake data while building: enqueue returns 0 and touches no buffer, even
    with lengths and a view that could not run."""
    from plugins.trt.plugins import enqueue_op
    ins, outs = _attention_io(gen)
    ins[6][0], ins[7][0] = 2 ** 63 - 1, -(2 ** 63)
    planes = [p.clone() for p in ins[3:6]]
    assert enqueue_op("NestedKvAttention", ins, [outs[0], *ins[3:6]], building=True) == 0
    assert all(torch.equal(a, b) for a, b in zip(planes, ins[3:6])) and bool((outs[0] == 7.0).all())
    x = torch.randn(2, 64, generator=gen)
    y = torch.full((2, 16), 3.0)
    assert enqueue_op("DualPlaneGemv", [x, torch.zeros(16, 8, dtype=torch.int32), torch.zeros(16, 8, dtype=torch.int32),
                                        torch.ones(16, 1, dtype=torch.float16),
                                        torch.tensor([123456789], dtype=torch.int64)], [y], building=True) == 0
    assert bool((y == 3.0).all())


@pytest.mark.parametrize("code", [0, 1, 7, -1, 2 ** 62])
def test_gemv_enqueue_reads_the_view_on_the_device(gen, code):
    """View codes other than 1 run the draft (never the refinement plane); 1 the target; no host read."""
    from plugins.nesting import nest_rtn
    from plugins.packing import pack_nibbles
    from plugins.reference import dual_plane_linear
    from plugins.trt.plugins import enqueue_op
    n, k = 48, 128
    codes = nest_rtn(torch.randn(n, k, generator=gen), 64)
    base, refine = pack_nibbles(codes.q4), pack_nibbles(codes.qr)
    x = torch.randn(3, k, generator=gen)
    view = "target" if code == 1 else "draft"
    y = torch.empty(3, n, device=KERNEL_DEVICE)
    ins = [x, as_words(base), as_words(refine), codes.scale, torch.tensor([code], dtype=torch.int64)]
    assert enqueue_op("DualPlaneGemv", [i.to(KERNEL_DEVICE) for i in ins], [y], building=False) == 0
    ref = dual_plane_linear(x, base, refine, codes.scale, view, None, act_int8=True)
    assert float((y.cpu().double() - ref).norm() / ref.norm()) < 1e-5, view
