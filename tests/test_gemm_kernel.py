"""The prefill GEMM (plugins/kernels/gemm.py) where the interpreter does not reach: its inline PTX, which turns four
plane bytes into their signed nibbles on the GPU, run instruction by instruction as the PTX ISA defines them; and its
launch plan (two compiled widths of tokens, the runs of the split of K) against the decode rows."""

import pytest
import torch

from plugins.kernels import dual_plane_linear_tiled
from plugins.kernels.tiling import tile_planes
from tests.conftest import KERNEL_DEVICE as DEV
from tests.test_kernels import nested_planes, to_dev

MASK = 0xFFFFFFFF


def _run_ptx(asm: str, word: int) -> tuple[int, int]:
    """Run the PTX of `gemm.NIBBLES` (lop3.b32, add.u32, xor.b32, shr.u32 on 32-bit registers) on input $2; returns
    ($0, $1)."""
    regs = {"$2": word & MASK}
    val = lambda t: regs[t] if t in regs else int(t, 16) if t.startswith("0x") else int(t)
    for ins in [s.strip() for s in asm.strip("{} \n").split(";") if s.strip() and not s.strip().startswith(".reg")]:
        op, args = ins.split(None, 1)
        d, *ops = [a.strip() for a in args.split(",")]
        if op == "lop3.b32":            # bit i of the result: bit (a_i << 2 | b_i << 1 | c_i) of the LUT
            a, b, c, lut = (val(o) for o in ops)
            regs[d] = sum(((lut >> (((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1))) & 1) << i
                          for i in range(32))
        elif op == "add.u32":
            regs[d] = (val(ops[0]) + val(ops[1])) & MASK
        elif op == "xor.b32":
            regs[d] = val(ops[0]) ^ val(ops[1])
        elif op == "shr.u32":
            regs[d] = val(ops[0]) >> val(ops[1])
        else:
            raise AssertionError(f"unexpected instruction {ins}")
    return regs["$0"], regs["$1"]


def test_the_nibble_ptx_gives_the_interpreters_signed_nibbles():
    """Every byte value in every lane of a word: $0's byte i is the low nibble of byte i sign-extended to int8, $1's
    the high one, as the interpreter's shifts give them (docs/contracts.md, weights: two's complement nibbles)."""
    from plugins.kernels.gemm import NIBBLES
    u = list(range(256))
    for i in range(256):
        lanes = [u[i], u[(i + 1) % 256], u[(i + 7) % 256], u[(i + 13) % 256]]
        word = sum(b << (8 * k) for k, b in enumerate(lanes))
        lo, hi = _run_ptx(NIBBLES.value, word)
        signed = lambda n: n - 16 if n >= 8 else n
        for k, b in enumerate(lanes):
            assert ((lo >> (8 * k)) & 0xFF) == signed(b & 0xF) & 0xFF, (hex(word), k)
            assert ((hi >> (8 * k)) & 0xFF) == signed(b >> 4) & 0xFF, (hex(word), k)


@pytest.mark.parametrize("k,g", [(1024, 128), (576, 64), (160, 32)])
@pytest.mark.parametrize("runs", [True, False])
def test_a_chunks_rows_do_not_depend_on_its_width_or_on_the_split_of_k(gen, monkeypatch, k, g, runs):
    """A 130-token chunk (three programs of 64 tokens), its first 9 rows alone (one program of 16 tokens, 7 rows
    masked) and 8 of its rows as a decode pass (the decode kernel): equal bit for bit, both views, offsets of a
    top-4-of-8 nest, where K is summed in the runs of a split (the interpreter's 8 SMs split these layers; at
    K = 160, G = 32, runs of 3 groups over 5: a short last run) and in one run (a plan of one split, as a wide
    layer's on Orin)."""
    from plugins.kernels import gemv
    if not runs:
        monkeypatch.setattr(gemv, "plan_split", lambda n, k, g, sms: (1, k // g))
    tiled = tile_planes(*to_dev(*nested_planes(gen, 64, k, g, "top4of8")))
    x = torch.randn(130, k, generator=gen).to(DEV)
    assert (gemv.plan_split(64, k, g, gemv._sm_count(x.device))[0] > 1) == runs
    for view in ("draft", "target"):
        whole = dual_plane_linear_tiled(x, tiled, view)
        assert torch.equal(dual_plane_linear_tiled(x[:9], tiled, view), whole[:9]), view
        assert torch.equal(dual_plane_linear_tiled(x[121:], tiled, view), whole[121:]), view
        assert torch.equal(dual_plane_linear_tiled(x[64:72], tiled, view), whole[64:72]), view   # the decode kernel


def _loads_outside_operands(monkeypatch, run) -> list:
    """The loads `run()`'s gemm_kernel launches issue (their unmasked lanes' addresses, recorded in the
    interpreter) that fall outside every tensor the launch was given."""
    import numpy as np
    import triton.runtime.interpreter as interp
    from plugins.kernels import gemm
    spans, outside, inside = [], [], []
    original = interp.InterpreterBuilder.create_masked_load

    def record(self, ptrs, mask, other, *args):
        addr = np.asarray(ptrs.data, dtype=np.uint64)
        live = addr if mask is None else addr[np.asarray(mask.data, dtype=bool)]
        if inside and live.size:
            outside.extend(int(a) for a in live if not any(lo <= int(a) < hi for lo, hi in spans))
        return original(self, ptrs, mask, other, *args)

    class Launch:                  # gemm_kernel[grid](...) with its tensor arguments' storage recorded
        def __getitem__(self, grid):
            def launch(*args, **kw):
                spans[:] = [(t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() +
                             t.untyped_storage().nbytes()) for t in args if isinstance(t, torch.Tensor)]
                inside.append(True)
                try:
                    return kernel[grid](*args, **kw)
                finally:
                    inside.pop()
            return launch
    kernel = gemm.gemm_kernel
    monkeypatch.setattr(interp.InterpreterBuilder, "create_masked_load", record)
    monkeypatch.setattr(gemm, "gemm_kernel", Launch())
    run()
    return outside


def test_the_gemm_loads_nothing_past_its_operands(gen, monkeypatch):
    """K = 160 at G = 32 is 5 groups in the interpreter's runs of 3 (a short last run): no load of the tiled planes,
    x, its group sums (offsets) or the float16 activations falls outside them, where the last run once read a
    group past K (past the last token's row and the planes' end: junk times a zero scale, NaN with float16)."""
    from plugins.kernels import dual_plane_linear, gemv
    assert gemv.plan_split(64, 160, 32, gemv._sm_count(torch.device(DEV))) == (2, 3)
    base, refine, scale, offset = nested_planes(gen, 64, 160, 32, "top4of8")
    tiled = tile_planes(base, refine, scale, offset)
    x = torch.randn(12, 160, generator=gen)
    if DEV != "cpu":
        pytest.skip("the interpreter records the loads")
    out = _loads_outside_operands(monkeypatch, lambda: [
        dual_plane_linear_tiled(x, tiled, "target"), dual_plane_linear(x, base, refine, scale, "target", offset,
                                                                        act="float16")])
    assert not out, [hex(a) for a in out[:4]]
