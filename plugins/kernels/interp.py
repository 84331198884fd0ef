"""The Triton interpreter made cheaper (TRITON_INTERPRET=1 only): its calls of `@triton.jit` helpers inside a
kernel, and the integer overflow checks it computes and discards.

Triton's interpreter (3.6, 3.8 and 3.9 read alike: `InterpretedFunction.__call__`) patches `triton.language` for
the interpreter at every call of a jit helper from inside a kernel (ours, and Triton's own such as `tl.zeros`):
`_patch_lang` walks the `triton.language` modules the helper's module holds with `inspect.getmembers`, ~0.1 ms, once
per helper call per program of the grid, and keeps no record to undo (its patches stay). Within one launch a second
call of helpers from the same module patches nothing new: the same modules get the same interpreter wrappers.
`fast_helper_calls` lets the first helper call from each module in a launch patch as Triton does and sends the
others straight to the helper's rewritten function; calls outside a launch take Triton's own path. The kernels'
tests against the reference run through it, so a helper whose result changed would fail them.
`skip_discarded_overflow_checks` stops the interpreter computing overflow checks that it discards. Outside the
interpreter nothing here is imported.
"""

import dataclasses
import threading

_INSIDE = threading.local()     # .patched: per launch in progress on this thread, the helper modules' globals' ids


def _interpreter():
    """Triton's interpreter module, or None where this Triton has none."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return None
    return interpreter


def fast_helper_calls() -> bool:
    """Route a jit helper called inside an interpreted launch straight to its rewritten function; True when applied
    (once), False when this Triton's interpreter does not have the shape read above (left as it is)."""
    ti = _interpreter()
    try:
        grid_call, helper_call = ti.GridExecutor.__call__, ti.InterpretedFunction.__call__
        rewrite, error = ti.InterpretedFunction.rewrite, ti.InterpreterError
    except AttributeError:                      # no interpreter (None has none of these), or another shape
        return False
    if getattr(helper_call, "bitnest_fast", False):
        return True

    def launch(self, *args, **kwargs):
        stack = _INSIDE.__dict__.setdefault("patched", [])
        stack.append(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            stack.pop()

    def helper(self, *args, **kwargs):
        stack, module = getattr(_INSIDE, "patched", None), id(self.fn.__globals__)
        if not stack or module not in stack[-1]:    # outside a launch, or this module's first call in it
            if stack:
                stack[-1].add(module)
            return helper_call(self, *args, **kwargs)
        fn = rewrite(self)
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    helper.bitnest_fast = True
    ti.GridExecutor.__call__, ti.InterpretedFunction.__call__ = launch, helper
    return True


def skip_discarded_overflow_checks() -> bool:
    """Stop the interpreter computing integer overflow checks it then throws away; True when it did.

    With `sanitize_overflow` (its default) Triton's semantic layer follows every int32 add, sub and mul with a check
    in int64 (two casts, the operation again, two compares, an and), ~40% of an interpreted pass's time, and hands the
    result to `device_assert`, which returns at once unless the builder's `debug` option is on; the interpreter's
    options never turn it on (3.6, 3.8 and 3.9 read alike). So the checks assert nothing and are dropped while
    `debug` is off; where it is on they stay."""
    try:
        builder = _interpreter().interpreter_builder
    except AttributeError:                      # no interpreter (None has no builder), or another shape
        return False
    if builder.options.debug or not getattr(builder.options, "sanitize_overflow", False):
        return False
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    return True
