"""The interpreter's helper calls (plugins/kernels/interp.py): inside a launch, `triton.language` is patched once per
helper module, not at every helper call of every program; results and the language outside a launch are Triton's."""

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton interpreter's path")


@triton.jit
def _twice(v):
    return v + v


@triton.jit
def _helpers_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)
    acc = tl.zeros([BLOCK], tl.float32)          # a helper of Triton's own (triton.language.standard)
    for _ in range(3):
        acc += _twice(v)                          # ours, three calls a program
    tl.store(out_ptr + offs, acc + tl.max(v, axis=0))


def test_helpers_inside_a_launch_patch_the_language_once_per_module(monkeypatch):
    import plugins.kernels.common  # noqa: F401  (applies the shortcut under the interpreter)
    from triton.runtime import interpreter as ti
    assert getattr(ti.InterpretedFunction.__call__, "bitnest_fast", False)
    calls = []
    patch = ti._patch_lang
    monkeypatch.setattr(ti, "_patch_lang", lambda fn: calls.append(fn.__name__) or patch(fn))
    programs, block = 8, 16
    x = torch.randn(programs * block)
    out = torch.full_like(x, float("nan"))
    _helpers_kernel[(programs,)](x, out, BLOCK=block)
    want = torch.stack([3 * (2 * r) + r.max() for r in x.view(programs, block)]).flatten()
    assert torch.equal(out, want)
    # the launch's own patch, then the first call of a helper from each module (this one's, Triton's standard
    # library's): 1 + 2, where Triton alone patches at each of the 8 x 5 helper calls
    assert len(calls) <= 3, calls
    assert tl.core.is_builtin(tl.arange)          # the launch's patches are undone when it ends
    with pytest.raises(ValueError, match="triton.jit"):
        tl.arange(0, 4)                           # outside a launch the language is Triton's own again


@triton.jit
def _square_kernel(x_ptr, out_ptr):
    v = tl.load(x_ptr)
    tl.store(out_ptr, v * v)


def test_the_overflow_checks_dropped_are_ones_that_assert_nothing(monkeypatch):
    """With the interpreter's own options (debug off) an int32 multiply that overflows wraps as on the GPU whether
    Triton computes its overflow check or not: dropping the check loses no assert. With debug on the check asserts,
    and then it is kept."""
    import dataclasses

    from triton.runtime import interpreter as ti

    from plugins.kernels.interp import skip_discarded_overflow_checks
    builder = ti.interpreter_builder
    assert not builder.options.debug and not builder.options.sanitize_overflow      # dropped at import
    x = torch.tensor([65536], dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    _square_kernel[(1,)](x, out)
    assert out.item() == 0                                                          # 2**32 wrapped to int32
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=True))
    out.fill_(7)
    _square_kernel[(1,)](x, out)                                                    # computed, then discarded
    assert out.item() == 0
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    assert not skip_discarded_overflow_checks() and builder.options.sanitize_overflow   # kept under debug
    with pytest.raises(Exception, match="overflow detected"):
        _square_kernel[(1,)](x, out)
